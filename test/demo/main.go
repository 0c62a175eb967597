// Command demo runs a real local node — containerd, Bulkhead's node agent
// and shims, gVisor, the default policy bundle, a mock H200 node and the
// eBPF fence — with two tenants, starts pods through the CRI as a kubelet would, explains each
// decision in plain words, and tears everything down on exit or Ctrl-C.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/test/images"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

const tenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"],   "egress_cidrs": ["10.96.0.0/12"], "quota": {"sandboxes": 3, "gpu_slices": 3, "memory": "64Gi"}},
  "research": {"tier": "standard",  "namespaces": ["research"], "quota": {"sandboxes": 10, "gpu_slices": 14, "memory": "512Gi"}},
  "training": {"tier": "trusted",   "namespaces": ["training"], "quota": {"sandboxes": 10, "gpu_slices": 14, "memory": "512Gi"}}
}}}`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		// Whatever failed after the signal failed because of it.
		fmt.Fprintln(os.Stderr, "\ndemo interrupted: everything it started was torn down (exit 130)")
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

type demo struct {
	n      *node.Node
	ctx    context.Context
	dir    string
	pinDir string
	fence  *netpol.Reader // opened with the first probe: the first pod pins the fence
}

type pod struct {
	cfg       *cri.PodSandboxConfig
	id, ctr   string
	ip, label string
	ip6       string // the pod's IPv6 address on the dual-stack bridge
	tenant    string // the tenant owning the pod's namespace (the demo names them alike)
}

func run(ctx context.Context) (retErr error) {
	bins := node.BinDirs()
	if err := node.Requirements(bins); err != nil {
		return fmt.Errorf("%v — run `make build tools` and `sudo make demo`", err)
	}
	bundle, err := filepath.Abs("rego")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bulkhead-demo-")
	if err != nil {
		return err
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/bulkhead-demo-%d", os.Getpid())
	subnet, subnet6 := "10.77.0.0/24", "fd77::/64"
	shimConf, err := node.Pipeline{Bundle: bundle, TenantsJSON: tenants, MockModel: "h200", MockGPUs: 2, PinDir: pinDir, Signed: true, BinDirs: bins, Subnet6: subnet6}.ShimConfig(dir, subnet)
	if err != nil {
		return err
	}
	say("starting a private node in %s: containerd v2.4.2, Bulkhead's node agent (bulkhead-agent, which\n    holds the policy, the ledger, the GPUs and the fence; the shims ask it about every pod), Bulkhead's\n    shim as handler %q, gVisor, the default policy bundle (rego/) built and signed with\n    `opa build --signing-key` (key id %q, scope %q) and verified by the node, two mock H200 GPUs\n    and the eBPF fence", dir, node.Handler, node.BundleKeyID, node.BundleScope)
	fmt.Printf("    tenants: agents (tier untrusted, quota 3 sandboxes), research (tier standard), training (tier trusted)\n")
	n, err := node.Start(ctx, node.Options{Dir: dir, BinDir: bins, Bridge: "bh-demo0", Subnet: subnet, Subnet6: subnet6, PipelineEnabled: true, ShimConfig: shimConf})
	if err != nil {
		return err
	}
	fmt.Printf("    node agent: pid %d, serving the shims on %s (log %s)\n", n.AgentPID(), n.AgentSocket(), n.AgentLogPath())
	d := &demo{n: n, ctx: ctx, dir: dir, pinDir: pinDir}
	defer func() {
		say("tearing down: pods, containerd, the node agent, bridge, eBPF pins, %s", dir)
		if d.fence != nil {
			d.fence.Close()
		}
		n.Stop(context.Background())
		_ = os.RemoveAll(pinDir)
		if err := leftovers(dir, pinDir, n.BridgeName()); err != nil {
			retErr = errors.Join(retErr, err)
			return
		}
		fmt.Println("done: nothing left on this machine (checked: processes, network links, mounts, eBPF pins, state directory)")
	}()

	say("policy refusals (the message is what the kubelet and crictl see)")
	hostRoot := []*cri.Mount{{HostPath: "/", ContainerPath: "/host", Readonly: true}}
	for _, r := range []struct {
		name, ns, handler, why string
		ann                    map[string]string
		mounts                 []*cri.Mount
	}{
		{"stranger", "default", node.Handler, "a namespace that belongs to no tenant", nil, nil},
		{"agent-gpu", "agents", node.Handler, "an untrusted agent asking for a MIG slice (gVisor cannot expose MIG devices)", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}, nil},
		{"agent-hostfs", "agents", node.Handler, "an untrusted agent whose container mounts the host's / (judged by the node\n      from the container's OCI spec, webhook or not)", nil, hostRoot},
		{"agent-runc", "agents", node.RuncHandler, "an untrusted agent asking for runc (the host's kernel) with handler " + node.RuncHandler, nil, nil},
	} {
		_, err := d.runPod(r.handler, r.name, r.ns, r.ann, "", r.mounts...)
		fmt.Printf("    %s/%s — %s:\n      ", r.ns, r.name, r.why)
		if err == nil {
			return fmt.Errorf("%s/%s was admitted; the policy should refuse it", r.ns, r.name)
		}
		msg := err.Error()
		if i := strings.Index(msg, "bulkhead refused"); i >= 0 {
			msg = msg[i:]
		}
		fmt.Println(msg)
	}

	say("admitted pods")
	server := "exec netprobe serve tcp:8080 udp:9090 udp:4791"
	coder1, err := d.runPod(node.Handler, "coder-1", "agents", nil, server)
	if err != nil {
		return err
	}
	coder2, err := d.runPod(node.Handler, "coder-2", "agents", nil, "exec sleep 3600")
	if err != nil {
		return err
	}
	notebook, err := d.runPod(node.Handler, "notebook", "research", map[string]string{policy.AnnotationGPUProfile: "3g.71gb"}, server)
	if err != nil {
		return err
	}
	trainer, err := d.runPod(node.RuncHandler, "trainer", "training", map[string]string{policy.AnnotationGPUProfile: "3g.71gb"}, "exec sleep 3600")
	if err != nil {
		return err
	}
	for _, p := range []*pod{coder1, coder2, notebook} {
		fmt.Printf("    %-18s sandbox %s  IP %-12s  in gVisor\n", p.label, p.id[:12], p.ip)
	}
	fmt.Printf("    %-18s sandbox %s  IP %-12s  on runc (handler %s)\n", trainer.label, trainer.id[:12], trainer.ip, node.RuncHandler)
	fmt.Println("    research/notebook asked for a 3g.71gb MIG slice: gVisor cannot use one, and the standard")
	fmt.Println("    tier's policy answers mig_in_sandbox = whole-gpu, so it holds a whole GPU instead.")
	fmt.Println("    training/trainer (tier trusted) runs on runc, so its 3g.71gb request became a real MIG")
	fmt.Println("    instance (GPU instance + compute instance through NVML's mock H200):")
	env, err := d.exec(trainer, "sh", "-c", "tr '\\0' '\\n' </proc/1/environ | grep ^NVIDIA_VISIBLE_DEVICES=")
	if err != nil {
		return fmt.Errorf("training/trainer: reading its environment: %w", err)
	}
	fmt.Printf("    inside training/trainer: %s\n", strings.TrimSpace(env))
	dmesg, _ := d.exec(coder1, "dmesg")
	fmt.Printf("    inside agents/coder-1: %s\n", firstLine(dmesg))

	say("traffic")
	fmt.Println("    a flow is BLOCKED only when the probe ran, failed, and the fence's drop counters for the")
	fmt.Println("    two tenants rose meanwhile (shown as tenant reason+count); a probe that cannot run stops the demo")
	time.Sleep(200 * time.Millisecond) // let the servers start
	for _, f := range []struct {
		from, to *pod
		what     string
		v6       bool
	}{
		{coder2, coder1, "agents → agents (same tenant)", false},
		{notebook, coder1, "research → agents (across tenants)", false},
		{coder1, notebook, "agents → research (across tenants)", false},
		{coder2, coder1, "agents → agents (same tenant), IPv6", true},
		{notebook, coder1, "research → agents (across tenants), IPv6", true},
	} {
		if f.v6 && f.from == coder2 {
			fmt.Println("    (RoCEv2 needs the tier's RDMA grant on both ends; the untrusted tier has none.)")
			fmt.Println("    the bridge is dual-stack: the same fence over IPv6")
		}
		if err := d.try(f.from, f.to, f.what, f.v6); err != nil {
			return err
		}
	}

	say("bulkhead node status: usage against quota, GPU layout, fenced endpoints, drop counters")
	if err := d.status(); err != nil {
		return err
	}

	say("removing the pods")
	for _, p := range []*pod{coder1, coder2, notebook, trainer} {
		if _, err := n.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: p.id}); err != nil {
			return err
		}
		if _, err := n.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: p.id}); err != nil {
			return err
		}
	}
	if err := d.status(); err != nil {
		return err
	}
	return nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// runPod runs a pod with one busybox container; a pod whose container
// cannot start is removed again, so nothing of it stays behind.
func (d *demo) runPod(handler, name, ns string, ann map[string]string, script string, mounts ...*cri.Mount) (_ *pod, retErr error) {
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: ns, Uid: ns + "-" + name},
		Hostname:     name,
		LogDirectory: filepath.Join(d.dir, "pod-logs", ns+"_"+name),
		Annotations:  ann,
		Linux:        &cri.LinuxPodSandboxConfig{},
	}
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		return nil, err
	}
	sb, err := d.n.Runtime.RunPodSandbox(d.ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return nil, err
	}
	p := &pod{cfg: cfg, id: sb.PodSandboxId, label: ns + "/" + name, tenant: ns}
	defer func() {
		if retErr != nil {
			_, _ = d.n.Runtime.StopPodSandbox(context.WithoutCancel(d.ctx), &cri.StopPodSandboxRequest{PodSandboxId: p.id})
			_, _ = d.n.Runtime.RemovePodSandbox(context.WithoutCancel(d.ctx), &cri.RemovePodSandboxRequest{PodSandboxId: p.id})
		}
	}()
	c, err := d.n.Runtime.CreateContainer(d.ctx, &cri.CreateContainerRequest{
		PodSandboxId: p.id,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: "main"},
			Image:    &cri.ImageSpec{Image: images.WorkloadImage},
			Command:  []string{"/bin/sh", "-c", script},
			LogPath:  "main.log",
			Mounts:   mounts,
			Linux:    &cri.LinuxContainerConfig{},
		},
		SandboxConfig: cfg,
	})
	if err != nil {
		return nil, err
	}
	if _, err := d.n.Runtime.StartContainer(d.ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		return nil, err
	}
	p.ctr = c.ContainerId
	st, err := d.n.Runtime.PodSandboxStatus(d.ctx, &cri.PodSandboxStatusRequest{PodSandboxId: p.id})
	if err != nil {
		return nil, err
	}
	p.ip = st.Status.GetNetwork().GetIp()
	for _, a := range st.Status.GetNetwork().GetAdditionalIps() {
		if strings.Contains(a.GetIp(), ":") {
			p.ip6 = a.GetIp()
		}
	}
	return p, nil
}

func (d *demo) exec(p *pod, cmd ...string) (string, error) {
	r, err := d.n.Runtime.ExecSync(d.ctx, &cri.ExecSyncRequest{ContainerId: p.ctr, Cmd: cmd, Timeout: 20})
	if err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return string(r.Stdout), fmt.Errorf("exit %d", r.ExitCode)
	}
	return string(r.Stdout), nil
}

// try probes the flows from one pod to another and says what happened to
// each. A verdict is evidence, never an inference: "allowed" when the probe
// got its answer; "BLOCKED by the fence" when the probe ran, failed, and the
// fence's drop counters of the two tenants rose while it ran (the reasons
// that rose are printed). A probe that could not run is an error; one that
// failed with no drop counted is printed as such, never as the fence's.
func (d *demo) try(from, to *pod, what string, v6 bool) error {
	type flow struct{ mode, target, label string }
	flows := []flow{
		{"tcp", to.ip + ":8080", "TCP 8080"}, {"udp", to.ip + ":9090", "UDP 9090"},
		{"icmp", to.ip, "ICMP echo"}, {"udp", to.ip + ":4791", "RoCEv2 (UDP 4791)"},
	}
	src, dst := from.ip, to.ip
	if v6 {
		if from.ip6 == "" || to.ip6 == "" {
			return fmt.Errorf("%s → %s: no IPv6 address on the pods (%q, %q)", from.label, to.label, from.ip6, to.ip6)
		}
		flows = []flow{{"tcp", "[" + to.ip6 + "]:8080", "TCP 8080"}, {"icmp6", to.ip6, "ICMPv6 echo"}}
		src, dst = from.ip6, to.ip6
	}
	fmt.Printf("    %s\n", what)
	for _, f := range flows {
		verdict, err := d.probe(from, to, f.mode, f.target)
		if err != nil {
			return fmt.Errorf("%s → %s, %s: %w", from.label, to.label, f.label, err)
		}
		fmt.Printf("      %-18s %s -> %s  %s\n", f.label, src, dst, verdict)
	}
	return nil
}

// probe runs netprobe in from and returns the verdict with its evidence.
func (d *demo) probe(from, to *pod, mode, target string) (string, error) {
	before, err := d.drops(from.tenant, to.tenant)
	if err != nil {
		return "", err
	}
	r, err := d.n.Runtime.ExecSync(d.ctx, &cri.ExecSyncRequest{ContainerId: from.ctr, Cmd: []string{"netprobe", mode, target}, Timeout: 20})
	if err != nil {
		return "", fmt.Errorf("the probe could not run: %w", err)
	}
	if r.ExitCode == 0 {
		return "allowed", nil
	}
	stderr := strings.TrimSpace(string(r.Stderr))
	if r.ExitCode != 1 { // 1 is netprobe's "no answer"; 2 usage, 126/127 exec
		return "", fmt.Errorf("the probe could not run: exit %d: %s", r.ExitCode, stderr)
	}
	after, err := d.drops(from.tenant, to.tenant)
	if err != nil {
		return "", err
	}
	var rose []string
	for _, t := range []string{from.tenant, to.tenant} {
		for _, reason := range netpol.Reasons() {
			if reason.String() == "nd" && !strings.Contains(target, "[") && mode != "icmp6" {
				continue // neighbour discovery is IPv6's: not this IPv4 probe's packets
			}
			k := t + " " + reason.String()
			if n := after[k] - before[k]; n > 0 {
				rose = append(rose, fmt.Sprintf("%s %s+%d", t, reason, n))
			}
		}
		if from.tenant == to.tenant {
			break
		}
	}
	if len(rose) == 0 {
		// Not claimed for the fence: no packet of this probe reached it.
		// Often the sender never sent one: its stack gave up resolving the
		// peer after the fence refused its ARP in an earlier probe.
		return "NO ANSWER, but no drop counted during this probe, so not claimed for the fence (the sender may have given up\n" +
			"                         resolving the peer after an earlier refused ARP) (" + stderr + ")", nil
	}
	return "BLOCKED by the fence (drops: " + strings.Join(rose, ", ") + ")", nil
}

// drops reads the fence's counters of the tenants, keyed "tenant reason",
// through read-only handles on the maps the shims pinned.
func (d *demo) drops(tenants ...string) (map[string]uint64, error) {
	if d.fence == nil {
		f, err := netpol.OpenReadOnly(d.pinDir)
		if err != nil {
			return nil, fmt.Errorf("reading the fence's drop counters: %w", err)
		}
		d.fence = f
	}
	out := map[string]uint64{}
	for _, t := range tenants {
		s, err := d.fence.Stats(t)
		if err != nil {
			return nil, fmt.Errorf("reading the fence's drop counters: %w", err)
		}
		for r, n := range s.Drops {
			out[t+" "+r.String()] = n
		}
	}
	return out, nil
}

// leftovers checks that the node left nothing behind: no process naming its
// directory, no mount under it, no bridge, no pins, no directory.
func leftovers(dir, pinDir, bridge string) error {
	var left []string
	if pids := node.ProcessesUnder(dir); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes %v", pids))
	}
	if ms := node.MountsUnder(dir); len(ms) > 0 {
		left = append(left, fmt.Sprintf("mounts %v", ms))
	}
	if _, err := net.InterfaceByName(bridge); err == nil {
		left = append(left, "link "+bridge)
	}
	for _, p := range []string{pinDir, dir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			left = append(left, p)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("teardown left %s", strings.Join(left, "; "))
	}
	return nil
}

// status runs `bulkhead node status` on the demo's node, with the CLI
// linked with the GPU mock where it is built: the node's GPUs are mock ones.
func (d *demo) status() error {
	bin, err := node.LookMockPath("bulkhead")
	if err != nil {
		return fmt.Errorf("bulkhead node status: needs the bulkhead CLI (make build): %w", err)
	}
	out, err := exec.Command(bin, "node", "status", "--config", d.n.ShimConf).CombinedOutput()
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Println("    " + l)
	}
	return err
}
