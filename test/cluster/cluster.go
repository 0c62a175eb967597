// Package cluster starts a private one-node Kubernetes cluster for tests and
// the demo: etcd, kube-apiserver (its own CA, authorization Node,RBAC, the
// admission plugins a real cluster runs), kube-controller-manager,
// kube-scheduler and a kubelet whose container runtime is test/node's
// private containerd with Bulkhead's shims registered, and test/node's node
// agent, which emits its Events through the admin's kubeconfig.
//
// Invariant: everything a cluster creates lives under its directory or is
// named after it (the kubelet's cgroup root, the webhook's link, the
// fence's pin directory), listens on loopback or on that link only, and
// Stop removes all of it: processes, mounts under the kubelet's root,
// cgroups, pins, links, the kubelet's log symlinks.
//
// The components are the release `make tools` builds (test/cluster/tools);
// etcd is Debian's etcd-server (test/scripts/deps.sh).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// NodeName is the kubelet's node name (--hostname-override). The API server
// reaches the kubelet by it (--kubelet-preferred-address-types=Hostname), so
// exec and logs stay on loopback: the kubelet refuses a loopback --node-ip.
const NodeName = "localhost"

// Components are the Kubernetes binaries a cluster runs, all from one
// release (`make tools`).
var Components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"}

// ServiceCIDR is the cluster's Service range. Nothing routes it (there is
// no kube-proxy): the API server reaches webhooks through their endpoints
// (--enable-aggregator-routing).
const ServiceCIDR = "10.0.0.0/24"

// Options configures a cluster.
type Options struct {
	// Dir holds everything the cluster writes; it must be empty or absent.
	Dir string
	// Node configures the private containerd; Dir and the kubelet's root
	// are set by Start.
	Node node.Options
	// AdmissionKubeconfig, when set, is the kubeconfig the API server's
	// webhook admission plugins read (WebhookAdmissionConfiguration's
	// kubeConfigFile): the client certificates it presents to webhooks.
	AdmissionKubeconfig string
	// RemoveAfterStop lists paths outside Dir that Stop removes last, once
	// nothing can hold them (the fence's pin directory on bpffs).
	RemoveAfterStop []string
	// Log, when set, receives one line per step.
	Log func(format string, args ...any)
}

// Cluster is a running cluster.
type Cluster struct {
	opts Options
	dir  string
	// Node is the private containerd the kubelet drives.
	Node *node.Node
	// Kubeconfig is the cluster admin's (system:masters).
	Kubeconfig string
	// APIServer is the API server's URL.
	APIServer string
	// KubeletRoot is the kubelet's --root-dir.
	KubeletRoot string
	// CgroupRoot is the kubelet's cgroupRoot (below every v1 hierarchy).
	CgroupRoot string
	// CAFile signs the API server's certificate and every client's.
	CAFile string

	pki     *pki
	procs   []*process
	etcdURL string
	onStop  []func()
	// madeDirs: host directories the kubelet creates when they are absent
	// (kubeletHostDirs) that did not exist before it started.
	madeDirs []string
	bin      map[string]string
}

// process is one component, in its own process group.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

// Requirements reports what this machine lacks to run a cluster, or nil.
func Requirements() error {
	if err := node.Requirements(node.BinDirs()); err != nil {
		return err
	}
	for _, bin := range append([]string{"etcd"}, Components...) {
		if _, err := node.LookPath(bin); err != nil {
			if bin == "etcd" {
				return errors.New("needs etcd (Debian etcd-server: make deps)")
			}
			return fmt.Errorf("needs %s (make tools)", bin)
		}
	}
	return nil
}

// Start brings the cluster up: etcd, API server, controller manager,
// scheduler, node (containerd and the node agent), kubelet; it returns once
// the node is Ready and the default ServiceAccount exists. On error
// everything started is stopped. The node starts after the API server so
// that the agent's kubeconfig exists when it starts.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if opts.Dir == "" {
		return nil, errors.New("cluster: Options.Dir is required")
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, err
	}
	c := &Cluster{
		opts:        opts,
		dir:         opts.Dir,
		KubeletRoot: filepath.Join(opts.Dir, "kubelet"),
		CgroupRoot:  "/" + "bulkhead-cluster-" + filepath.Base(opts.Dir),
		bin:         map[string]string{},
	}
	defer func() {
		if retErr != nil {
			c.Stop(context.Background())
		}
	}()
	for _, b := range append([]string{"etcd"}, Components...) {
		p, err := node.LookPath(b)
		if err != nil {
			return nil, fmt.Errorf("cluster: needs %s: %w", b, err)
		}
		c.bin[b] = p
	}

	var err error
	if c.pki, err = newPKI(filepath.Join(opts.Dir, "pki")); err != nil {
		return nil, err
	}
	c.CAFile = c.pki.caFile()
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	if err := c.startControllers(ctx); err != nil {
		return nil, err
	}

	nodeOpts := opts.Node
	nodeOpts.Dir = filepath.Join(opts.Dir, "node")
	nodeOpts.KubeletRoot = c.KubeletRoot
	// The agent emits a pod's Events on the kubelet's node.
	nodeOpts.AgentKubeconfig = c.Kubeconfig
	nodeOpts.AgentNodeName = NodeName
	opts.Log("cluster: starting containerd and the node agent (test/node) in %s", nodeOpts.Dir)
	n, err := node.Start(ctx, nodeOpts)
	if err != nil {
		return nil, fmt.Errorf("cluster: node: %w", err)
	}
	c.Node = n
	if pid := n.AgentPID(); pid != 0 {
		opts.Log("cluster: node agent pid %d on %s (log %s)", pid, n.AgentSocket(), n.AgentLogPath())
	}

	if err := c.startKubelet(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Dir returns the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run starts a component with its output in <dir>/logs/<name>.log.
func (c *Cluster) run(name string, args ...string) (*process, error) {
	logDir := filepath.Join(c.dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	p := &process{name: name, log: filepath.Join(logDir, name+".log"), exited: make(chan struct{})}
	f, err := os.Create(p.log)
	if err != nil {
		return nil, err
	}
	bin := c.bin[name]
	if bin == "" {
		bin = name
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	// Its own process group: a Ctrl-C of the test reaches the components
	// only through Stop, in order.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { p.err = p.cmd.Wait(); f.Close(); close(p.exited) }()
	c.procs = append(c.procs, p)
	c.opts.Log("cluster: started %s (pid %d, log %s)", name, p.cmd.Process.Pid, p.log)
	return p, nil
}

// waitFor polls ready until it returns nil, p exits, or timeout passes.
func waitFor(ctx context.Context, p *process, what string, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if p != nil {
			select {
			case <-p.exited:
				return fmt.Errorf("%s exited: %v (log %s):\n%s", p.name, p.err, p.log, logTail(p.log, 30))
			default:
			}
		}
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("%s not ready after %s: %v", what, timeout, err)
			if p != nil {
				msg += fmt.Sprintf(" (log %s):\n%s", p.log, logTail(p.log, 30))
			}
			return errors.New(msg)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func logTail(path string, lines int) string {
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// Logs returns the tail of every component's log (for test failures).
func (c *Cluster) Logs(lines int) string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s (%s)\n%s\n", p.name, p.log, logTail(p.log, lines))
	}
	if c.Node != nil {
		fmt.Fprintf(&b, "--- containerd\n%s\n", logTail(filepath.Join(c.Node.Dir(), "containerd.log"), lines))
		if agentLog := c.Node.AgentLogPath(); fileExists(agentLog) {
			fmt.Fprintf(&b, "--- bulkhead-agent (%s)\n%s\n", agentLog, logTail(agentLog, lines))
		}
	}
	return b.String()
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	client, err := freePort()
	if err != nil {
		return err
	}
	peer, err := freePort()
	if err != nil {
		return err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	p, err := c.run("etcd",
		"--name=default", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		// A test's store: losing it on a power cut loses nothing.
		"--unsafe-no-fsync")
	if err != nil {
		return err
	}
	c.etcdURL = clientURL
	return waitFor(ctx, p, "etcd", time.Minute, func(ctx context.Context) error {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(clientURL, "http://"))
		if err == nil {
			conn.Close()
		}
		return err
	})
}

var kubeconfigTmpl = template.Must(template.New("kubeconfig").Parse(`apiVersion: v1
kind: Config
clusters:
  - name: bulkhead-test
    cluster:
      server: {{.Server}}
      certificate-authority: {{.CA}}
users:
  - name: {{.User}}
    user:
{{- if .Token}}
      token: {{.Token}}
{{- else}}
      client-certificate: {{.Cert}}
      client-key: {{.Key}}
{{- end}}
contexts:
  - name: bulkhead-test
    context:
      cluster: bulkhead-test
      user: {{.User}}
current-context: bulkhead-test
`))

// kubeconfig writes a kubeconfig for a client certificate of the cluster's
// CA (cn, orgs) and returns its path.
func (c *Cluster) kubeconfig(name, cn string, orgs ...string) (string, error) {
	cert, key, err := c.pki.issue(name, cn, orgs)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.dir, name+".kubeconfig")
	return path, writeTemplate(path, kubeconfigTmpl, map[string]string{
		"Server": c.APIServer, "CA": c.CAFile, "User": cn, "Cert": cert, "Key": key,
	})
}

// TokenKubeconfig writes a kubeconfig that authenticates with a bearer
// token (a ServiceAccount's) and returns its path.
func (c *Cluster) TokenKubeconfig(name, user, token string) (string, error) {
	path := filepath.Join(c.dir, name+".kubeconfig")
	return path, writeTemplate(path, kubeconfigTmpl, map[string]string{
		"Server": c.APIServer, "CA": c.CAFile, "User": user, "Token": token,
	})
}

func writeTemplate(path string, t *template.Template, data any) error {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// Kubectl runs the cluster's kubectl as the admin and returns its combined
// output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	return c.KubectlStdin(ctx, "", args...)
}

// KubectlStdin runs kubectl with stdin (for `apply -f -`).
func (c *Cluster) KubectlStdin(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bin["kubectl"], args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Dir = c.dir
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// OnStop registers f to run first when the cluster stops (in reverse
// order of registration), while the API server still answers.
func (c *Cluster) OnStop(f func()) { c.onStop = append(c.onStop, f) }

// stop ends a process: SIGTERM to its group, SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// Stop tears everything down: the OnStop hooks, the kubelet, the control
// plane, etcd, containerd and its pods, then the node agent (test/node's
// Stop: the agent outlives the pods' release), then whatever is left
// of them: processes and mounts under the directory, the kubelet's cgroup
// root, its log symlinks, the directory. It returns what it could not
// remove, or nil.
func (c *Cluster) Stop(ctx context.Context) error {
	for i := len(c.onStop) - 1; i >= 0; i-- {
		c.onStop[i]()
	}
	c.onStop = nil
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(15 * time.Second)
	}
	if c.Node != nil {
		c.Node.Stop(ctx)
	}
	node.KillUnder(c.dir)
	node.UnmountUnder(c.dir)
	var left []string
	for _, cg := range c.removeCgroupRoot() {
		left = append(left, "cgroup "+cg)
	}
	// The kubelet links each container's log into /var/log/containers.
	if entries, err := os.ReadDir("/var/log/containers"); err == nil {
		for _, e := range entries {
			p := filepath.Join("/var/log/containers", e.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, c.dir+"/") {
				_ = os.Remove(p)
			}
		}
	}
	for _, d := range c.madeDirs {
		_ = os.Remove(d) // only if empty: another kubelet may use it
	}
	if m := node.MountsUnder(c.dir); len(m) > 0 {
		left = append(left, "mounts "+strings.Join(m, " "))
	}
	for _, p := range append([]string{c.dir}, c.opts.RemoveAfterStop...) {
		if err := os.RemoveAll(p); err != nil {
			left = append(left, err.Error())
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("cluster %s: left behind: %s", c.dir, strings.Join(left, "; "))
	}
	return nil
}
