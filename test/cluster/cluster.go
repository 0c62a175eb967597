// Package cluster starts a private Kubernetes cluster of one or more nodes
// for tests and the demo: etcd, kube-apiserver (its own CA, authorization
// Node,RBAC, the admission plugins a real cluster runs),
// kube-controller-manager, kube-scheduler, one kube-proxy, and per node a
// kubelet whose container runtime is a test/node private containerd with
// its own CNI bridge and pod CIDRs (IPv4 and IPv6). Each node is a machine
// of its own to Bulkhead's install (test/node's PrivateRoot): its
// containerd and kubelet run in a mount namespace of the node's, in which
// a real node's paths (/etc/bulkhead, /etc/containerd, /usr/local/bin,
// /run/containerd, /var/lib/kubelet, /sys/fs/bpf, ...) are its own, so
// that deploy/'s DaemonSet installs Bulkhead on it as on any node: its
// installer registers the runtimes and restarts containerd, its agent
// serves the shims. The API server listens on the cluster's link, so that
// pods reach it through the Service kubernetes as on any cluster
// (Bulkhead's webhook runs as a Deployment).
//
// The nodes share the host's network namespace, as pods of two machines
// share a routed network: each node's bridge is a route of the host's, so
// a pod of one node reaches a pod of the other through the host's routing,
// and each node's agent fences only its own pods' veths, learning the other
// node's pods from the API server as it would across machines. For the same
// reason one kube-proxy serves both (its nftables tables are the host's).
//
// Invariant: everything a cluster creates lives under its directory or is
// named after it (the kubelets' cgroup roots, its links, kube-proxy's
// tables), listens on loopback or on its own link only, and Stop removes
// all of it: processes, the nodes' namespaces and bpffs, cgroups, links,
// tables, the kubelets' log symlinks, the host mount points test/node
// made.
//
// The components are the release `make tools` builds (test/cluster/tools);
// etcd is Debian's etcd-server (test/scripts/deps.sh).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// Components are the Kubernetes binaries a cluster runs, all from one
// release (`make tools`).
var Components = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"}

// ServiceCIDR and ServiceCIDR6 are the cluster's Service ranges (a
// dual-stack cluster). kube-proxy routes them for pods; the API server
// reaches webhooks through their endpoints (--enable-aggregator-routing),
// as it would where no proxy runs on the control plane.
const (
	ServiceCIDR  = "10.0.0.0/24"
	ServiceCIDR6 = "fd10:96::/112"
)

// Options configures a cluster.
type Options struct {
	// Dir holds everything the cluster writes; it must be empty or absent.
	Dir string
	// Nodes are the cluster's nodes, one or more, started in order.
	Nodes []NodeOptions
	// Link names the link that holds the nodes' addresses and the API
	// server's (at most 15 bytes; an empty bridge, since this kernel has no
	// dummy links): the kubelets listen there, and the API server reaches
	// them there (InternalIP), since the kubelet refuses a loopback
	// --node-ip.
	Link string
	// APIServerAddress is the IPv4 address on Link the API server listens
	// on and advertises: the endpoint of the Service kubernetes, which pods
	// (Bulkhead's webhook) reach through kube-proxy, as on any cluster. A
	// loopback address would serve the host alone.
	APIServerAddress string
	// ClusterCIDRs are the pod ranges every node's Subnet and Subnet6 lie
	// in (kube-proxy's clusterCIDR: pods' traffic to a Service keeps its
	// source address).
	ClusterCIDRs []string
	// AdmissionKubeconfig, when set, is the kubeconfig the API server's
	// webhook admission plugins read (WebhookAdmissionConfiguration's
	// kubeConfigFile): the client certificates it presents to webhooks.
	AdmissionKubeconfig string
	// Log, when set, receives one line per step.
	Log func(format string, args ...any)
}

// NodeOptions configures one node of a cluster.
type NodeOptions struct {
	// Name is the node's name (the kubelet's --hostname-override).
	Name string
	// Address is the node's IPv4 address (InternalIP), put on the
	// cluster's Link.
	Address string
	// Node configures the node's private containerd: its Bridge, Subnet
	// and Subnet6 are the node's CNI bridge and pod CIDRs, BinDir where
	// containerd and runc are found. Dir, PrivateRoot and DefaultRuntime
	// are set by Start; the rest must be unset (the DaemonSet installs
	// Bulkhead).
	Node node.Options
}

// Worker is a running node of the cluster: its kubelet and the private
// containerd the kubelet drives, in the node's mount namespace.
type Worker struct {
	// Name is the node's name in the API server.
	Name string
	// Address is the node's InternalIP.
	Address string
	// Node is the node's containerd, CNI bridge and mount namespace
	// (Node.HostPath maps the node's paths to the host's).
	Node *node.Node
	// PinDir is the host's view of the node's fence pin directory,
	// deploy/node/config.toml's /sys/fs/bpf/bulkhead.
	PinDir string
	// KubeletRoot is the kubelet's --root-dir, in the node's namespace.
	KubeletRoot string
	// CgroupRoot is the kubelet's cgroupRoot (below every v1 hierarchy).
	CgroupRoot string
	// StaticPods is the kubelet's staticPodPath: a manifest written there
	// runs on this node whether or not the API server answers.
	StaticPods string

	opts    NodeOptions
	kubelet *process
}

// Cluster is a running cluster.
type Cluster struct {
	opts Options
	dir  string
	// Nodes are the cluster's nodes, in the order of Options.Nodes.
	Nodes []*Worker
	// Kubeconfig is the cluster admin's (system:masters).
	Kubeconfig string
	// APIServer is the API server's URL.
	APIServer string
	// CAFile signs the API server's certificate and every client's.
	CAFile string

	pki     *pki
	procs   []*process
	etcdURL string
	apiArgs []string
	// proxy: kube-proxy was started, so its tables are this cluster's.
	proxy  bool
	onStop []func()
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
	// A pod without a RuntimeClass (Bulkhead's webhook) runs on containerd's
	// own runc, a real node's default (StartStory's nodes).
	for _, bin := range []string{"containerd-shim-runc-v2", "runc"} {
		if _, err := node.LookPath(bin); err != nil {
			return fmt.Errorf("needs %s, the nodes' default runtime (make tools)", bin)
		}
	}
	return nil
}

// Start brings the cluster up: etcd, API server, controller manager,
// scheduler, then each node (its namespace and containerd, the kubelet),
// then kube-proxy; it returns once every node is Ready and the default
// ServiceAccount exists. On error everything started is stopped. Bulkhead
// is not on the nodes yet: Install.Apply puts it there.
func Start(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, dir: opts.Dir, bin: map[string]string{}}
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
	if err := c.addLink(ctx); err != nil {
		return nil, err
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
	for _, no := range opts.Nodes {
		if err := c.startNode(ctx, no); err != nil {
			return nil, err
		}
	}
	if err := c.startProxy(ctx); err != nil {
		return nil, err
	}
	// The controller manager's serviceaccount controller creates it; pods
	// are refused by the ServiceAccount admission plugin until it does.
	if err := waitFor(ctx, nil, "ServiceAccount default/default", 2*time.Minute, func(ctx context.Context) error {
		out, err := c.Kubectl(ctx, "-n", "default", "get", "serviceaccount", "default")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (o Options) validate() error {
	if o.Dir == "" {
		return errors.New("cluster: Options.Dir is required")
	}
	if o.Link == "" || len(o.Link) > 15 {
		return fmt.Errorf("cluster: Options.Link %q: must be 1 to 15 bytes", o.Link)
	}
	if len(o.Nodes) == 0 {
		return errors.New("cluster: Options.Nodes: at least one node")
	}
	if len(o.ClusterCIDRs) == 0 {
		return errors.New("cluster: Options.ClusterCIDRs: the pod ranges are required")
	}
	if parseAddr4(o.APIServerAddress) == "" {
		return fmt.Errorf("cluster: Options.APIServerAddress %q: must be an IPv4 address", o.APIServerAddress)
	}
	var cidrs []netip.Prefix
	for _, s := range o.ClusterCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("cluster: Options.ClusterCIDRs %q: %w", s, err)
		}
		cidrs = append(cidrs, p)
	}
	within := func(s string) bool {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return false
		}
		for _, c := range cidrs {
			if c.Contains(p.Addr()) && c.Bits() <= p.Bits() {
				return true
			}
		}
		return false
	}
	names := map[string]bool{}
	addrs := map[string]bool{parseAddr4(o.APIServerAddress): true}
	for i, n := range o.Nodes {
		switch {
		case n.Name == "" || names[n.Name]:
			return fmt.Errorf("cluster: Options.Nodes[%d].Name %q: must be set and unique", i, n.Name)
		case parseAddr4(n.Address) == "" || addrs[parseAddr4(n.Address)]:
			return fmt.Errorf("cluster: Options.Nodes[%d].Address %q: must be an IPv4 address, unique and not the API server's", i, n.Address)
		case !within(n.Node.Subnet):
			return fmt.Errorf("cluster: Options.Nodes[%d].Node.Subnet %q: must lie in the ClusterCIDRs %v", i, n.Node.Subnet, o.ClusterCIDRs)
		case n.Node.Subnet6 != "" && !within(n.Node.Subnet6):
			return fmt.Errorf("cluster: Options.Nodes[%d].Node.Subnet6 %q: must lie in the ClusterCIDRs %v", i, n.Node.Subnet6, o.ClusterCIDRs)
		}
		names[n.Name] = true
		addrs[parseAddr4(n.Address)] = true
	}
	return nil
}

func parseAddr4(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return ""
	}
	return a.String()
}

// addLink brings up the link that holds the nodes' and the API server's
// addresses.
func (c *Cluster) addLink(ctx context.Context) error {
	args := [][]string{
		{"link", "add", c.opts.Link, "type", "bridge"},
		{"addr", "add", c.opts.APIServerAddress + "/32", "dev", c.opts.Link},
	}
	for _, n := range c.opts.Nodes {
		args = append(args, []string{"addr", "add", n.Address + "/32", "dev", c.opts.Link})
	}
	args = append(args, []string{"link", "set", c.opts.Link, "up"})
	for _, a := range args {
		if out, err := exec.CommandContext(ctx, "ip", a...).CombinedOutput(); err != nil {
			return fmt.Errorf("cluster: ip %s: %v: %s", strings.Join(a, " "), err, out)
		}
	}
	return nil
}

// startNode starts one node: its namespace and containerd (test/node,
// PrivateRoot), then its kubelet, and waits for it to be Ready.
func (c *Cluster) startNode(ctx context.Context, no NodeOptions) error {
	w := &Worker{
		Name: no.Name, Address: no.Address, opts: no,
		KubeletRoot: "/var/lib/kubelet",
		CgroupRoot:  "/" + "bulkhead-cluster-" + filepath.Base(c.dir) + "-" + no.Name,
	}
	c.Nodes = append(c.Nodes, w)
	nodeOpts := no.Node
	nodeOpts.Dir = filepath.Join(c.dir, no.Name, "node")
	nodeOpts.PrivateRoot = true
	// A pod without a RuntimeClass runs on runc, as a real node's
	// containerd defaults to: the webhook's and the DaemonSet's pods.
	nodeOpts.DefaultRuntime = node.UpstreamRuncHandler
	c.opts.Log("cluster: node %s: starting its namespace and containerd (test/node) in %s", no.Name, nodeOpts.Dir)
	n, err := node.Start(ctx, nodeOpts)
	if err != nil {
		return fmt.Errorf("cluster: node %s: %w", no.Name, err)
	}
	w.Node = n
	w.PinDir = n.HostPath("/sys/fs/bpf/bulkhead")
	return c.startKubelet(ctx, w)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Worker {
	for _, w := range c.Nodes {
		if w.Name == name {
			return w
		}
	}
	return nil
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
	return c.runNamed(name, name, nil, args...)
}

// runNamed starts binary bin (a Components name) as the process name
// (its log is <dir>/logs/<name>.log), through the command line enter when
// set (a node's nsenter): a kubelet per node.
func (c *Cluster) runNamed(name, bin string, enter []string, args ...string) (*process, error) {
	logDir := filepath.Join(c.dir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	p := &process{name: name, log: filepath.Join(logDir, name+".log"), exited: make(chan struct{})}
	// Appended to: a component started again (StartAPIServer) keeps the
	// earlier run's log.
	f, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	if path := c.bin[bin]; path != "" {
		bin = path
	}
	if len(enter) > 0 {
		args = append(append(append([]string{}, enter[1:]...), bin), args...)
		bin = enter[0]
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
	for _, w := range c.Nodes {
		if w.Node == nil {
			continue
		}
		fmt.Fprintf(&b, "--- %s: containerd\n%s\n", w.Name, logTail(filepath.Join(w.Node.Dir(), "containerd.log"), lines))
		// The DaemonSet's containers, from the kubelet's log files: they
		// are read while the API server is down too.
		logs, _ := filepath.Glob(filepath.Join(c.podLogs(w), "bulkhead-system_bulkhead-node-*", "*", "*.log"))
		for _, l := range logs {
			fmt.Fprintf(&b, "--- %s: %s\n%s\n", w.Name, l, logTail(l, lines))
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
	return path, c.writeTokenKubeconfig(path, user, token)
}

func (c *Cluster) writeTokenKubeconfig(path, user, token string) error {
	return writeTemplate(path, kubeconfigTmpl, map[string]string{
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

// Stop tears everything down: the OnStop hooks, the kubelets, kube-proxy,
// the control plane, etcd, each node's pods (the DaemonSet's last: its
// agent outlives the others' release), containerd and namespace
// (test/node's Stop), then whatever is left of them: processes in the
// kubelets' cgroup roots and under the directory, mounts under it, the
// cgroup roots, their log symlinks, kube-proxy's tables, the nodes' link,
// the directory. It returns what it could not remove, or nil.
func (c *Cluster) Stop(ctx context.Context) error {
	for i := len(c.onStop) - 1; i >= 0; i-- {
		c.onStop[i]()
	}
	c.onStop = nil
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(15 * time.Second)
	}
	for _, w := range c.Nodes {
		if w.Node != nil {
			w.Node.Stop(ctx)
		}
	}
	for _, w := range c.Nodes {
		killCgroupRoot(w.CgroupRoot)
	}
	node.KillUnder(c.dir)
	node.UnmountUnder(c.dir)
	var left []string
	for _, w := range c.Nodes {
		for _, cg := range removeCgroupRoot(w.CgroupRoot) {
			left = append(left, "cgroup "+cg)
		}
	}
	if t := c.removeProxyTables(); t != "" {
		left = append(left, t)
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
	if c.opts.Link != "" {
		_ = exec.Command("ip", "link", "del", c.opts.Link).Run()
	}
	if m := node.MountsUnder(c.dir); len(m) > 0 {
		left = append(left, "mounts "+strings.Join(m, " "))
	}
	if err := os.RemoveAll(c.dir); err != nil {
		left = append(left, err.Error())
	}
	if len(left) > 0 {
		return fmt.Errorf("cluster %s: left behind: %s", c.dir, strings.Join(left, "; "))
	}
	return nil
}

// NodeStatus is `bulkhead node status` of node w as an operator runs it on
// the node: the CLI of the build under test (its mock-GPU build, as the
// nodes' agents are), in the node's mount namespace, on config, a node
// file there ("" is the installer's /etc/bulkhead/config.toml). It needs
// neither the API server nor the agent's pod.
func (w *Worker) NodeStatus(ctx context.Context, config string) (string, error) {
	cli, err := node.LookMockPath("bulkhead")
	if err != nil {
		return "", errors.New("needs bulkhead (make build)")
	}
	if config == "" {
		config = "/etc/bulkhead/config.toml"
	}
	out, err := w.Node.Command(ctx, cli, "node", "status", "--config", config).CombinedOutput()
	return string(out), err
}
