package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// AdmissionPlugins are enabled on the API server on top of the release's
// defaults (which stay on): NodeRestriction, off by default and on in every
// production control plane (kubeadm's), limits the kubelet to its own node;
// the others are named because these tests rely on them, so that a release
// that changed its defaults fails here rather than passing untested.
// NamespaceLifecycle refuses objects in a namespace being deleted
// (uninstall), ServiceAccount fills in the pod's token, RuntimeClass adds
// the RuntimeClass's overhead and node selector, PodSecurity enforces the
// bulkhead-system namespace's label, ValidatingAdmissionWebhook calls
// Bulkhead's webhook.
var AdmissionPlugins = []string{
	"NamespaceLifecycle", "ServiceAccount", "NodeRestriction", "PodSecurity",
	"RuntimeClass", "Priority", "ValidatingAdmissionWebhook", "ResourceQuota",
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	addr := c.opts.APIServerAddress
	c.APIServer = fmt.Sprintf("https://%s", net.JoinHostPort(addr, strconv.Itoa(port)))
	serving, servingKey, err := c.pki.issue("apiserver", "kube-apiserver", nil,
		addr, "127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local")
	if err != nil {
		return err
	}
	// The API server's client certificate to kubelets (exec, logs).
	kubeletClient, kubeletClientKey, err := c.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return err
	}
	saKey, saPub, err := c.pki.serviceAccountKey()
	if err != nil {
		return err
	}
	args := []string{
		"--etcd-servers=" + c.etcdURL,
		// The Service kubernetes points at this address: pods reach it.
		"--bind-address=" + addr, "--advertise-address=" + addr, fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + serving, "--tls-private-key-file=" + servingKey,
		"--client-ca-file=" + c.CAFile,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=" + strings.Join(AdmissionPlugins, ","),
		"--service-cluster-ip-range=" + ServiceCIDR + "," + ServiceCIDR6,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--kubelet-client-certificate=" + kubeletClient, "--kubelet-client-key=" + kubeletClientKey,
		// Each kubelet listens on its node's address on the cluster's link.
		"--kubelet-preferred-address-types=InternalIP",
		// The API server calls a webhook Service at one of its endpoints,
		// as on a control plane where no kube-proxy runs.
		"--enable-aggregator-routing=true",
		// The Service kubernetes keeps its endpoint while the API server
		// is down, as a control plane behind a load balancer's address
		// does: kubernetesEndpoint writes it once. The default (lease)
		// reconciler withdraws it when the API server stops, and after
		// an outage (StopAPIServer) pods reach the API server again only
		// once kube-proxy has relisted: seen ~50 s after a 30 s outage
		// (its first watch refused by an RBAC authorizer still starting,
		// then its backoff), during which Bulkhead's webhook, blind to
		// its quota ledgers, refuses every pod (fail closed).
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
		"--profiling=false",
	}
	if c.opts.AdmissionKubeconfig != "" {
		admission := filepath.Join(c.dir, "admission.yaml")
		conf := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %s
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %s
`, c.opts.AdmissionKubeconfig, c.opts.AdmissionKubeconfig)
		if err := os.WriteFile(admission, []byte(conf), 0o644); err != nil {
			return err
		}
		args = append(args, "--admission-control-config-file="+admission)
	}
	c.apiArgs = args
	p, err := c.run("kube-apiserver", args...)
	if err != nil {
		return err
	}
	if c.Kubeconfig, err = c.kubeconfig("admin", "bulkhead-test-admin", "system:masters"); err != nil {
		return err
	}
	if err := c.waitAPIServer(ctx, p); err != nil {
		return err
	}
	return c.kubernetesEndpoint(ctx, addr, port)
}

// kubernetesEndpoint writes the endpoint of the Service kubernetes (the
// API server's --endpoint-reconciler-type=none says why), labelled as this
// cluster's own so that no controller of Kubernetes manages it.
func (c *Cluster) kubernetesEndpoint(ctx context.Context, addr string, port int) error {
	slice := fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: bulkhead-test-cluster
addressType: IPv4
ports:
  - name: https
    port: %d
    protocol: TCP
endpoints:
  - addresses: [%q]
    conditions:
      ready: true
`, port, addr)
	if out, err := c.KubectlStdin(ctx, slice, "apply", "-f", "-"); err != nil {
		return fmt.Errorf("cluster: the Service kubernetes's endpoint: %v: %s", err, out)
	}
	return nil
}

// StopAPIServer stops the API server, as an outage of the control plane
// would: every client (kubelets, agents, kubectl) sees its connections
// refused until StartAPIServer.
func (c *Cluster) StopAPIServer() {
	for _, p := range c.procs {
		if p.name == "kube-apiserver" {
			p.stop(15 * time.Second)
		}
	}
}

// StartAPIServer starts the API server again with its flags and waits
// until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	i := slices.IndexFunc(c.procs, func(p *process) bool { return p.name == "kube-apiserver" })
	if i < 0 {
		return errors.New("cluster: no API server was started")
	}
	select {
	case <-c.procs[i].exited:
	default:
		return errors.New("cluster: the API server is running")
	}
	p, err := c.run("kube-apiserver", c.apiArgs...)
	if err != nil {
		return err
	}
	// Where the old one was: Stop ends the components in order.
	c.procs = append(c.procs[:i], append([]*process{p}, c.procs[i+1:len(c.procs)-1]...)...)
	return c.waitAPIServer(ctx, p)
}

func (c *Cluster) waitAPIServer(ctx context.Context, p *process) error {
	return waitFor(ctx, p, "kube-apiserver", 3*time.Minute, func(ctx context.Context) error {
		out, err := c.Kubectl(ctx, "get", "--raw", "/readyz")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

func (c *Cluster) startControllers(ctx context.Context) error {
	cm, err := c.kubeconfig("controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	saKey := filepath.Join(c.pki.dir, "sa.key")
	if _, err := c.run("kube-controller-manager",
		"--kubeconfig="+cm, "--authentication-kubeconfig="+cm, "--authorization-kubeconfig="+cm,
		"--leader-elect=false", "--secure-port=0",
		// Each controller acts as its own ServiceAccount, as kubeadm runs it.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+saKey, "--root-ca-file="+c.CAFile,
		"--cluster-signing-cert-file="+c.CAFile, "--cluster-signing-key-file="+filepath.Join(c.pki.dir, "ca.key"),
		"--profiling=false"); err != nil {
		return err
	}
	sched, err := c.kubeconfig("scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	if _, err := c.run("kube-scheduler",
		"--kubeconfig="+sched, "--authentication-kubeconfig="+sched, "--authorization-kubeconfig="+sched,
		"--leader-elect=false", "--secure-port=0", "--profiling=false"); err != nil {
		return err
	}
	return nil
}

// kubeletConfig is the kubelet's configuration on this kernel: cgroups v1
// with v2 alongside need cgroupfs (no systemd manages them here) and
// failCgroupV1: false (recent releases refuse v1 otherwise). Ports, paths
// and the cgroup root are the cluster's own, so that two clusters on one
// machine never meet; eviction and image GC thresholds are off because the
// test images are imported, not pulled back after a GC. makeIPTablesUtilChains
// is off: those chains (KUBE-FIREWALL in INPUT and OUTPUT, canaries) are
// host-wide, serve only kube-proxy, which does not run here, and would
// outlive the cluster.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://%s
imageServiceEndpoint: unix://%s
podLogsDir: %s
staticPodPath: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
`

// kubeletHostDirs are host directories outside the cluster's own that appear
// while it runs, whatever the kubelet is told: the kubelet's links to
// container logs. (CDI's /var/run/cdi is each node's own: test/node's
// RootPaths.)
var kubeletHostDirs = []string{"/var/log/containers"}

// podLogs is the kubelet's podLogsDir of node w, on the host:
// <ns>_<pod>_<uid>/<container>/<n>.log.
func (c *Cluster) podLogs(w *Worker) string { return filepath.Join(c.dir, w.Name, "pod-logs") }

func (c *Cluster) startKubelet(ctx context.Context, w *Worker) error {
	if err := makeCgroupRoot(w.CgroupRoot); err != nil {
		return err
	}
	for _, d := range kubeletHostDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			c.madeDirs = append(c.madeDirs, d)
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	kc, err := c.kubeconfig("kubelet-"+w.Name, "system:node:"+w.Name, "system:nodes")
	if err != nil {
		return err
	}
	conf := filepath.Join(c.dir, w.Name, "kubelet.yaml")
	sock := w.Node.Socket
	w.StaticPods = filepath.Join(c.dir, w.Name, "manifests")
	if err := os.MkdirAll(w.StaticPods, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(kubeletConfig, w.Address, port, c.CAFile, w.CgroupRoot, sock, sock,
		c.podLogs(w), w.StaticPods)), 0o644); err != nil {
		return err
	}
	// In the node's namespace: its /var/lib/kubelet, and the hostPath
	// volumes of its pods (the DaemonSet's) are the node's paths.
	p, err := c.runNamed("kubelet-"+w.Name, "kubelet", w.Node.EnterArgs(), "--config="+conf, "--kubeconfig="+kc,
		"--root-dir="+w.KubeletRoot, "--hostname-override="+w.Name, "--node-ip="+w.Address)
	if err != nil {
		return err
	}
	w.kubelet = p
	return waitFor(ctx, p, "node "+w.Name+" Ready", 3*time.Minute, func(ctx context.Context) error {
		out, err := c.Kubectl(ctx, "get", "node", w.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.TrimSpace(out) != "True" {
			return fmt.Errorf("Ready=%q", out)
		}
		return nil
	})
}

// v1Hierarchies lists the mounted cgroup v1 hierarchies (/sys/fs/cgroup/X).
func v1Hierarchies() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out
}

// makeCgroupRoot creates a kubelet's cgroup root in every hierarchy: the
// kubelet requires it to exist, and a root of its own keeps its pods' and
// QoS cgroups apart from any other kubelet's and makes them removable.
func makeCgroupRoot(cgroupRoot string) error {
	hs := v1Hierarchies()
	if len(hs) == 0 {
		return errors.New("cluster: no cgroup v1 hierarchy mounted (the kubelet here is configured for v1)")
	}
	for _, h := range append(hs, "/sys/fs/cgroup/unified") {
		if _, err := os.Stat(h); err != nil {
			continue
		}
		if err := os.Mkdir(filepath.Join(h, cgroupRoot), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cluster: cgroup root %s: %w", filepath.Join(h, cgroupRoot), err)
		}
	}
	return nil
}

// killCgroupRoot kills every process in a cgroup root's cgroups, in every
// hierarchy: the pods' (runsc's sandboxes and gofers run in mount
// namespaces of their own, which the node's Stop does not see).
func killCgroupRoot(cgroupRoot string) {
	for _, h := range append(v1Hierarchies(), "/sys/fs/cgroup/unified") {
		_ = filepath.WalkDir(filepath.Join(h, cgroupRoot), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// removeCgroupRoot removes a cgroup root and everything below it,
// deepest first, in every hierarchy; it returns what it could not remove.
func removeCgroupRoot(cgroupRoot string) []string {
	var left []string
	for _, h := range append(v1Hierarchies(), "/sys/fs/cgroup/unified") {
		root := filepath.Join(h, cgroupRoot)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := os.Remove(dirs[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				left = append(left, dirs[i])
			}
		}
	}
	return left
}
