package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	bhruntime "github.com/bulkhead-runtime/bulkhead/runtime"
	bhnode "github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// pipelineNode is a node with the full pipeline: the default policy bundle
// with two tenants, a mock H200 for MIG, and the eBPF fence.
type pipelineNode struct {
	*node.Node
	pinDir   string
	failFile string
	mockPath string
	cdiDir   string // the node's mig.cdi_spec_dir (test/node sets it)
}

const e2eTenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"],   "egress_cidrs": ["10.96.0.0/12"], "quota": {"sandboxes": 5, "gpu_slices": 6, "memory": "64Gi"}},
  "research": {"tier": "standard",  "namespaces": ["research"], "quota": {"sandboxes": 50, "gpu_slices": 28, "memory": "512Gi"}},
  "platform": {"tier": "trusted",   "namespaces": ["platform"]}
}}}`

func startPipelineNode(t *testing.T) *pipelineNode { return startPipelineNodeB(t) }

func startPipelineNodeB(t testing.TB) *pipelineNode { return startPipelineNodeWith(t, false) }

// startPipelineNodeWith starts the pipeline node; with dualStack its bridge
// also has an IPv6 ULA range, so every pod gets one address of each family
// and both ranges are cluster CIDRs of the fence.
func startPipelineNodeWith(t testing.TB, dualStack bool) *pipelineNode {
	t.Helper()
	return startPipelineNodeTenants(t, dualStack, e2eTenants)
}

// startPipelineNodeTenants is startPipelineNodeWith with the policy data
// tenantsJSON signed into the bundle instead of e2eTenants.
func startPipelineNodeTenants(t testing.TB, dualStack bool, tenantsJSON string) *pipelineNode {
	t.Helper()
	if err := node.Requirements(node.BinDirs()); err != nil {
		t.Skipf("e2e: %v", err)
	}
	agent, err := node.FailpointAgent()
	if err != nil {
		t.Skipf("e2e: %v", err)
	}
	bundle := regoBundle(t)
	dir, err := os.MkdirTemp("", "bh-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	seq := nodeSeq.Load() + 1
	pn := &pipelineNode{
		pinDir:   fmt.Sprintf("/sys/fs/bpf/bh-e2e-%d-%d", os.Getpid(), seq),
		failFile: filepath.Join(dir, "fail-at"),
		mockPath: filepath.Join(dir, "mock-gpus.json"),
		cdiDir:   filepath.Join(dir, "cdi"),
	}
	if err := os.WriteFile(pn.failFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	subnet := nodeSubnet(seq)
	var subnet6 string
	if dualStack {
		subnet6 = fmt.Sprintf("fd%02x:%x:%x::/64", 0xb0+int(seq)%16, os.Getpid()%0xffff, seq)
	}
	extra, err := node.Pipeline{Bundle: bundle, TenantsJSON: tenantsJSON, MockModel: "h200", MockGPUs: 1, PinDir: pn.pinDir,
		Signed: true, BinDirs: node.BinDirs(), Subnet6: subnet6}.ShimConfig(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first so it runs last, after the node (and every shim that
	// could still open the fence) is gone.
	t.Cleanup(func() { _ = os.RemoveAll(pn.pinDir) })
	pn.Node = startNode(t, node.Options{
		Dir: dir, Subnet: subnet, Subnet6: subnet6, PipelineEnabled: true, ShimConfig: extra, Agent: agent,
		Env: []string{bhruntime.FailAtEnv + "=@" + pn.failFile},
	})
	return pn
}

func (pn *pipelineNode) ledger(t testing.TB) []*bhnode.Reservation {
	t.Helper()
	l, err := bhnode.OpenLedger(filepath.Join(pn.Dir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*bhnode.Reservation
	if err := l.View(func(tx *bhnode.LedgerTx) error {
		var err error
		out, err = tx.List()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func (pn *pipelineNode) fence(t *testing.T) *netpol.Manager {
	t.Helper()
	m, err := netpol.Open(context.Background(), netpol.Options{PinDir: pn.pinDir, LockPath: filepath.Join(pn.Dir(), "netpol.lock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func (pn *pipelineNode) migInstances(t *testing.T) []mig.Instance {
	t.Helper()
	mn, err := mocknode.Open(pn.mockPath, "h200", 1, mocknode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := nvmlbackend.New(mn.Interface(), nvmlbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	insts, err := b.Instances()
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// assertNodeClean checks that the ledger, the fence and the mock GPUs hold
// nothing, besides what assertNothingLeft checks.
func (pn *pipelineNode) assertNodeClean(t *testing.T) {
	t.Helper()
	assertNothingLeft(t, pn.Node)
	if res := pn.ledger(t); len(res) != 0 {
		t.Errorf("ledger still holds %d reservations: %+v", len(res), res[0])
	}
	eps, err := pn.fence(t).Endpoints()
	if err != nil || len(eps) != 0 {
		t.Errorf("fence still holds endpoints %+v (%v)", eps, err)
	}
	if insts := pn.migInstances(t); len(insts) != 0 {
		t.Errorf("MIG instances left: %+v", insts)
	}
	if owners := pn.cdiSpecs(t); len(owners) != 0 {
		t.Errorf("CDI specs left for sandboxes %v", owners)
	}
}

// cdiSpecs lists the sandboxes that have a CDI spec on the node.
func (pn *pipelineNode) cdiSpecs(t *testing.T) []string {
	t.Helper()
	owners, err := inject.CDISpecOwners(pn.cdiDir, inject.CDIKind)
	if err != nil {
		t.Fatal(err)
	}
	return owners
}

func TestPipelineFencesTenantsAndReleasesEverything(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// Refusals reach the CRI caller with the tenant, the rule and why.
	refusals := []struct {
		name, ns    string
		annotations map[string]string
		want        []string
	}{
		{"stranger", "nobody", nil, []string{"refused", "nobody/stranger"}},
		{"agent-mig", "agents", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}, []string{"refused", "tenant agents", "gpu."}},
		{"agent-bad", "agents", map[string]string{policy.AnnotationRDMA: "maybe"}, []string{"refused", "bulkhead.dev/rdma"}},
	}
	for _, r := range refusals {
		_, err := runPod(ctx, pn.Node, podConfig(pn.Node, r.name, r.ns, r.annotations))
		if err == nil {
			t.Errorf("pod %s/%s: want a refusal", r.ns, r.name)
			continue
		}
		for _, w := range r.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("pod %s/%s: refusal %q lacks %q", r.ns, r.name, err, w)
			}
		}
		t.Logf("refused as expected: %v", err)
	}

	type pod struct{ id, ctr, ip, tenant string }
	run := func(name, ns string, ann map[string]string, script string) pod {
		cfg := podConfig(pn.Node, name, ns, ann)
		id, err := runPod(ctx, pn.Node, cfg)
		if err != nil {
			t.Fatalf("pod %s/%s: %v", ns, name, err)
		}
		c, err := startContainer(ctx, pn.Node, id, cfg, "main", script)
		if err != nil {
			t.Fatal(err)
		}
		ip, err := podIP(ctx, pn.Node, id)
		if err != nil {
			t.Fatal(err)
		}
		return pod{id, c, ip, ns}
	}
	server := "exec netprobe serve tcp:8080 udp:9090 udp:4791"
	a1 := run("a1", "agents", nil, server)
	a2 := run("a2", "agents", nil, "exec sleep 3600")
	r1 := run("r1", "research", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}, server)
	if _, err := execSync(ctx, pn.Node, a2.ctr, "test", "-x", "/bin/netprobe"); err != nil {
		t.Fatalf("the workload image lacks netprobe (make build): %v", err)
	}

	// The research pod asked for a MIG slice; gVisor cannot use one, and its
	// tier's policy answers with a whole GPU.
	res := pn.ledger(t)
	if len(res) != 3 {
		t.Fatalf("ledger: want 3 reservations, got %d", len(res))
	}
	for _, r := range res {
		if r.State != bhnode.StateActive || r.Endpoint == nil {
			t.Errorf("reservation %s: state %s endpoint %v", r.SandboxID[:12], r.State, r.Endpoint)
		}
		if r.SandboxID == r1.id && (r.GPU == nil || !r.GPU.Whole()) {
			t.Errorf("research pod: GPU placement %+v, want a whole GPU", r.GPU)
		}
	}

	probe := func(from pod, mode, target string) bool {
		_, err := execSync(ctx, pn.Node, from.ctr, "netprobe", mode, target)
		return err == nil
	}
	drops := func(tenant string) map[netpol.Reason]uint64 {
		st, err := pn.fence(t).Stats(tenant)
		if err != nil {
			t.Fatal(err)
		}
		return st.Drops
	}
	time.Sleep(300 * time.Millisecond) // servers listening
	// Same tenant: TCP, UDP and ICMP pass.
	for _, c := range []struct{ mode, target string }{{"tcp", a1.ip + ":8080"}, {"udp", a1.ip + ":9090"}, {"icmp", a1.ip}} {
		if !probe(a2, c.mode, c.target) {
			t.Errorf("same tenant %s a2 -> a1 failed", c.mode)
		}
	}
	// RoCEv2 needs the RDMA grant, which the untrusted tier never has.
	before := drops("agents")[netpol.ReasonRDMA]
	if probe(a2, "udp", a1.ip+":4791") {
		t.Errorf("RoCEv2 between untrusted pods passed")
	}
	if after := drops("agents")[netpol.ReasonRDMA]; after <= before {
		t.Errorf("agents rdma drops did not grow (%d -> %d)", before, after)
	}
	// Across tenants nothing passes, in either direction.
	before = drops("research")[netpol.ReasonTenant]
	for _, c := range []struct {
		from, to pod
		mode     string
		port     string
	}{
		{r1, a1, "tcp", ":8080"}, {r1, a1, "udp", ":9090"}, {r1, a1, "icmp", ""}, {r1, a1, "udp", ":4791"},
		{a2, r1, "tcp", ":8080"}, {a2, r1, "udp", ":9090"}, {a2, r1, "icmp", ""},
	} {
		if probe(c.from, c.mode, c.to.ip+c.port) {
			t.Errorf("cross tenant %s %s -> %s%s passed", c.mode, c.from.tenant, c.to.tenant, c.port)
		}
	}
	if after := drops("research")[netpol.ReasonTenant]; after <= before {
		t.Errorf("research tenant drops did not grow (%d -> %d)", before, after)
	}
	t.Logf("drop counters: research %v, agents %v", drops("research"), drops("agents"))

	for _, p := range []pod{a1, a2, r1} {
		if err := removePod(ctx, pn.Node, p.id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}

func TestQuotaHoldsUnderConcurrentStarts(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const attempts = 20
	var mu sync.Mutex
	var ok []string
	var refused []error
	var wg sync.WaitGroup
	for i := range attempts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := runPod(ctx, pn.Node, podConfig(pn.Node, fmt.Sprintf("q%02d", i), "agents", nil))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused = append(refused, err)
				return
			}
			ok = append(ok, id)
		}()
	}
	wg.Wait()
	if len(ok) != 5 {
		t.Errorf("quota 5: %d pods started, %d refused", len(ok), len(refused))
	}
	for _, err := range refused {
		if !strings.Contains(err.Error(), "quota.sandboxes") {
			t.Errorf("refusal without the quota reason: %v", err)
		}
	}
	var ledgerIDs []string
	for _, r := range pn.ledger(t) {
		ledgerIDs = append(ledgerIDs, r.SandboxID)
	}
	sort.Strings(ok)
	if strings.Join(ledgerIDs, ",") != strings.Join(ok, ",") {
		t.Errorf("ledger %v does not match running pods %v", ledgerIDs, ok)
	}
	for _, id := range ok {
		if err := removePod(ctx, pn.Node, id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}

func TestFailureAtEveryPipelineStepLeavesNothing(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i, step := range bhruntime.Steps {
		if err := os.WriteFile(pn.failFile, []byte(step), 0o644); err != nil {
			t.Fatal(err)
		}
		// The research pod asks for a GPU, so every step has work to undo.
		cfg := podConfig(pn.Node, fmt.Sprintf("fail-%d", i), "research", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
		_, err := runPod(ctx, pn.Node, cfg)
		if err == nil || !strings.Contains(err.Error(), "injected failure") {
			t.Fatalf("step %s: RunPodSandbox = %v, want the injected failure", step, err)
		}
		pn.assertNodeClean(t)
		if t.Failed() {
			t.Fatalf("step %s left something behind", step)
		}
	}
	if err := os.WriteFile(pn.failFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// And the node still works.
	cfg := podConfig(pn.Node, "after", "research", nil)
	id, err := runPod(ctx, pn.Node, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := removePod(ctx, pn.Node, id); err != nil {
		t.Fatal(err)
	}
	pn.assertNodeClean(t)
}

// bulkheadCLI finds the bulkhead binary built by `make build` with the
// GPU mock linked (bin/mockgpu): the e2e nodes' mig.backend is "mock".
func bulkheadCLI(t *testing.T) string {
	p, err := node.LookMockPath("bulkhead")
	if err != nil {
		t.Skipf("needs the bulkhead CLI (make build): %v", err)
	}
	return p
}

func TestShimKilledMidCreateThenContainerdRestartAndGC(t *testing.T) {
	pn := startPipelineNode(t)
	cli := bulkheadCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A survivor holding a GPU, a fence entry and quota.
	survivorCfg := podConfig(pn.Node, "survivor", "research", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
	survivor, err := runPod(ctx, pn.Node, survivorCfg)
	if err != nil {
		t.Fatal(err)
	}
	survivorCtr, err := startContainer(ctx, pn.Node, survivor, survivorCfg, "main", "exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}

	// The victim's shim stands still after its fence entry is registered
	// and before the reservation is marked active.
	if err := os.WriteFile(pn.failFile, []byte("hang:"+bhruntime.StepActive), 0o644); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := runPod(ctx, pn.Node, podConfig(pn.Node, "victim", "agents", nil))
		errc <- err
	}()
	var victim *bhnode.Reservation
	deadline := time.Now().Add(90 * time.Second)
	for victim == nil {
		for _, r := range pn.ledger(t) {
			if r.SandboxID != survivor && r.Endpoint != nil {
				victim = r
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the victim never reached the fence step")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := syscall.Kill(victim.ShimPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 shim %d: %v", victim.ShimPID, err)
	}
	if err := <-errc; err == nil {
		t.Fatal("RunPodSandbox of the victim succeeded after its shim was killed")
	}
	if err := os.WriteFile(pn.failFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pn.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, cli, "node", "gc", "--config", pn.ShimConf).CombinedOutput()
	if err != nil {
		t.Fatalf("bulkhead node gc: %v\n%s", err, out)
	}
	t.Logf("bulkhead node gc: %s", out)
	// GC is idempotent: a second pass finds nothing.
	out, err = exec.CommandContext(ctx, cli, "node", "gc", "--config", pn.ShimConf).CombinedOutput()
	if err != nil || strings.Contains(string(out), victim.SandboxID) {
		t.Errorf("second gc: %v\n%s", err, out)
	}

	// Ledger, fence, state and processes agree with the pods that exist.
	res := pn.ledger(t)
	if len(res) != 1 || res[0].SandboxID != survivor || res[0].State != bhnode.StateActive {
		t.Errorf("ledger after gc: %+v", res)
	}
	eps, err := pn.fence(t).Endpoints()
	if err != nil || len(eps) != 1 || eps[0].SandboxID != survivor {
		t.Errorf("fence after gc: %+v (%v)", eps, err)
	}
	if ids := dirEntries(filepath.Join(pn.StateDir, "sandboxes")); len(ids) != 1 || ids[0] != survivor {
		t.Errorf("state dir after gc: %v", ids)
	}
	if p := processes(pn.Dir(), victim.SandboxID); len(p) > 0 {
		t.Errorf("victim processes left: %q", p)
	}
	if insts := pn.migInstances(t); len(insts) != 0 {
		t.Errorf("MIG instances after gc: %+v", insts)
	}
	// The survivor still works through the restarted containerd.
	if _, err := execSync(ctx, pn.Node, survivorCtr, "true"); err != nil {
		t.Errorf("survivor exec after restart: %v", err)
	}
	if err := removePod(ctx, pn.Node, survivor); err != nil {
		t.Fatal(err)
	}
	pn.assertNodeClean(t)
}
