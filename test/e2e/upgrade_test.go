package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	bhnode "github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// TestUpgradeInPlace upgrades a node that runs pods on the previous
// release (test/e2e/testdata/previous-release, built by
// test/scripts/previous-release.sh) to this tree's binaries the way the
// bulkhead-node DaemonSet's rolling update does: the old agent stops, the
// installer renames the new shims over the old ones (deploy/node/install.sh
// put), and the new agent starts on the same config.toml, ledger, state
// directory and pinned fence. Nothing is drained.
//
// Before, during and after, the traffic matrix of the running pods gives
// the same verdicts (same tenant passes, across tenants drops); a prober
// runs it without pause through every phase, one of which has no agent at
// all. After the upgrade every old pod still runs under its old shim
// process with the reservation and placement it had, the drop counters
// carried over, and the fence's maps migrated in place from layout 1 (no
// layout map, 4-byte drop keys) to layout 2 (a layout map, 8-byte drop
// keys) with every other map the same kernel object. A new pod starts on
// the new shim and is fenced against the old ones; an old pod's shim talks
// to the new agent: its containers are judged, and its removal releases
// its reservation, GPU and fence entry.
//
// Downgrade is refused. What a user sees who rolls the DaemonSet back to
// the previous release after the upgrade: the old agent exits at start
// with "bulkhead-agent: netpol: maps pinned in <pin_dir> are from another
// Bulkhead version (remove them to migrate): ..." (its container restarts
// and fails again), so every new pod and every new container on the node
// is refused (fail closed, naming the agent's socket); the running pods
// keep their fence, reservations and traffic. Rolling forward again
// resumes the node; no second migration runs. The old release's advice to
// remove the pinned maps would unfence the running pods: drain the node
// first if you must go back.
func TestUpgradeInPlace(t *testing.T) {
	if err := node.Requirements(node.BinDirs()); err != nil {
		t.Skipf("e2e: %v", err)
	}
	old := previousRelease(t)
	cur := thisRelease(t)
	withRunc := runcTierMissing() == ""
	if !withRunc {
		t.Logf("runc tier: %s: the upgrade covers the gVisor handler only", runcTierMissing())
	}
	for _, r := range []release{old, cur} {
		t.Logf("%s: %s", r.name, r.version)
	}
	if !strings.Contains(old.version, " commit "+old.commit+" ") {
		t.Fatalf("the previous release's agent reports %q, want commit %s", old.version, old.commit)
	}
	if cur.version == old.version {
		t.Fatalf("this tree's agent reports %q, the same as the previous release's: the test would upgrade to itself (make build)", cur.version)
	}

	un := startUpgradeNode(t, old)
	pn := un.pipelineNode
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Two tenants' pods on the previous release: agents (untrusted, two
	// pods), research (standard, with a GPU: in gVisor a whole one), and
	// when the runc tier is built platform (trusted) on runc with a MIG
	// slice of the mock H200.
	server := "exec netprobe serve tcp:8080 udp:9090"
	gpu := func(profile string) map[string]string { return map[string]string{policy.AnnotationGPUProfile: profile} }
	pods := []*upPod{
		{name: "a1", tenant: "agents", handler: node.Handler},
		{name: "a2", tenant: "agents", handler: node.Handler},
		{name: "r1", tenant: "research", handler: node.Handler, annotations: gpu("1g.18gb")},
	}
	if withRunc {
		// One GPU: the research pod goes without, and the MIG slice is
		// the reservation the upgrade must keep.
		pods[2].annotations = nil
		pods = append(pods, &upPod{name: "p1", tenant: "platform", handler: node.RuncHandler, annotations: gpu("3g.71gb")})
	}
	gpuPod := pods[len(pods)-1]
	for _, p := range pods {
		p.start(ctx, t, pn, server)
	}
	a1, a2 := pods[0], pods[1]
	if _, err := execSync(ctx, pn.Node, a1.ctr, "test", "-x", "/bin/netprobe"); err != nil {
		t.Fatalf("the workload image lacks netprobe (make build): %v", err)
	}
	time.Sleep(300 * time.Millisecond) // servers listening

	// Before: the matrix, and the node as the previous release reports it.
	matrix := matrixOf(pods)
	before := matrix.run(ctx, pn.Node, func() string { return "before" })
	if bad := wrongVerdicts(before); len(bad) > 0 {
		t.Fatalf("the previous release's fence does not hold the matrix before the upgrade:\n%s", strings.Join(bad, "\n"))
	}
	t.Logf("matrix before: %d probes (%s), as expected", len(before), matrix)
	statusBefore := un.status(ctx, t, old)
	placed := map[string]*bhnode.Reservation{}
	for _, r := range statusBefore.Sandboxes {
		placed[r.SandboxID] = r
	}
	for _, p := range pods {
		r := placed[p.id]
		if r == nil || r.State != bhnode.StateActive || r.Endpoint == nil || r.ShimPID == 0 {
			t.Fatalf("pod %s: the previous release reports reservation %+v, want an active one with a fence endpoint and its shim", p.name, r)
		}
		if p == gpuPod && r.GPU == nil {
			t.Fatalf("pod %s asked for a GPU: the previous release placed none (%+v)", p.name, r)
		}
		p.shimPID = r.ShimPID
		if got, want := fileID(t, fmt.Sprintf("/proc/%d/exe", r.ShimPID)), fileID(t, un.installed(p.shimName())); got != want {
			t.Fatalf("pod %s: shim %d does not run the installed previous release's %s", p.name, r.ShimPID, p.shimName())
		}
	}
	if withRunc && len(statusBefore.Instances) != 1 {
		t.Fatalf("the previous release reports MIG instances %+v, want the platform pod's one", statusBefore.Instances)
	}
	dropsBefore := un.drops(ctx, t, old, pods)
	pinsBefore := readPins(t, un.pinDir)
	if pinsBefore.layout != 0 || pinsBefore.maps["drops"].keySize != 4 {
		t.Fatalf("the previous release pinned layout map %d and drop keys of %d bytes, want none and 4 (layout 1): is %s really the previous release?",
			pinsBefore.layout, pinsBefore.maps["drops"].keySize, old.commit)
	}
	oldShims := map[string]fileKey{}
	for _, p := range pods {
		oldShims[p.name] = fileID(t, un.installed(p.shimName()))
	}

	// During: the rolling update, with the matrix probed without pause.
	pr := startProber(ctx, pn.Node, matrix, "old agent")
	logFrom := agentLogSize(pn.Node)
	if err := pn.StopAgent(ctx); err != nil {
		t.Fatal(err)
	}
	pr.enter("no agent")
	un.install(t, cur)
	if err := pr.waitRound(ctx, "no agent"); err != nil {
		t.Fatal(err)
	}
	pr.enter("new agent starting")
	if err := pn.StartAgent(ctx); err != nil {
		t.Fatalf("the new agent on the previous release's state: %v", err)
	}
	pr.enter("new agent")
	if err := pr.waitRound(ctx, "new agent"); err != nil {
		t.Fatal(err)
	}
	during := pr.stop()
	if bad := wrongVerdicts(during); len(bad) > 0 {
		t.Errorf("%d of %d probes during the upgrade differ from before:\n%s", len(bad), len(during), strings.Join(bad, "\n"))
	}
	t.Logf("matrix during the upgrade: %d probes, %s", len(during), phaseCounts(during))
	if n := countIn(during, "no agent"); n == 0 {
		t.Error("no probe ran while no agent did")
	}

	// After: the migration, the matrix, and every old pod as it was.
	migrated := regexp.MustCompile(`migrated.*\b1\b.*\b2\b`)
	if line := matchingLine(agentLogSince(pn.Node, logFrom), migrated); line == "" {
		t.Errorf("the new agent's log has no line matching %q; it says:\n%s", migrated, tail(agentLogSince(pn.Node, logFrom), 30))
	} else {
		t.Logf("new agent: %s", line)
	}
	pinsAfter := readPins(t, un.pinDir)
	if pinsAfter.layout != 2 {
		t.Errorf("layout map after the upgrade: %d, want 2", pinsAfter.layout)
	}
	if ks := pinsAfter.maps["drops"].keySize; ks != 8 {
		t.Errorf("drops map key after the upgrade: %d bytes, want 8 (tenant, reason)", ks)
	}
	for name, m := range pinsBefore.maps {
		switch a, ok := pinsAfter.maps[name]; {
		case !ok:
			t.Errorf("map %s pinned before the upgrade is gone", name)
		case name != "drops" && a.id != m.id:
			t.Errorf("map %s is a new kernel object after the upgrade (id %d, was %d): migrated by copy, not in place", name, a.id, m.id)
		}
	}
	after := matrix.run(ctx, pn.Node, func() string { return "after" })
	if bad := wrongVerdicts(after); len(bad) > 0 {
		t.Errorf("the matrix after the upgrade differs from before:\n%s", strings.Join(bad, "\n"))
	}
	t.Logf("matrix after: %d probes, as before", len(after))
	statusAfter := un.status(ctx, t, cur)
	if statusAfter.Agent == nil || !statusAfter.Agent.Running || statusAfter.Agent.PID != pn.AgentPID() {
		t.Errorf("node status after the upgrade comes from agent %+v, want the new one (pid %d)", statusAfter.Agent, pn.AgentPID())
	}
	for _, p := range pods {
		var now *bhnode.Reservation
		for _, r := range statusAfter.Sandboxes {
			if r.SandboxID == p.id {
				now = r
			}
		}
		if was := placed[p.id]; now == nil || !reflect.DeepEqual(keptOf(now), keptOf(was)) {
			t.Errorf("pod %s: reservation after the upgrade %s, want it as before %s", p.name, keptOf(now), keptOf(was))
		}
		exe := fmt.Sprintf("/proc/%d/exe", p.shimPID)
		if got := fileID(t, exe); got != oldShims[p.name] {
			t.Errorf("pod %s: its shim %d no longer runs the previous release's binary", p.name, p.shimPID)
		}
	}
	if !reflect.DeepEqual(instanceUUIDs(statusAfter.Instances), instanceUUIDs(statusBefore.Instances)) {
		t.Errorf("MIG instances after the upgrade %+v, want %+v", statusAfter.Instances, statusBefore.Instances)
	}
	if got, want := endpointIDs(statusAfter.Endpoints), endpointIDs(statusBefore.Endpoints); !slices.Equal(got, want) {
		t.Errorf("fenced endpoints after the upgrade %v, want %v", got, want)
	}
	dropsAfter := un.drops(ctx, t, cur, pods)
	for tenant, counts := range dropsBefore {
		for reason, n := range counts {
			if dropsAfter[tenant][reason] < n {
				t.Errorf("tenant %s: %s drops %d after the upgrade, were %d: counters lost", tenant, reason, dropsAfter[tenant][reason], n)
			}
		}
	}
	t.Logf("drop counters before %v, after %v", dropsBefore, dropsAfter)

	// A pod of the new release beside the old ones, fenced against them.
	a3 := &upPod{name: "a3", tenant: "agents", handler: node.Handler}
	a3.start(ctx, t, pn, server)
	time.Sleep(300 * time.Millisecond)
	if r := un.reservation(ctx, t, cur, a3.id); r == nil || fileID(t, fmt.Sprintf("/proc/%d/exe", r.ShimPID)) != fileID(t, un.installed(a3.shimName())) {
		t.Errorf("the new pod %s does not run the installed new shim (reservation %+v)", a3.name, r)
	}
	withNew := matrixAcross([]*upPod{a3}, pods)
	if bad := wrongVerdicts(withNew.run(ctx, pn.Node, func() string { return "new pod" })); len(bad) > 0 {
		t.Errorf("the new pod's matrix with the old pods:\n%s", strings.Join(bad, "\n"))
	}
	t.Logf("new pod %s: %d probes with the old pods, as expected", a3.name, len(withNew))

	// The old shims serve through the new agent: a container of an old pod
	// is judged (an allowed one starts, a host path is refused), and an old
	// pod's removal releases everything it held.
	if _, err := startContainer(ctx, pn.Node, a1.id, a1.cfg, "after-upgrade", "exec sleep 3600"); err != nil {
		t.Errorf("a container in old pod a1 after the upgrade: %v", err)
	}
	_, err := createContainer(ctx, pn, a1.id, a1.cfg, "host-root", func(c *cri.ContainerConfig) {
		c.Mounts = append(c.Mounts, &cri.Mount{HostPath: "/", ContainerPath: "/host"})
	})
	if err == nil || !strings.Contains(err.Error(), "workload.host_path") {
		t.Errorf("a host-path container in old pod a1 after the upgrade: %v, want the new agent's refusal naming workload.host_path", err)
	}
	// a2, and with the runc tier the pod holding the MIG slice; without it
	// the research pod stays, the other tenant of the downgrade's matrix.
	removed := []*upPod{a2}
	if withRunc {
		removed = append(removed, gpuPod)
	}
	for _, p := range removed {
		if err := removePod(ctx, pn.Node, p.id); err != nil {
			t.Fatalf("remove old pod %s after the upgrade: %v", p.name, err)
		}
	}
	remaining := []*upPod{a3}
	for _, p := range pods {
		if !slices.Contains(removed, p) {
			remaining = append(remaining, p)
		}
	}
	var running []string
	for _, p := range remaining {
		running = append(running, p.id)
	}
	pn.nodeAgrees(t, running, 0)
	owners := pn.cdiSpecs(t)
	for _, p := range removed {
		if slices.Contains(owners, p.id) {
			t.Errorf("old pod %s's CDI spec left after its removal", p.name)
		}
		if procs := processes(pn.Dir(), p.id); len(procs) > 0 {
			t.Errorf("old pod %s's processes left after its removal: %q", p.name, procs)
		}
	}

	// Downgrade: the previous release's agent on the migrated fence.
	rest := matrixOf(remaining)
	if err := pn.StopAgent(ctx); err != nil {
		t.Fatal(err)
	}
	un.installAgent(t, old)
	err = pn.StartAgent(ctx)
	if err == nil {
		t.Fatal("the previous release's agent started on the migrated fence: downgrade was meant to be refused")
	}
	refusal := matchingLine(err.Error(), regexp.MustCompile(`bulkhead-agent: .*maps pinned in `+regexp.QuoteMeta(un.pinDir)+` are from another Bulkhead version`))
	if refusal == "" {
		t.Errorf("the previous release's agent on the migrated fence: %v\nwant it to say the maps pinned in %s are from another Bulkhead version", err, un.pinDir)
	} else {
		t.Logf("downgrade refused: %s", refusal)
	}
	if pn.AgentPID() != 0 {
		t.Error("the refused agent still runs")
	}
	if bad := wrongVerdicts(rest.run(ctx, pn.Node, func() string { return "downgrade refused" })); len(bad) > 0 {
		t.Errorf("the matrix after the refused downgrade:\n%s", strings.Join(bad, "\n"))
	}
	if _, err := runPod(ctx, pn.Node, podConfig(pn.Node, "while-down", "agents", nil)); err == nil || !strings.Contains(err.Error(), pn.AgentSocket()) {
		t.Errorf("a pod while the refused agent is down: %v, want a refusal naming the agent's socket", err)
	}
	if pins := readPins(t, un.pinDir); !reflect.DeepEqual(pins, pinsAfter) {
		t.Errorf("the refused agent changed the pinned fence: %+v, was %+v", pins, pinsAfter)
	}

	// Forward again: the new agent resumes, with nothing left to migrate.
	un.installAgent(t, cur)
	logFrom = agentLogSize(pn.Node)
	if err := pn.StartAgent(ctx); err != nil {
		t.Fatalf("the new agent after the refused downgrade: %v", err)
	}
	if line := matchingLine(agentLogSince(pn.Node, logFrom), migrated); line != "" {
		t.Errorf("the new agent migrated again after the refused downgrade: %s", line)
	}
	pn.nodeAgrees(t, running, 0)
	for _, p := range remaining {
		if err := removePod(ctx, pn.Node, p.id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}

// release is one release's node binaries: what the DaemonSet installs on
// the host (the shims) and runs (the agent), and its CLI.
type release struct {
	name    string // "previous release" or "this tree"
	commit  string // the previous release's commit; empty for this tree
	version string // its agent's --version
	// bins maps an installed name (containerd-shim-bulkhead-v1,
	// containerd-shim-bulkhead-runc-v1, bulkhead-agent) to the file.
	bins map[string]string
	cli  string
}

// The binaries the node installer puts on a node (the agent in its image).
const (
	gvisorShim = "containerd-shim-bulkhead-v1"
	runcShim   = "containerd-shim-bulkhead-runc-v1"
	agentBin   = "bulkhead-agent"
)

// previousRelease builds the previous release with
// test/scripts/previous-release.sh (cached by commit) and returns its
// binaries. A commit missing from a shallow clone skips the test, naming
// it (the script's exit status 3); any other failure fails it.
func previousRelease(t *testing.T) release {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "scripts", "previous-release.sh")
	cmd := exec.Command("bash", script)
	cmd.Env = os.Environ()
	if os.Getenv("GO") == "" {
		// The go command that built this test, when go is not on PATH.
		if goBin := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(goBin) {
			cmd.Env = append(cmd.Env, "GO="+goBin)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 3 {
		t.Skipf("%s", strings.TrimSpace(tail(stderr.String(), 3)))
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, tail(stderr.String(), 40))
	}
	t.Logf("%s", strings.TrimSpace(tail(stderr.String(), 3)))
	dir := strings.TrimSpace(string(out))
	r := release{
		name:   "previous release",
		commit: filepath.Base(filepath.Dir(dir)), // <TOOLS_DIR>/prev/<commit>/bin
		bins: map[string]string{
			gvisorShim: filepath.Join(dir, gvisorShim),
			runcShim:   filepath.Join(dir, runcShim),
			agentBin:   filepath.Join(dir, "mockgpu", agentBin),
		},
		cli: filepath.Join(dir, "mockgpu", "bulkhead"),
	}
	r.version = agentVersion(t, r.bins[agentBin])
	return r
}

// thisRelease is this tree's binaries (make build): the agent and CLI
// with the GPU mock linked, as the e2e nodes need.
func thisRelease(t *testing.T) release {
	t.Helper()
	r := release{name: "this tree", bins: map[string]string{}}
	var err error
	if r.bins[agentBin], err = node.AgentPath(node.BinDirs()); err != nil {
		t.Skipf("e2e: %v", err)
	}
	for _, shim := range []string{gvisorShim, runcShim} {
		if p, err := node.LookPath(shim); err == nil {
			r.bins[shim] = p
		}
	}
	if r.cli, err = node.LookMockPath("bulkhead"); err != nil {
		t.Skipf("needs the bulkhead CLI (make build): %v", err)
	}
	r.version = agentVersion(t, r.bins[agentBin])
	return r
}

func agentVersion(t *testing.T, agent string) string {
	t.Helper()
	out, err := exec.Command(agent, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", agent, err)
	}
	return strings.TrimSpace(string(out))
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// upgradeNode is a pipeline node whose shims and agent are run from one
// directory, as a real node runs them from /usr/local/bin (the shims) and
// the agent container's image: an upgrade replaces the files there.
type upgradeNode struct {
	*pipelineNode
	bin string // the installed binaries
}

// startUpgradeNode starts a pipeline node (the e2e tenants, one mock H200,
// the fence) running rel's shims and agent.
func startUpgradeNode(t *testing.T, rel release) *upgradeNode {
	t.Helper()
	bundle := regoBundle(t)
	dir, err := os.MkdirTemp("", "bh-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	seq := nodeSeq.Load() + 1 // the number startNode gives it
	un := &upgradeNode{
		pipelineNode: &pipelineNode{
			pinDir:   fmt.Sprintf("/sys/fs/bpf/bh-e2e-%d-%d", os.Getpid(), seq),
			mockPath: filepath.Join(dir, "mock-gpus.json"),
			cdiDir:   filepath.Join(dir, "cdi"),
		},
		bin: filepath.Join(dir, "installed"),
	}
	un.install(t, rel)
	subnet := nodeSubnet(seq)
	extra, err := node.Pipeline{Bundle: bundle, TenantsJSON: e2eTenants, MockModel: "h200", MockGPUs: 1, PinDir: un.pinDir,
		Signed: true, BinDirs: node.BinDirs()}.ShimConfig(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(un.pinDir) })
	// The installed directory first: the node registers its shims (the
	// runc tier's too, found there) and runs its agent.
	un.Node = startNode(t, node.Options{
		Dir: dir, BinDir: []string{un.bin}, Subnet: subnet,
		Shim: un.installed(gvisorShim), Agent: un.installed(agentBin),
		PipelineEnabled: true, ShimConfig: extra,
	})
	return un
}

func (un *upgradeNode) installed(name string) string { return filepath.Join(un.bin, name) }

// install puts rel's shims and agent in place as deploy/node/install.sh
// puts a file: copied beside, then renamed over the old one, so that a
// running shim keeps its binary and a starting one reads a whole file.
func (un *upgradeNode) install(t *testing.T, rel release) {
	t.Helper()
	for _, name := range []string{gvisorShim, runcShim, agentBin} {
		if src, ok := rel.bins[name]; ok {
			un.put(t, src, name)
		}
	}
}

// installAgent puts only rel's agent in place: a DaemonSet rolled back to
// an image whose installer leaves the host's shims alone.
func (un *upgradeNode) installAgent(t *testing.T, rel release) {
	t.Helper()
	un.put(t, rel.bins[agentBin], agentBin)
}

func (un *upgradeNode) put(t *testing.T, src, name string) {
	t.Helper()
	if err := os.MkdirAll(un.bin, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := un.installed(name)
	tmp := fmt.Sprintf("%s.bulkhead-tmp.%d", dst, os.Getpid())
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// nodeReport is the part of `bulkhead node status --json` the upgrade
// compares.
type nodeReport struct {
	Agent     *bhnode.AgentStatus   `json:"agent"`
	Sandboxes []*bhnode.Reservation `json:"sandboxes"`
	Endpoints []netpol.EndpointInfo `json:"endpoints"`
	Instances []bhnode.MIGInstance  `json:"mig_instances"`
}

// status is the node as rel's CLI reports it (from the running agent).
func (un *upgradeNode) status(ctx context.Context, t *testing.T, rel release) nodeReport {
	t.Helper()
	out, err := exec.CommandContext(ctx, rel.cli, "node", "status", "--json", "--config", un.ShimConf).Output()
	if err != nil {
		t.Fatalf("%s: bulkhead node status: %v", rel.name, errWithStderr(err))
	}
	var r nodeReport
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%s: bulkhead node status: %v\n%s", rel.name, err, out)
	}
	return r
}

// reservation is the sandbox's reservation as rel's CLI reports it.
func (un *upgradeNode) reservation(ctx context.Context, t *testing.T, rel release, id string) *bhnode.Reservation {
	t.Helper()
	for _, r := range un.status(ctx, t, rel).Sandboxes {
		if r.SandboxID == id {
			return r
		}
	}
	return nil
}

// drops is the drop counters by reason of the pods' tenants, as rel's CLI
// reads them from the pinned fence (which names only tenants it fenced).
func (un *upgradeNode) drops(ctx context.Context, t *testing.T, rel release, pods []*upPod) map[string]map[string]uint64 {
	t.Helper()
	all := map[string]map[string]uint64{}
	for _, p := range pods {
		tenant := p.tenant
		if all[tenant] != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, rel.cli, "netpol", "-pin-dir", un.pinDir, "stats", tenant).Output()
		if err != nil {
			t.Fatalf("%s: bulkhead netpol stats %s: %v", rel.name, tenant, errWithStderr(err))
		}
		var s struct {
			Drops map[string]uint64 `json:"drops"`
		}
		if err := json.Unmarshal(out, &s); err != nil {
			t.Fatalf("%s: bulkhead netpol stats %s: %v\n%s", rel.name, tenant, err, out)
		}
		all[tenant] = s.Drops
	}
	return all
}

func errWithStderr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(ee.Stderr))
	}
	return err
}

// kept is what an upgrade must keep of a reservation: its charge, its
// placement on the GPUs, its fence registration and the shim serving it.
type kept struct {
	Tenant, State string
	MemoryBytes   int64
	GPU           *mig.Placement
	Instance      *mig.Instance
	Endpoint      *bhnode.FenceRecord
	ShimPID       int
}

// keptOf is r's kept part; the zero kept for no reservation.
func keptOf(r *bhnode.Reservation) kept {
	if r == nil {
		return kept{}
	}
	return kept{Tenant: r.Tenant, State: r.State, MemoryBytes: r.MemoryBytes, GPU: r.GPU, Instance: r.Instance, Endpoint: r.Endpoint, ShimPID: r.ShimPID}
}

func (k kept) String() string {
	b, _ := json.Marshal(k)
	return string(b)
}

func instanceUUIDs(insts []bhnode.MIGInstance) []string {
	var out []string
	for _, i := range insts {
		out = append(out, i.Sandbox+"="+i.UUID)
	}
	sort.Strings(out)
	return out
}

func endpointIDs(eps []netpol.EndpointInfo) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.SandboxID)
	}
	sort.Strings(out)
	return out
}

// fileKey names a file by its inode: a renamed-over binary keeps its own.
type fileKey struct{ dev, ino uint64 }

// fileID is path's inode; /proc/PID/exe gives the binary a process runs,
// even when its path was renamed over.
func fileID(t *testing.T, path string) fileKey {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	return fileKey{dev: uint64(sys.Dev), ino: sys.Ino}
}

// pinnedMap is one map pinned in the fence's directory.
type pinnedMap struct {
	id      ebpf.MapID
	keySize uint32
}

// pins is the fence's pinned maps and its layout (0: no layout map).
type pins struct {
	maps   map[string]pinnedMap
	layout uint32
}

// readPins reads the pinned maps read-only with the kernel's own view:
// neither release's netpol package, so that reading cannot migrate.
func readPins(t *testing.T, pinDir string) pins {
	t.Helper()
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	p := pins{maps: map[string]pinnedMap{}}
	for _, e := range entries {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue // a program
		}
		info, err := m.Info()
		if err != nil {
			m.Close()
			t.Fatalf("map %s: %v", e.Name(), err)
		}
		id, _ := info.ID()
		p.maps[e.Name()] = pinnedMap{id: id, keySize: m.KeySize()}
		if e.Name() == "layout" {
			if err := m.Lookup(uint32(0), &p.layout); err != nil {
				t.Errorf("layout map: %v", err)
			}
		}
		m.Close()
	}
	return p
}

func matchingLine(s string, re *regexp.Regexp) string {
	for _, l := range strings.Split(s, "\n") {
		if re.MatchString(l) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// upPod is a pod of the upgrade test, running netprobe's servers.
type upPod struct {
	name, tenant, handler string
	annotations           map[string]string
	cfg                   *cri.PodSandboxConfig
	id, ctr, ip           string
	shimPID               int
}

func (p *upPod) shimName() string {
	if p.handler == node.RuncHandler {
		return runcShim
	}
	return gvisorShim
}

func (p *upPod) start(ctx context.Context, t *testing.T, pn *pipelineNode, script string) {
	t.Helper()
	p.cfg = podConfig(pn.Node, p.name, p.tenant, p.annotations)
	var err error
	if p.id, err = runPodOn(ctx, pn.Node, p.handler, p.cfg); err != nil {
		t.Fatalf("pod %s/%s on %s: %v", p.tenant, p.name, p.handler, err)
	}
	if p.ctr, err = startContainer(ctx, pn.Node, p.id, p.cfg, "main", script); err != nil {
		t.Fatal(err)
	}
	if p.ip, err = podIP(ctx, pn.Node, p.id); err != nil {
		t.Fatal(err)
	}
}

// probe is one entry of the traffic matrix: a connection from one pod's
// container to another's server, which passes exactly within a tenant.
type probe struct {
	from, to *upPod
	mode     string // tcp (port 8080) or udp (9090)
}

func (p probe) String() string { return fmt.Sprintf("%s %s -> %s", p.mode, p.from.name, p.to.name) }

func (p probe) want() bool { return p.from.tenant == p.to.tenant }

// matrix is a set of probes, run all at once.
type matrix []probe

// matrixOf is every ordered pair of pods, over TCP and UDP.
func matrixOf(pods []*upPod) matrix { return matrixAcross(pods, pods) }

// matrixAcross is every probe between a pod of a and a pod of b, both ways.
func matrixAcross(a, b []*upPod) matrix {
	var m matrix
	seen := map[string]bool{}
	for _, x := range a {
		for _, y := range b {
			if x == y {
				continue
			}
			for _, pair := range [][2]*upPod{{x, y}, {y, x}} {
				for _, mode := range []string{"tcp", "udp"} {
					pr := probe{pair[0], pair[1], mode}
					if !seen[pr.String()] {
						seen[pr.String()] = true
						m = append(m, pr)
					}
				}
			}
		}
	}
	return m
}

func (m matrix) String() string {
	var pass, drop int
	for _, p := range m {
		if p.want() {
			pass++
		} else {
			drop++
		}
	}
	return fmt.Sprintf("%d within a tenant pass, %d across tenants drop", pass, drop)
}

// verdict is one probe's outcome and the phases it started and ended in.
type verdict struct {
	probe
	passed     bool
	err        error // the exec itself failed
	start, end string
}

// phase is where the verdict ran: one phase, or the two it spanned.
func (v verdict) phase() string {
	if v.start == v.end {
		return v.start
	}
	return v.start + " .. " + v.end
}

// run runs every probe at once; phase names where the node stands.
func (m matrix) run(ctx context.Context, n *node.Node, phase func() string) []verdict {
	out := make([]verdict, len(m))
	var wg sync.WaitGroup
	for i, p := range m {
		wg.Go(func() {
			v := verdict{probe: p, start: phase()}
			target := p.to.ip + ":8080"
			if p.mode == "udp" {
				target = p.to.ip + ":9090"
			}
			resp, err := n.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: p.from.ctr, Cmd: []string{"netprobe", p.mode, target}, Timeout: 30})
			v.err = err
			v.passed = err == nil && resp.ExitCode == 0
			v.end = phase()
			out[i] = v
		})
	}
	wg.Wait()
	return out
}

// wrongVerdicts describes every verdict other than the matrix's rule.
func wrongVerdicts(vs []verdict) []string {
	var bad []string
	for _, v := range vs {
		switch {
		case v.err != nil:
			bad = append(bad, fmt.Sprintf("%s (%s): exec failed: %v", v.probe, v.phase(), v.err))
		case v.passed != v.want():
			bad = append(bad, fmt.Sprintf("%s (%s): passed=%v, want %v", v.probe, v.phase(), v.passed, v.want()))
		}
	}
	return bad
}

func countIn(vs []verdict, phase string) int {
	n := 0
	for _, v := range vs {
		if v.start == phase && v.end == phase {
			n++
		}
	}
	return n
}

// phaseCounts says how many probes ran in each phase, in the order seen.
func phaseCounts(vs []verdict) string {
	var order []string
	counts := map[string]int{}
	for _, v := range vs {
		if counts[v.phase()] == 0 {
			order = append(order, v.phase())
		}
		counts[v.phase()]++
	}
	var parts []string
	for _, ph := range order {
		parts = append(parts, fmt.Sprintf("%s: %d", ph, counts[ph]))
	}
	return strings.Join(parts, ", ")
}

// prober runs the matrix round after round until stopped, recording each
// probe with the phase the node was in when it started and ended.
type prober struct {
	phase atomic.Value // string
	mu    sync.Mutex
	// verdicts and rounds (per phase: rounds whose every probe ran within
	// it) are guarded by mu.
	verdicts []verdict
	rounds   map[string]int
	cancel   context.CancelFunc
	done     chan struct{}
}

func startProber(ctx context.Context, n *node.Node, m matrix, phase string) *prober {
	ctx, cancel := context.WithCancel(ctx)
	pr := &prober{rounds: map[string]int{}, cancel: cancel, done: make(chan struct{})}
	pr.phase.Store(phase)
	current := func() string { return pr.phase.Load().(string) }
	go func() {
		defer close(pr.done)
		for ctx.Err() == nil {
			vs := m.run(ctx, n, current)
			if ctx.Err() != nil {
				return // probes cut short by stop, not by the fence
			}
			pr.mu.Lock()
			pr.verdicts = append(pr.verdicts, vs...)
			if in := vs[0].start; countIn(vs, in) == len(vs) {
				pr.rounds[in]++
			}
			pr.mu.Unlock()
		}
	}()
	return pr
}

// enter records that the node is now in phase.
func (pr *prober) enter(phase string) { pr.phase.Store(phase) }

// waitRound waits until a whole round has run within phase.
func (pr *prober) waitRound(ctx context.Context, phase string) error {
	for {
		pr.mu.Lock()
		n := pr.rounds[phase]
		pr.mu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no whole round of the matrix ran while %s: %w", phase, ctx.Err())
		case <-pr.done:
			return fmt.Errorf("the prober stopped before a whole round ran while %s", phase)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends the prober and returns every verdict of its whole rounds.
func (pr *prober) stop() []verdict {
	pr.cancel()
	<-pr.done
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.verdicts
}
