// Package node starts a private local node for tests, benchmarks and the
// demo: a containerd with its own root, state, socket and CNI bridge, the
// Bulkhead shim registered as runtime handler "bulkhead", the node agent
// (bulkhead-agent) that the shims call for every pod when the pipeline is
// on, and the local busybox images imported. Nothing it creates lives
// outside its directory except the bridge interface and the veths CNI
// makes, which Stop removes.
//
// A PrivateRoot node is instead a machine of its own for deploy/'s node
// DaemonSet to install Bulkhead on (test/cluster): a real node's paths
// in a mount namespace of its own, containerd with no Bulkhead runtime,
// no agent of the package's. It also creates the mount points of
// RootPaths the host lacks, which the last node on the host removes.
package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/test/images"
)

// Handler is the CRI runtime handler that selects Bulkhead.
const Handler = "bulkhead"

// RuncHandler is the runc tier's CRI runtime handler, registered when its
// shim and runc are built.
const RuncHandler = "bulkhead-runc"

// UpstreamRuncHandler is containerd's own runc shim without Bulkhead,
// registered where containerd-shim-runc-v2 is built (the bench baseline).
const UpstreamRuncHandler = "upstream-runc"

// UpstreamRunscHandler is gVisor's own shim (containerd-shim-runsc-v1)
// without Bulkhead, registered where it is built (the bench's gVisor
// baseline). It runs the same runsc with the same flags as Bulkhead's
// gVisor pods. Its manager sets its own oom_score_adj to -999 and fails
// without CAP_SYS_RESOURCE (UpstreamRunscMissing).
const UpstreamRunscHandler = "upstream-runsc"

// The runsc flags every gVisor pod of a node gets, through Bulkhead's shim
// or gVisor's own: one home, so the two are compared on the same sandbox.
const (
	runscPlatform = "systrap"
	runscNetwork  = "sandbox"
)

// Options configures a node.
type Options struct {
	// Dir holds everything the node writes; it must be empty or absent.
	Dir string
	// BinDir holds containerd, ctr, runsc and the Bulkhead shim.
	BinDir []string
	// Bridge is the CNI bridge's name (at most 15 bytes).
	Bridge string
	// Subnet is the pod CIDR of the bridge, e.g. "10.88.7.0/24".
	Subnet string
	// Subnet6, when set, is the bridge's IPv6 pod CIDR too (a ULA prefix,
	// e.g. "fd88:7::/64"): pods get an address of each family.
	Subnet6 string
	// Routed gives pods a default route through the bridge (IPv4, and
	// IPv6 with Subnet6), as a cluster's pods have: a pod reaches other
	// nodes' pods and Services through the host. Without it a pod reaches
	// only its own bridge's subnet.
	Routed bool
	// Shim is the shim binary to register; empty looks up
	// containerd-shim-bulkhead-v1 in BinDir.
	Shim string
	// Agent is the node agent binary, started when PipelineEnabled; empty
	// is AgentPath(BinDir). FailpointAgent finds the test build that
	// honours the pipeline's failpoints (runtime.FailAtEnv, through Env).
	Agent string
	// ShimConfig is extra TOML appended to the node's file (policy, mig,
	// netpol sections). It comes after every section Start writes, so it
	// cannot add keys to them; [agent] is set by the Agent* fields.
	ShimConfig string
	// CDISpecDir, when set, is the only directory this node's containerd
	// reads CDI specs from (the CRI's cdi_spec_dirs), instead of the host's
	// /etc/cdi and /var/run/cdi: two nodes on one host must not see, or
	// collect, each other's specs. ShimConfig's mig.cdi_spec_dir should
	// name the same directory.
	CDISpecDir string
	// PipelineEnabled switches Bulkhead's placement pipeline; with it the
	// node runs the agent, without which every sandbox create is refused.
	PipelineEnabled bool
	// AgentKubeconfig is the kubeconfig the agent emits Kubernetes Events
	// with ([agent] kubeconfig); empty emits none.
	AgentKubeconfig string
	// AgentNodeName is the node's name in the agent's Events ([agent]
	// node_name); empty is the host name.
	AgentNodeName string
	// AgentMetricsAddress is where the agent serves /metrics ([agent]
	// metrics_address, e.g. "127.0.0.1:0"); empty serves none.
	AgentMetricsAddress string
	// Busybox is the busybox-static binary the images are built from.
	Busybox string
	// Env is added to containerd's (and so the shims') environment and to
	// the agent's.
	Env []string
	// KubeletRoot is the kubelet's --root-dir when a kubelet drives this
	// node (test/cluster): the shim tells a pod's own volumes from host
	// paths by it. Empty: the shim's default.
	KubeletRoot string
	// DefaultRuntime is the handler of a pod that names none (containerd's
	// default_runtime_name): empty is Handler. UpstreamRuncHandler is what
	// a real node's containerd defaults to, runc without Bulkhead
	// (test/cluster: Bulkhead's own webhook pods name no RuntimeClass).
	DefaultRuntime string
	// PrivateRoot makes the node a machine of its own as far as Bulkhead's
	// install can tell, for deploy/'s DaemonSet to install itself on:
	// containerd runs in a mount namespace of the node's (Node.Command
	// runs the kubelet there too) in which RootPaths are the node's own
	// directories (<Dir>/root; Node.HostPath maps them), with a real
	// node's configuration at /etc/containerd/config.toml (root
	// /var/lib/containerd, state and socket in /run/containerd, CDI specs
	// in /var/run/cdi, network namespaces in /var/run/netns) and no
	// Bulkhead runtime registered: the installer registers them, through
	// the drop-in and import it writes, and restarts containerd by killing
	// the pid in /run/containerd/containerd.pid. containerd exited other
	// than through Stop or RestartContainerd is started again, as systemd
	// would. The node runs no agent of its own (PipelineEnabled, Agent*,
	// Shim and ShimConfig must be unset), and DefaultRuntime must be
	// UpstreamRuncHandler: the DaemonSet's pods run on runc.
	PrivateRoot bool
}

// Node is a running private node.
type Node struct {
	opts      Options
	Socket    string
	StateDir  string // Bulkhead's state dir
	RunscRoot string
	ShimConf  string
	cmd       *exec.Cmd
	conn      *grpc.ClientConn
	Runtime   cri.RuntimeServiceClient
	Images    cri.ImageServiceClient
	logFile   *os.File
	// exited is closed when containerd has exited.
	exited chan struct{}
	// containerd is the daemon's binary, containerdConfig its file.
	containerd, containerdConfig string
	// UpstreamRunscRoot is the runsc root of the pods of gVisor's own shim
	// (handler UpstreamRunscHandler), apart from Bulkhead's RunscRoot.
	UpstreamRunscRoot string
	// agentBin is the agent's binary, found when it is first started.
	agentBin string
	// agentSocket is the node file's [agent] socket.
	agentSocket string
	// agent is the agent's last process, running or exited; nil before
	// the first start.
	agent *agentProcess
	// root is the node's mount namespace (Options.PrivateRoot), or nil.
	root *root
	// mu guards cmd, exited and stopping: containerd's supervisor
	// (Options.PrivateRoot) replaces cmd when containerd exits unasked.
	mu sync.Mutex
	// stopping is set while containerd is stopped on purpose.
	stopping bool
}

// Requirements reports what this machine lacks to run a node, or nil.
func Requirements(binDirs []string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (containerd, runsc, CNI)")
	}
	for _, bin := range []string{"containerd", "ctr", "runsc", "opa", "containerd-shim-bulkhead-v1"} {
		if _, err := lookPath(bin, binDirs); err != nil {
			return fmt.Errorf("needs %s (run `make build tools`)", bin)
		}
	}
	if _, err := AgentPath(binDirs); err != nil {
		return err
	}
	for _, p := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("needs CNI plugin %s (Debian containernetworking-plugins)", p)
		}
	}
	if _, err := os.Stat(images.DefaultBusybox); err != nil {
		return fmt.Errorf("needs %s (Debian busybox-static)", images.DefaultBusybox)
	}
	return nil
}

// LookPath finds bin the way a node does: in BinDirs, then on PATH.
func LookPath(bin string) (string, error) { return lookPath(bin, BinDirs()) }

func lookPath(bin string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, bin)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return exec.LookPath(bin)
}

// AgentPath finds the node agent in binDirs as lookMockPath does: the build
// linked with the GPU mock, which a node file with mig.backend = "mock"
// needs, first.
func AgentPath(binDirs []string) (string, error) {
	p, err := lookMockPath(agentBinary, binDirs)
	if err != nil {
		return "", fmt.Errorf("needs %s (run `make build`)", agentBinary)
	}
	return p, nil
}

// LookMockPath finds bin (bulkhead-agent, bulkhead) for a node whose GPUs
// are mock ones (Pipeline, mig.backend = "mock"): the build linked with the
// GPU mock (`make build`: bin/mockgpu/bin, tag bulkhead_mockgpu) in any of
// BinDirs first, then bin as LookPath finds it. A production build refuses
// to open the mock backend.
func LookMockPath(bin string) (string, error) { return lookMockPath(bin, BinDirs()) }

func lookMockPath(bin string, dirs []string) (string, error) {
	for _, d := range dirs {
		p := filepath.Join(d, "mockgpu", bin)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return lookPath(bin, dirs)
}

// FailpointAgent returns the agent built with the bulkhead_failpoints tag
// (`make build-failpoints`: $BULKHEAD_BIN/failpoints), which fails or
// hangs pipeline steps on request (runtime.FailAtEnv in Options.Env);
// production agents ignore that request.
func FailpointAgent() (string, error) {
	for _, d := range BinDirs() {
		p := filepath.Join(d, "failpoints", agentBinary)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("needs the failpoints %s (run `make build-failpoints`)", agentBinary)
}

// BinDirs returns the directories binaries are looked up in: $BULKHEAD_BIN,
// $TOOLS_DIR/bin, the default tools cache, then PATH.
func BinDirs() []string {
	var dirs []string
	if d := os.Getenv("BULKHEAD_BIN"); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		dirs = append(dirs, filepath.Join(d, "bin"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, ".cache", "bulkhead", "tools", "bin"))
	}
	return dirs
}

var containerdConfig = template.Must(template.New("containerd").Parse(`version = 3
root = "{{.Root}}"
state = "{{.State}}"
[grpc]
  address = "{{.Socket}}"
[ttrpc]
  address = "{{.Socket}}.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{{.PauseImage}}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  # containerd v2.4's CRI stats collector asks every task for metrics each
  # second by default. gVisor's shim answers that (Stats) holding the
  # container's lock across a runsc events call, and loading a task for an
  # exec (State) needs the same lock, within containerd's 2 s state timeout:
  # under load an exec failed with "failed to load task: context deadline
  # exceeded". 10 s is cAdvisor's own housekeeping pace (docs/install.md).
  stats_collect_period = "10s"
  netns_mounts_under_state_dir = {{.NetnsUnderState}}
  enable_selinux = false
{{- if .CDISpecDir}}
  enable_cdi = true
  cdi_spec_dirs = ["{{.CDISpecDir}}"]
{{- end}}
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "{{.DefaultRuntime}}"
{{- if .Shim}}
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.Handler}}]
      runtime_type = "io.containerd.bulkhead.v1"
      runtime_path = "{{.Shim}}"
      pod_annotations = ["bulkhead.dev/*"]
{{- end}}
{{- if .RuncShim}}
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.RuncHandler}}]
      runtime_type = "io.containerd.bulkhead-runc.v1"
      runtime_path = "{{.RuncShim}}"
      pod_annotations = ["bulkhead.dev/*"]
{{- end}}
{{- if .UpstreamRuncShim}}
    # containerd's own runc shim, without Bulkhead: the baseline of make bench-start.
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.UpstreamRuncHandler}}]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{{.UpstreamRuncShim}}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.UpstreamRuncHandler}}.options]
        BinaryName = "{{.Runc}}"
{{- end}}
{{- if .UpstreamRunscShim}}
    # gVisor's own shim, without Bulkhead: the gVisor baseline of make bench-start.
    # The options reach its task service per container (runsc, root, flags).
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.UpstreamRunscHandler}}]
      runtime_type = "io.containerd.runsc.v1"
      runtime_path = "{{.UpstreamRunscShim}}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.{{.UpstreamRunscHandler}}.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{{.UpstreamRunscConfig}}"
{{- end}}
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{{.Dir}}/cni"
    max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`))

var cniConfig = template.Must(template.New("cni").Parse(`{
  "cniVersion": "1.0.0",
  "name": "bulkhead-{{.Bridge}}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "{{.Bridge}}",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "{{.Dir}}/cni-ipam",
        "ranges": [[{"subnet": "{{.Subnet}}"}]{{if .Subnet6}}, [{"subnet": "{{.Subnet6}}"}]{{end}}]{{if .Routed}},
        "routes": [{"dst": "0.0.0.0/0"}{{if .Subnet6}}, {"dst": "::/0"}{{end}}]{{end}}
      }
    },
    {"type": "loopback"}
  ]
}
`))

// Start writes the configuration, starts containerd and waits until its CRI
// answers, then imports the local images.
func Start(ctx context.Context, opts Options) (_ *Node, retErr error) {
	if opts.Bridge == "" || len(opts.Bridge) > 15 {
		return nil, fmt.Errorf("bridge %q: must be 1 to 15 bytes", opts.Bridge)
	}
	if err := opts.validatePrivateRoot(); err != nil {
		return nil, err
	}
	if opts.Busybox == "" {
		opts.Busybox = images.DefaultBusybox
	}
	n := &Node{
		opts:              opts,
		Socket:            filepath.Join(opts.Dir, "containerd.sock"),
		StateDir:          filepath.Join(opts.Dir, "bulkhead"),
		RunscRoot:         filepath.Join(opts.Dir, "runsc"),
		UpstreamRunscRoot: filepath.Join(opts.Dir, "upstream-runsc"),
		ShimConf:          filepath.Join(opts.Dir, "bulkhead.toml"),
		agentBin:          opts.Agent,
		agentSocket:       filepath.Join(opts.Dir, "agent.sock"),
	}
	if opts.PrivateRoot {
		n.Socket = rootDir(opts.Dir) + "/run/containerd/containerd.sock"
		n.StateDir, n.ShimConf, n.agentSocket = "", "", ""
	}
	// A unix socket's path is at most 107 bytes (sun_path).
	for _, sock := range []string{n.Socket, n.agentSocket} {
		if len(sock) > 107 {
			return nil, fmt.Errorf("dir %q: socket %s is longer than a unix socket's 107 bytes", opts.Dir, sock)
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o711); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			n.Stop(context.Background())
		}
	}()
	if opts.PrivateRoot {
		var err error
		if n.root, err = startRoot(opts.Dir); err != nil {
			return nil, err
		}
	}
	shim := opts.Shim
	var err error
	if shim == "" && !opts.PrivateRoot {
		shim, err = lookPath("containerd-shim-bulkhead-v1", opts.BinDir)
	}
	if err != nil {
		return nil, err
	}
	runsc, err := lookPath("runsc", opts.BinDir)
	if err != nil {
		return nil, err
	}
	containerd, err := lookPath("containerd", opts.BinDir)
	if err != nil {
		return nil, err
	}
	// The runc tier (handler bulkhead-runc) is registered where its shim
	// and a runc are built (make build tools).
	var runcShim string
	if !opts.PrivateRoot {
		runcShim, _ = lookPath("containerd-shim-bulkhead-runc-v1", opts.BinDir)
	}
	runc, _ := lookPath("runc", opts.BinDir)
	upstreamRuncShim, _ := lookPath("containerd-shim-runc-v2", opts.BinDir)
	if runc == "" {
		runcShim, upstreamRuncShim = "", ""
	}
	upstreamRunscShim, _ := lookPath("containerd-shim-runsc-v1", opts.BinDir)
	defaultRuntime := Handler
	switch opts.DefaultRuntime {
	case "", Handler:
	case UpstreamRuncHandler:
		if upstreamRuncShim == "" {
			return nil, errors.New("DefaultRuntime upstream-runc: needs containerd-shim-runc-v2 and runc (make tools)")
		}
		defaultRuntime = UpstreamRuncHandler
	default:
		return nil, fmt.Errorf("DefaultRuntime %q: want %q or %q", opts.DefaultRuntime, Handler, UpstreamRuncHandler)
	}
	upstreamRunscConfig := filepath.Join(opts.Dir, "upstream-runsc.toml")
	for _, d := range []string{"cni", "cni-ipam", "root", "state"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, d), 0o711); err != nil {
			return nil, err
		}
	}
	data := map[string]string{
		"Dir": opts.Dir, "Socket": n.Socket, "PauseImage": images.PauseImage, "Handler": Handler, "DefaultRuntime": defaultRuntime,
		"Root": filepath.Join(opts.Dir, "root"), "State": filepath.Join(opts.Dir, "state"), "NetnsUnderState": "true",
		"Shim": shim, "Bridge": opts.Bridge, "Subnet": opts.Subnet, "Subnet6": opts.Subnet6, "Routed": map[bool]string{true: "yes"}[opts.Routed],
		"RuncShim": runcShim, "RuncHandler": RuncHandler, "Runc": runc,
		"UpstreamRuncShim": upstreamRuncShim, "UpstreamRuncHandler": UpstreamRuncHandler,
		"UpstreamRunscShim": upstreamRunscShim, "UpstreamRunscHandler": UpstreamRunscHandler,
		"UpstreamRunscConfig": upstreamRunscConfig, "CDISpecDir": opts.CDISpecDir,
	}
	n.containerdConfig = filepath.Join(opts.Dir, "containerd.toml")
	if opts.PrivateRoot {
		// A real node's paths, inside the node's namespace.
		data["Root"], data["State"], data["NetnsUnderState"] = "/var/lib/containerd", "/run/containerd", "false"
		data["Socket"], data["CDISpecDir"] = "/run/containerd/containerd.sock", "/var/run/cdi"
		n.containerdConfig = n.HostPath("/etc/containerd/config.toml")
	}
	if err := writeTemplate(n.containerdConfig, containerdConfig, data); err != nil {
		return nil, err
	}
	if err := writeTemplate(filepath.Join(opts.Dir, "cni", "10-bulkhead.conflist"), cniConfig, data); err != nil {
		return nil, err
	}
	if upstreamRunscShim != "" {
		if err := os.WriteFile(upstreamRunscConfig, upstreamRunscOptions(runsc, n.UpstreamRunscRoot), 0o644); err != nil {
			return nil, err
		}
	}
	if runc == "" {
		runc = "/usr/local/bin/runc" // not used: the runc tier is not registered
	}
	if !opts.PrivateRoot {
		if err := os.WriteFile(n.ShimConf, []byte(n.nodeFile(runsc, runc)), 0o644); err != nil {
			return nil, err
		}
	}
	if opts.PipelineEnabled {
		// The agent serves before containerd starts, as on a node whose
		// DaemonSet runs it: no sandbox create can come before it.
		if err := n.StartAgent(ctx); err != nil {
			return nil, err
		}
	}

	n.containerd = containerd
	n.logFile, err = os.Create(filepath.Join(opts.Dir, "containerd.log"))
	if err != nil {
		return nil, err
	}
	n.conn, err = grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	n.Runtime = cri.NewRuntimeServiceClient(n.conn)
	n.Images = cri.NewImageServiceClient(n.conn)
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	if err := n.importImages(ctx); err != nil {
		return nil, err
	}
	if err := n.waitForImages(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

// validatePrivateRoot refuses what a node with PrivateRoot cannot have,
// naming the field.
func (o Options) validatePrivateRoot() error {
	if !o.PrivateRoot {
		return nil
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Shim", o.Shim != ""}, {"Agent", o.Agent != ""}, {"ShimConfig", o.ShimConfig != ""}, {"CDISpecDir", o.CDISpecDir != ""},
		{"PipelineEnabled", o.PipelineEnabled}, {"AgentKubeconfig", o.AgentKubeconfig != ""},
		{"AgentNodeName", o.AgentNodeName != ""}, {"AgentMetricsAddress", o.AgentMetricsAddress != ""},
	} {
		if f.set {
			return fmt.Errorf("node: Options.%s: must be unset with PrivateRoot (the DaemonSet installs Bulkhead)", f.name)
		}
	}
	if o.DefaultRuntime != UpstreamRuncHandler {
		return fmt.Errorf("node: Options.DefaultRuntime %q: must be %q with PrivateRoot (the DaemonSet's pods run on runc)", o.DefaultRuntime, UpstreamRuncHandler)
	}
	return nil
}

// nodeFile is the node's configuration file (config.toml; the agent and
// both shims read it): the node's paths, the pipeline's switch and the
// agent's socket, then Options.ShimConfig. [agent] comes before the
// appended TOML, which opens sections of its own: after it, [agent] would
// be a second table of that name, which TOML refuses.
func (n *Node) nodeFile(runsc, runc string) string {
	opts := n.opts
	var kubeletRoot string
	if opts.KubeletRoot != "" {
		kubeletRoot = fmt.Sprintf("kubelet_root = %q\n", opts.KubeletRoot)
	}
	return fmt.Sprintf(`%srunsc_path = %q
runc_path = %q
runc_root = %q
runsc_root = %q
state_dir = %q
ledger_path = %q
log_dir = %q
containerd_root = %q
containerd_state = %q
[runsc]
platform = %q
network = %q
[pipeline]
enabled = %t
benchmark_baseline = %t
[agent]
socket = %q
metrics_address = %q
kubeconfig = %q
node_name = %q
%s`, kubeletRoot, runsc, runc, filepath.Join(opts.Dir, "runc-root"), n.RunscRoot, n.StateDir, filepath.Join(opts.Dir, "ledger.db"), filepath.Join(opts.Dir, "logs"),
		filepath.Join(opts.Dir, "root"), filepath.Join(opts.Dir, "state"), runscPlatform, runscNetwork, opts.PipelineEnabled, !opts.PipelineEnabled,
		n.agentSocket, opts.AgentMetricsAddress, opts.AgentKubeconfig, opts.AgentNodeName, opts.ShimConfig)
}

// waitForImages returns once the CRI plugin knows the imported images.
// ctr writes them to containerd's image store; the CRI plugin learns of
// them from the store's events, asynchronously, and a RunPodSandbox that
// comes first finds no pause image and tries to pull it (no registry here:
// "failed to pull image bulkhead.local/pause:v1").
func (n *Node) waitForImages(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, ref := range []string{images.PauseImage, images.WorkloadImage} {
		for {
			st, err := n.Images.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
			if err == nil && st.GetImage() != nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("image %s imported but not seen by the CRI plugin within 30s (last error: %v)", ref, err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// upstreamRunscOptions is the options file of gVisor's own shim
// (gvisor.dev/gvisor/pkg/shim/v1/runsc.Options, which its task service
// decodes from the file the CRI runtime options' ConfigPath names): the
// node's runsc, a runsc root of its own under the node, and the runsc flags
// Bulkhead's gVisor pods get. Grouping (one shim per pod) is not among
// them: gVisor's manager reads it only from a machine-wide file
// (/run/containerd/runsc/config.toml or /etc/containerd/runsc/config.toml)
// or the bundle's config.toml, which a private node does not write, so the
// upstream shim runs as shipped, one shim process per container.
func upstreamRunscOptions(runsc, root string) []byte {
	return fmt.Appendf(nil, `binary_name = %q
root = %q
[runsc_config]
platform = %q
network = %q
`, runsc, root, runscPlatform, runscNetwork)
}

// UpstreamRunscMissing says why gVisor's own shim cannot start a pod from
// this process, or "" when it can: it must be built (make tools-node), and
// its manager writes -999 to the shim's /proc/N/oom_score_adj, which needs
// CAP_SYS_RESOURCE. The capability is read with capget(2) on this process;
// containerd and its shims, started by it as root, inherit its bounding set.
func UpstreamRunscMissing() string {
	if _, err := LookPath("containerd-shim-runsc-v1"); err != nil {
		return "needs containerd-shim-runsc-v1 (make tools-node)"
	}
	has, err := HasCapability(unix.CAP_SYS_RESOURCE)
	if err != nil {
		return fmt.Sprintf("cannot read this process's capabilities: %v", err)
	}
	if !has {
		return "this process lacks CAP_SYS_RESOURCE, and gVisor's shim manager fails a pod's start without it: " +
			"it sets its oom_score_adj to -999 (failed to set OOM Score on shim: write /proc/N/oom_score_adj: permission denied)"
	}
	return ""
}

// HasCapability reports whether capability capability (unix.CAP_*) is in
// this process's effective set.
func HasCapability(capability int) (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return data[capability/32].Effective&(1<<(uint(capability)%32)) != 0, nil
}

// startContainerd starts the daemon and waits until its CRI answers.
func (n *Node) startContainerd(ctx context.Context) error {
	n.mu.Lock()
	n.stopping = false
	exited, err := n.spawnContainerd()
	n.mu.Unlock()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("containerd exited (log %s)", n.logFile.Name())
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := n.Runtime.Version(cctx, &cri.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd CRI not ready: %v (log %s)", err, n.logFile.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// spawnContainerd starts containerd (in the node's namespace with
// PrivateRoot, recording its pid in /run/containerd/containerd.pid) and
// returns the channel closed when it exits. n.mu is held. With PrivateRoot,
// a containerd that exits unasked (not stopping) is started again.
func (n *Node) spawnContainerd() (<-chan struct{}, error) {
	args := []string{n.containerd, "--config", n.containerdConfig}
	if n.root != nil {
		args = append(n.root.enter(), args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = n.logFile, n.logFile
	cmd.Env = n.env()
	// containerd must outlive a Ctrl-C of the parent long enough to be
	// stopped in order; give it its own process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	if n.root != nil {
		// nsenter execs containerd: the pid is containerd's.
		pidFile := n.HostPath("/run/containerd/containerd.pid")
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, err
		}
	}
	exited := make(chan struct{})
	n.cmd, n.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		n.mu.Lock()
		if n.root != nil && !n.stopping {
			// systemd's RestartSec: a containerd that cannot start does
			// not spin.
			n.mu.Unlock()
			time.Sleep(500 * time.Millisecond)
			n.mu.Lock()
		}
		if n.root != nil && !n.stopping {
			fmt.Fprintf(n.logFile, "--- test/node: containerd exited (%v); starting it again, as systemd would\n", err)
			if _, err := n.spawnContainerd(); err != nil {
				fmt.Fprintf(n.logFile, "--- test/node: %v\n", err)
			}
		}
		n.mu.Unlock()
		close(exited)
	}()
	return exited, nil
}

// env is the environment of containerd (and so of the shims) and of the
// agent: the node's file, its binaries first on PATH, then Options.Env.
// With PrivateRoot the shims read a real node's file,
// /etc/bulkhead/config.toml, the installer's.
func (n *Node) env() []string {
	env := append(os.Environ(),
		"PATH="+strings.Join(append(append([]string{}, n.opts.BinDir...), os.Getenv("PATH")), ":"))
	if n.root == nil {
		env = append(env, config.PathEnv+"="+n.ShimConf)
	}
	return append(env, n.opts.Env...)
}

// RestartContainerd stops containerd (pods and shims keep running, as on a
// real node) and starts it again on the same state.
func (n *Node) RestartContainerd(ctx context.Context) error {
	n.stopContainerd()
	return n.startContainerd(ctx)
}

// stopContainerd sends SIGTERM and waits, killing after 15 seconds.
func (n *Node) stopContainerd() {
	n.mu.Lock()
	n.stopping = true
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func writeTemplate(path string, t *template.Template, data any) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := t.Execute(f, data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (n *Node) importImages(ctx context.Context) error {
	tar := filepath.Join(n.opts.Dir, "images.tar")
	var extras []images.File
	// The network probe, when built, lets tests speak UDP and ICMP.
	if probe, err := lookPath("netprobe", n.opts.BinDir); err == nil {
		extras = append(extras, images.File{Path: "bin/netprobe", Source: probe})
	}
	if err := images.Build(n.opts.Busybox, tar, extras...); err != nil {
		return err
	}
	ctr, err := lookPath("ctr", n.opts.BinDir)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, ctr, "--address", n.Socket, "-n", "k8s.io", "images", "import", "--no-unpack=false", tar).CombinedOutput()
	if err != nil {
		out2, err2 := exec.CommandContext(ctx, ctr, "--address", n.Socket, "-n", "k8s.io", "images", "import", tar).CombinedOutput()
		if err2 != nil {
			return fmt.Errorf("ctr images import: %v: %s / %s", err2, out, out2)
		}
	}
	return nil
}

// Log returns containerd's log so far, then the last lines of the agent's
// when it was started (for test failures).
func (n *Node) Log() string {
	if n.logFile == nil {
		return ""
	}
	b, _ := os.ReadFile(n.logFile.Name())
	if n.agent != nil {
		b = fmt.Appendf(b, "\n--- %s (%s, last %d lines)\n%s\n", agentBinary, n.AgentLogPath(), agentLogTail, n.agentLogTail(agentLogTail))
	}
	return string(b)
}

// Dir returns the node's directory.
func (n *Node) Dir() string { return n.opts.Dir }

// HostPath is the host's view of path p of the node: with PrivateRoot, p
// under one of RootPaths is <Dir>/root/p; any other path is p.
func (n *Node) HostPath(p string) string {
	if n.root == nil {
		return p
	}
	return n.root.path(p)
}

// Command is name with args run in the node's mount namespace (the
// kubelet's, a `bulkhead node status`), or on the host without
// PrivateRoot.
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if n.root == nil {
		return exec.CommandContext(ctx, name, args...)
	}
	return n.root.command(ctx, name, args...)
}

// EnterArgs is the command line that runs a command in the node's mount
// namespace (nsenter ... --), or nil without PrivateRoot.
func (n *Node) EnterArgs() []string {
	if n.root == nil {
		return nil
	}
	return n.root.enter()
}

// Processes lists the processes of the node: with PrivateRoot those of its
// mount namespace (containerd, the kubelet, the shims), else those whose
// command line names its directory (ProcessesUnder).
func (n *Node) Processes() []int {
	if n.root == nil {
		return ProcessesUnder(n.opts.Dir)
	}
	return n.root.processes()
}

// Stop removes every pod, stops containerd, then the agent (which must
// outlive the pods' deletion: their shims release them through it), and
// removes what the node left: processes and mounts under its directory,
// the bridge, the directory itself.
func (n *Node) Stop(ctx context.Context) {
	if n.Runtime != nil && n.running() {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		n.RemoveAllPods(cctx)
		cancel()
	}
	if n.conn != nil {
		n.conn.Close()
	}
	n.stopContainerd()
	if n.agentRunning() {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		_ = n.StopAgent(cctx)
		cancel()
	}
	if n.root != nil {
		n.root.stop()
	}
	KillUnder(n.opts.Dir)
	UnmountUnder(n.opts.Dir)
	_ = exec.Command("ip", "link", "del", n.opts.Bridge).Run()
	if n.logFile != nil {
		n.logFile.Close()
	}
	_ = os.RemoveAll(n.opts.Dir)
}

func (n *Node) running() bool {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// RemoveAllPods stops and removes every pod sandbox, those of namespace
// bulkhead-system last: a DaemonSet's agent must outlive the pods whose
// shims release them through it.
func (n *Node) RemoveAllPods(ctx context.Context) {
	resp, err := n.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return
	}
	last := func(sb *cri.PodSandbox) bool { return sb.GetMetadata().GetNamespace() == "bulkhead-system" }
	slices.SortStableFunc(resp.Items, func(a, b *cri.PodSandbox) int {
		switch {
		case last(a) == last(b):
			return 0
		case last(a):
			return 1
		}
		return -1
	})
	for _, sb := range resp.Items {
		_, _ = n.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id})
		_, _ = n.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id})
	}
}

// MountsUnder lists mount points below dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			mounts = append(mounts, fields[4])
		}
	}
	// Deepest first so parents unmount after children.
	for i, j := 0, len(mounts)-1; i < j; i, j = i+1, j-1 {
		mounts[i], mounts[j] = mounts[j], mounts[i]
	}
	return mounts
}

// UnmountUnder lazily unmounts everything below dir.
func UnmountUnder(dir string) {
	for _, m := range MountsUnder(dir) {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
}

// ProcessesUnder lists pids whose command line mentions dir (shims, runsc
// and sandboxes started for the node all carry its paths in their arguments).
func ProcessesUnder(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillUnder kills every process ProcessesUnder finds.
func KillUnder(dir string) {
	for _, pid := range ProcessesUnder(dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// BridgeName returns the CNI bridge's name.
func (n *Node) BridgeName() string { return n.opts.Bridge }

// Pipeline describes the full placement pipeline for a node: the policy
// bundle and tenants, a mock GPU node and the eBPF fence.
type Pipeline struct {
	// Bundle is the policy bundle directory (the repository's rego/).
	Bundle string
	// TenantsJSON is the policy data with data.bulkhead.tenants.
	TenantsJSON string
	// MockModel and MockGPUs describe the mock GPU node.
	MockModel string
	MockGPUs  int
	// PinDir is the fence's pin directory on bpffs (private to the node).
	PinDir string
	// Signed builds and signs the bundle with the real opa (SignBundle) and
	// has the node verify it; otherwise the node loads Bundle unverified.
	Signed bool
	// BinDirs locate opa when Signed.
	BinDirs []string
	// Subnet6 is the node's IPv6 pod CIDR, when it has one: a cluster CIDR,
	// whose gateway (the first address) is a shared service like the IPv4 one.
	Subnet6 string
}

// ShimConfig writes the pipeline's files under dir and returns the TOML
// to append to the shim's configuration (with the pipeline enabled).
func (p Pipeline) ShimConfig(dir, subnet string) (string, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	var policyConf string
	if p.Signed {
		bundle, pub, err := SignBundle(dir, p.Bundle, p.TenantsJSON, p.BinDirs)
		if err != nil {
			return "", err
		}
		policyConf = fmt.Sprintf("bundle = %q\nkey_file = %q\nkey_id = %q\nscope = %q\n", bundle, pub, BundleKeyID, BundleScope)
	} else {
		tenants := filepath.Join(dir, "tenants.json")
		if err := os.WriteFile(tenants, []byte(p.TenantsJSON), 0o644); err != nil {
			return "", err
		}
		policyConf = fmt.Sprintf("bundle = %q\ninsecure_skip_verification = true\ndata = %q\n", p.Bundle, tenants)
	}
	ip, _, _ := strings.Cut(subnet, "/")
	gw := strings.TrimSuffix(ip, ".0") + ".1"
	var cidr6, gw6 string
	if p.Subnet6 != "" {
		pfx, err := netip.ParsePrefix(p.Subnet6)
		if err != nil || !pfx.Addr().Is6() {
			return "", fmt.Errorf("Subnet6 %q: not an IPv6 prefix", p.Subnet6)
		}
		cidr6 = fmt.Sprintf(", %q", pfx.Masked())
		gw6 = fmt.Sprintf(`, "%s/128"`, pfx.Masked().Addr().Next())
	}
	return fmt.Sprintf(`[policy]
%sdecision_log = %q
[mig]
backend = "mock"
mock_model = %q
mock_gpus = %d
mock_state = %q
cdi_spec_dir = %q
[netpol]
enabled = true
pin_dir = %q
lock_path = %q
cluster_cidrs = [%q%s]
[netpol.shared_services]
untrusted = ["%s/32"%s]
standard = ["%s/32"%s]
trusted = ["%s/32"%s]
`, policyConf, filepath.Join(dir, "decisions.log"), p.MockModel, p.MockGPUs, filepath.Join(dir, "mock-gpus.json"), filepath.Join(dir, "cdi"),
		p.PinDir, filepath.Join(dir, "netpol.lock"), subnet, cidr6, gw, gw6, gw, gw6, gw, gw6), nil
}
