package cluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The cases of issue 26 that span the two nodes, run by TestCluster on its
// cluster in this order: the traffic matrix leaves its pods for the API
// server outage.

// matrixPods are the traffic matrix's pods: two tenants, each with a pod on
// each node.
var matrixPods = []struct{ name, ns, node string }{
	{"xa", "agents", NodeA}, {"xb", "agents", NodeB},
	{"ya", "analytics", NodeA}, {"yb", "analytics", NodeB},
}

// peer is something a probe is sent to: a pod or a Service, by name, with
// its addresses of each family.
type peer struct {
	name, ns string
	v4, v6   netip.Addr
}

func (p peer) addr(v6 bool) netip.Addr {
	if v6 {
		return p.v6
	}
	return p.v4
}

// probeCase is one probe of the matrix and its expected outcome.
type probeCase struct {
	from, to string
	mode     string // tcp, udp, roce
	v6       bool
	pass     bool
}

func (pc probeCase) String() string {
	fam := "IPv4"
	if pc.v6 {
		fam = "IPv6"
	}
	return fmt.Sprintf("%s -> %s %s %s", pc.from, pc.to, pc.mode, fam)
}

// netprobeArgs are the arguments that probe addr in mode.
func netprobeArgs(mode string, addr netip.Addr) []string {
	switch mode {
	case "tcp":
		return []string{"netprobe", "tcp", netip.AddrPortFrom(addr, 8080).String()}
	case "udp":
		return []string{"netprobe", "udp", netip.AddrPortFrom(addr, 9090).String()}
	default: // roce: RoCEv2's UDP port
		return []string{"netprobe", "udp", netip.AddrPortFrom(addr, 4791).String()}
	}
}

// probeVerdict reads a probe's outcome from its output: true when the
// answer came back, false when netprobe says none did, an error when the
// probe itself could not run.
func probeVerdict(out string, err error) (bool, error) {
	switch {
	case err == nil && strings.Contains(out, "pong"):
		return true, nil
	case strings.Contains(out, "netprobe:"):
		return false, nil
	default:
		return false, fmt.Errorf("probe did not run: %v: %s", err, out)
	}
}

// kubectlProbe runs one probe with kubectl exec in pod from.
func kubectlProbe(ctx context.Context, c *Cluster, from peer, mode string, addr netip.Addr) (bool, error) {
	args := append([]string{"-n", from.ns, "exec", from.name, "--"}, netprobeArgs(mode, addr)...)
	out, err := c.Kubectl(ctx, args...)
	return probeVerdict(out, err)
}

// podAddrs reads a pod's or a Service's addresses of each family with a
// jsonpath over kubectl get.
func getAddrs(ctx context.Context, c *Cluster, kind, ns, name, path string) (peer, error) {
	out, err := c.Kubectl(ctx, "-n", ns, "get", kind, name, "-o", "jsonpath="+path)
	if err != nil {
		return peer{}, fmt.Errorf("%s %s/%s: %v: %s", kind, ns, name, err, out)
	}
	p := peer{name: name, ns: ns}
	for _, f := range strings.Fields(out) {
		if a, err := netip.ParseAddr(f); err == nil && a.Is4() {
			p.v4 = a
		} else if err == nil && a.Is6() {
			p.v6 = a
		}
	}
	if !p.v4.IsValid() || !p.v6.IsValid() {
		return p, fmt.Errorf("%s %s/%s has addresses %q, want one of each family", kind, ns, name, out)
	}
	return p, nil
}

// testTrafficMatrix proves the fence across the nodes through kubectl:
// TCP, UDP and RoCEv2 (UDP 4791), IPv4 and IPv6, between pods of one tenant
// and of two, each direction, directly and through a ClusterIP Service.
func testTrafficMatrix(ctx context.Context, t *testing.T, c *Cluster) {
	for _, p := range matrixPods {
		if out, err := c.KubectlStdin(ctx, ProbePod(p.name, p.ns, p.node), "apply", "-f", "-"); err != nil {
			t.Fatalf("pod %s/%s: %v: %s", p.ns, p.name, err, out)
		}
	}
	for _, s := range [][3]string{{"xb-svc", "agents", "xb"}, {"yb-svc", "analytics", "yb"}} {
		if out, err := c.KubectlStdin(ctx, ProbeService(s[0], s[1], s[2]), "apply", "-f", "-"); err != nil {
			t.Fatalf("service %s/%s: %v: %s", s[1], s[0], err, out)
		}
	}
	peers := map[string]peer{}
	for _, p := range matrixPods {
		if out, err := c.Kubectl(ctx, "-n", p.ns, "wait", "--for=condition=Ready", "pod/"+p.name, "--timeout=180s"); err != nil {
			d, _ := c.Kubectl(ctx, "-n", p.ns, "describe", "pod", p.name)
			t.Fatalf("pod %s/%s not Ready: %v: %s\n%s", p.ns, p.name, err, out, d)
		}
		on, _ := c.Kubectl(ctx, "-n", p.ns, "get", "pod", p.name, "-o", "jsonpath={.spec.nodeName}")
		if on != p.node {
			t.Fatalf("pod %s/%s runs on %q, want %s", p.ns, p.name, on, p.node)
		}
		a, err := getAddrs(ctx, c, "pod", p.ns, p.name, "{.status.podIPs[*].ip}")
		if err != nil {
			t.Fatal(err)
		}
		peers[p.name] = a
	}
	for _, s := range [][2]string{{"xb-svc", "agents"}, {"yb-svc", "analytics"}} {
		a, err := getAddrs(ctx, c, "service", s[1], s[0], "{.spec.clusterIPs[*]}")
		if err != nil {
			t.Fatal(err)
		}
		peers[s[0]] = a
	}
	var table strings.Builder
	for _, name := range slices.Sorted(maps.Keys(peers)) {
		p := peers[name]
		fmt.Fprintf(&table, "  %-7s %-9s %-15s %s\n", name, p.ns, p.v4, p.v6)
	}
	t.Logf("pods (xa, ya on %s; xb, yb on %s) and Services:\n%s", NodeA, NodeB, table.String())

	var cases []probeCase
	for _, v6 := range []bool{false, true} {
		// One tenant across the nodes, both ways: TCP and UDP pass;
		// RoCEv2 drops, as on one node, for a tier without the RDMA grant.
		for _, pair := range [][2]string{{"xa", "xb"}, {"xb", "xa"}, {"ya", "yb"}, {"yb", "ya"}} {
			for _, mode := range []string{"tcp", "udp", "roce"} {
				cases = append(cases, probeCase{pair[0], pair[1], mode, v6, mode != "roce"})
			}
		}
		// Two tenants across the nodes, both ways: everything drops.
		for _, pair := range [][2]string{{"xa", "yb"}, {"yb", "xa"}, {"ya", "xb"}, {"xb", "ya"}} {
			for _, mode := range []string{"tcp", "udp", "roce"} {
				cases = append(cases, probeCase{pair[0], pair[1], mode, v6, false})
			}
		}
		// Through a ClusterIP: the tenant's own Service passes from the
		// other node; another tenant's drops, from either node.
		for _, mode := range []string{"tcp", "udp"} {
			cases = append(cases,
				probeCase{"xa", "xb-svc", mode, v6, true},
				probeCase{"ya", "yb-svc", mode, v6, true},
				probeCase{"ya", "xb-svc", mode, v6, false},
				probeCase{"yb", "xb-svc", mode, v6, false},
				probeCase{"xa", "yb-svc", mode, v6, false})
		}
	}
	// Passing cases first, retried: the other node's agent learns a pod
	// within a second of the API server, kube-proxy a Service likewise.
	// Then every dropping case once, concurrently (each waits out
	// netprobe's 2 s).
	var mu sync.Mutex
	results := map[string]string{}
	record := func(pc probeCase, got string) {
		mu.Lock()
		results[pc.String()] = got
		mu.Unlock()
	}
	run := func(pc probeCase) (bool, error) {
		return kubectlProbe(ctx, c, peers[pc.from], pc.mode, peers[pc.to].addr(pc.v6))
	}
	probeAll := func(pass bool) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 6)
		for _, pc := range cases {
			if pc.pass != pass {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem <- struct{}{}
				defer func() { <-sem }()
				deadline := time.Now().Add(30 * time.Second)
				for {
					got, err := run(pc)
					switch {
					case err != nil:
						t.Errorf("%s: %v", pc, err)
						record(pc, "error")
						return
					case got == pc.pass:
						record(pc, map[bool]string{true: "pass", false: "drop"}[got])
						return
					case !pc.pass || time.Now().After(deadline):
						t.Errorf("%s: %s, want %s", pc, map[bool]string{true: "passed", false: "dropped"}[got], map[bool]string{true: "pass", false: "drop"}[pc.pass])
						record(pc, map[bool]string{true: "PASS (want drop)", false: "DROP (want pass)"}[got])
						return
					}
					time.Sleep(500 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}
	// Passing cases first: once they pass, each node knows the other's
	// pods, so a drop afterwards is the tenant rule, not an address the
	// fence has not learned yet.
	probeAll(true)
	probeAll(false)
	var b strings.Builder
	for _, pc := range cases {
		fmt.Fprintf(&b, "  %-34s %s\n", pc, results[pc.String()])
	}
	t.Logf("$ kubectl -n NS exec FROM -- netprobe tcp|udp ADDR:8080|9090|4791   (%d probes)\n%s", len(cases), b.String())
}

// criProbe runs one probe in pod ns/name of node w over its CRI, for when
// the API server (and so kubectl exec) is down.
func criProbe(ctx context.Context, w *Worker, ns, name, mode string, addr netip.Addr) (bool, error) {
	resp, err := w.Node.Runtime.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		State:         &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns},
	}})
	if err != nil || len(resp.Containers) != 1 {
		return false, fmt.Errorf("pod %s/%s on %s: %d running containers (%v)", ns, name, w.Name, len(resp.GetContainers()), err)
	}
	r, err := w.Node.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: resp.Containers[0].Id, Cmd: netprobeArgs(mode, addr), Timeout: 10})
	if err != nil {
		return false, fmt.Errorf("exec in %s/%s: %w", ns, name, err)
	}
	out := string(r.Stdout) + string(r.Stderr)
	var exitErr error
	if r.ExitCode != 0 {
		exitErr = fmt.Errorf("exit status %d", r.ExitCode)
	}
	return probeVerdict(out, exitErr)
}

// criPodAddr is the IPv4 address of the running sandbox of pod ns/name on
// node w, from its CRI.
func criPodAddr(ctx context.Context, w *Worker, ns, name string) (netip.Addr, error) {
	resp, err := w.Node.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		State:         &cri.PodSandboxStateValue{State: cri.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns},
	}})
	if err != nil || len(resp.Items) != 1 {
		return netip.Addr{}, fmt.Errorf("pod %s/%s on %s: %d ready sandboxes (%v)", ns, name, w.Name, len(resp.GetItems()), err)
	}
	st, err := w.Node.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: resp.Items[0].Id})
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(st.GetStatus().GetNetwork().GetIp())
}

// nodeStatus is `bulkhead node status` of node w.
func nodeStatus(ctx context.Context, t *testing.T, w *Worker) string {
	out, err := w.NodeStatus(ctx, "")
	if err != nil {
		t.Errorf("bulkhead node status (%s): %v\n%s", w.Name, err, out)
	}
	return out
}

// nodeBPeers are the traffic matrix's pods on NodeB, xb (tenant agents,
// xa's) and yb (analytics), by name; the test skips when they are not
// there (testTrafficMatrix did not run).
func nodeBPeers(ctx context.Context, t *testing.T, c *Cluster) map[string]peer {
	t.Helper()
	peers := map[string]peer{}
	for name, ns := range map[string]string{"xb": "agents", "yb": "analytics"} {
		p, err := getAddrs(ctx, c, "pod", ns, name, "{.status.podIPs[*].ip}")
		if err != nil {
			t.Skipf("the traffic matrix's pods are not there: %v", err)
		}
		peers[name] = p
	}
	return peers
}

// testAPIServerOutage stops the API server for 30 s under the matrix's
// pods: the flows the fences knew keep their verdicts, a pod that appears
// meanwhile (a static pod, which a kubelet runs without the API server) is
// an unknown address to the other node and drops, and once the API server
// is back the other node learns it and it passes.
func testAPIServerOutage(ctx context.Context, t *testing.T, c *Cluster) {
	a, b := c.Node(NodeA), c.Node(NodeB)
	peers := nodeBPeers(ctx, t, c)
	expect := func(when string, to netip.Addr, toName string, want bool) {
		t.Helper()
		got, err := criProbe(ctx, a, "agents", "xa", "tcp", to)
		switch {
		case err != nil:
			t.Errorf("%s: xa -> %s: %v", when, toName, err)
		case got != want:
			t.Errorf("%s: xa -> %s tcp: passed=%v, want %v", when, toName, got, want)
		default:
			t.Logf("%s: xa (%s) -> %s (%s) tcp: %s", when, NodeA, toName, to, map[bool]string{true: "pass", false: "drop"}[got])
		}
	}

	c.StopAPIServer()
	stopped := time.Now()
	t.Logf("API server stopped at %s", stopped.Format(time.TimeOnly))
	restarted := false
	defer func() {
		if !restarted {
			if err := c.StartAPIServer(ctx); err != nil {
				t.Errorf("start the API server again: %v", err)
			}
		}
	}()
	expect("API server down", peers["xb"].v4, "xb", true)
	expect("API server down", peers["yb"].v4, "yb", false)

	// A pod the API server has not seen: a static pod on node-b.
	manifest := filepath.Join(b.StaticPods, "late.yaml")
	if err := os.WriteFile(manifest, []byte(StaticProbePod("late", "agents")), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(manifest)
	lateName := "late-" + NodeB
	var late netip.Addr
	sctx, scancel := context.WithTimeout(ctx, 90*time.Second)
	defer scancel()
	if why := eventually(sctx, func() string {
		var err error
		if late, err = criPodAddr(ctx, b, "agents", lateName); err != nil {
			return err.Error()
		}
		if _, err := criProbe(ctx, b, "agents", lateName, "tcp", late); err != nil {
			return err.Error()
		}
		return ""
	}); why != "" {
		t.Fatalf("static pod %s on %s: %s", lateName, NodeB, why)
	}
	expect("API server down", late, lateName+" (static, unknown to "+NodeA+")", false)
	if st := nodeStatus(ctx, t, a); !strings.Contains(st, "API SERVER LOST") {
		t.Errorf("node status of %s while the API server is down does not say it is lost:\n%s", NodeA, st)
	} else {
		t.Logf("$ bulkhead node status   (node %s, API server down)\n%s", NodeA, grepLines(st, "CLUSTER"))
	}
	if wait := 30*time.Second - time.Since(stopped); wait > 0 {
		time.Sleep(wait)
	}
	expect("API server down 30 s", peers["xb"].v4, "xb", true)
	expect("API server down 30 s", peers["yb"].v4, "yb", false)
	expect("API server down 30 s", late, lateName, false)

	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatalf("start the API server again: %v", err)
	}
	restarted = true
	back := time.Now()
	// The kubelet posts the static pod's mirror; node-a's agent learns it.
	// The kubelet tries at its next sync of the pod: its resync period,
	// 1 min with up to 50% jitter, after its last try while the API server
	// was down (seen: 89 s between two tries, the mirror 61 s after the
	// restart), and a try refused by the webhook while it is still blind
	// to its quota ledgers (it fails closed) waits for the next: allow
	// three and a half minutes.
	wctx, cancel := context.WithTimeout(ctx, 210*time.Second)
	defer cancel()
	var mirrored time.Duration
	if why := eventually(wctx, func() string {
		if mirrored == 0 {
			if ip, err := c.Kubectl(ctx, "-n", "agents", "get", "pod", lateName, "-o", "jsonpath={.status.podIP}"); err == nil && ip == late.String() {
				mirrored = time.Since(back)
			}
		}
		got, err := criProbe(ctx, a, "agents", "xa", "tcp", late)
		if err != nil {
			return err.Error()
		}
		if !got {
			return "xa -> " + lateName + " still drops"
		}
		return ""
	}); why != "" {
		pods, _ := c.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
		t.Errorf("after the API server returned: %s\n$ kubectl get pods -A -o wide\n%s\n$ bulkhead node status (%s)\n%s\nkubelet %s on mirror pods:\n%s",
			why, pods, NodeA, nodeStatus(ctx, t, a), NodeB, grepLines(logTail(filepath.Join(c.Dir(), "logs", "kubelet-"+NodeB+".log"), 100000), "irror"))
	} else {
		// The kubelet posts a static pod's mirror at its next sync of the
		// pod, and the agent's informer retries with client-go's backoff.
		passed := time.Since(back)
		if mirrored == 0 {
			// The mirror appeared between this poll's two checks.
			mirrored = passed
		}
		t.Logf("API server back: the mirror pod %s reached the API server with its address %s after the restart; xa -> %s passed %s after the restart, %s after the mirror",
			lateName, mirrored.Round(100*time.Millisecond), lateName, passed.Round(100*time.Millisecond), (passed - mirrored).Round(100*time.Millisecond))
	}
	expect("API server back", peers["xb"].v4, "xb", true)
	expect("API server back", peers["yb"].v4, "yb", false)
	if why := eventually(wctx, func() string {
		if st := nodeStatus(ctx, t, a); !strings.Contains(st, "CLUSTER: synced") {
			return grepLines(st, "CLUSTER")
		}
		return ""
	}); why != "" {
		t.Errorf("node status of %s after the API server returned: %s", NodeA, why)
	}
	if err := os.Remove(manifest); err != nil {
		t.Error(err)
	}
}

// testQuotaBurst creates 20 pods of tenant burst (a sandbox quota of 3) at
// once, alternately pinned to each node: exactly 3 are admitted and run,
// and every other create is refused naming the quota. Then the same with
// the webhook wrongly exempting the namespace: each node runs 3.
func testQuotaBurst(ctx context.Context, t *testing.T, c *Cluster) {
	const n = 20
	type result struct {
		out string
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			nodeName := []string{NodeA, NodeB}[i%2]
			out, err := c.KubectlStdin(ctx, BurstPod(fmt.Sprintf("w%02d", i), "burst", nodeName), "create", "-f", "-")
			results[i] = result{out, err}
		}()
	}
	close(start)
	wg.Wait()
	created, refused := 0, 0
	for i, r := range results {
		switch {
		case r.err == nil:
			created++
		case strings.Contains(r.out, "[quota.sandboxes]"):
			refused++
		default:
			t.Errorf("create w%02d: neither created nor refused by the quota: %v: %s", i, r.err, r.out)
		}
	}
	t.Logf("20 concurrent creates against a quota of 3: %d created, %d refused [quota.sandboxes]", created, refused)
	if created != 3 {
		t.Errorf("%d pods created, want exactly 3", created)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if why := eventually(wctx, func() string {
		out, err := c.Kubectl(ctx, "-n", "burst", "get", "pods", "--field-selector=status.phase=Running", "-o", "name")
		if err != nil {
			return out
		}
		if got := len(strings.Fields(out)); got != created {
			return fmt.Sprintf("%d Running, want %d", got, created)
		}
		return ""
	}); why != "" {
		t.Error(why)
	}
	out, _ := c.Kubectl(ctx, "-n", "burst", "get", "pods", "-o", "wide")
	t.Logf("$ kubectl -n burst get pods -o wide\n%s", out)
	if out, err := c.Kubectl(ctx, "-n", "burst", "delete", "pods", "--all", "--wait=true"); err != nil {
		t.Errorf("delete the burst: %v: %s", err, out)
	}

	// The same burst with the namespace wrongly exempted from the webhook:
	// the API server takes all 20, and each node's own ledger still caps
	// the tenant on that node (3 each): the cluster-wide exactness is the
	// webhook's ledger, the node's is the backstop.
	patch := `[{"op":"add","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/-","value":"burst"}]`
	if out, err := c.Kubectl(ctx, "patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p", patch); err != nil {
		t.Fatalf("exempt burst: %v: %s", err, out)
	}
	defer func() {
		unpatch := `[{"op":"test","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/2","value":"burst"},{"op":"remove","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/2"}]`
		if out, err := c.Kubectl(ctx, "patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p", unpatch); err != nil {
			t.Errorf("restore the exemptions: %v: %s", err, out)
		}
	}()
	results = make([]result, n)
	start = make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			nodeName := []string{NodeA, NodeB}[i%2]
			out, err := c.KubectlStdin(ctx, BurstPod(fmt.Sprintf("x%02d", i), "burst", nodeName), "create", "-f", "-")
			results[i] = result{out, err}
		}()
	}
	close(start)
	wg.Wait()
	for i, r := range results {
		if r.err != nil {
			t.Errorf("create x%02d with the webhook exempting burst: %v: %s", i, r.err, r.out)
		}
	}
	perNode := func() (map[string]int, string) {
		out, err := c.Kubectl(ctx, "-n", "burst", "get", "pods", "--field-selector=status.phase=Running", "-o", "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}")
		if err != nil {
			return nil, out
		}
		m := map[string]int{}
		for _, n := range strings.Fields(out) {
			m[n]++
		}
		return m, ""
	}
	wctx2, cancel2 := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel2()
	if why := eventually(wctx2, func() string {
		m, why := perNode()
		if why != "" {
			return why
		}
		if m[NodeA] != 3 || m[NodeB] != 3 {
			return fmt.Sprintf("Running per node %v, want 3 on each", m)
		}
		return ""
	}); why != "" {
		t.Error(why)
	}
	// Longer than the kubelet's sandbox retries: none of the refused ones
	// runs later.
	time.Sleep(10 * time.Second)
	m, _ := perNode()
	t.Logf("webhook bypassed: 20 created, Running per node %v (each node's ledger caps the tenant at 3 there)", m)
	if m[NodeA] > 3 || m[NodeB] > 3 {
		t.Errorf("a node ran more than the tenant's quota of 3: %v", m)
	}
	ev, _ := c.Kubectl(ctx, "-n", "burst", "get", "events", "--field-selector=reason=BulkheadRefused", "-o", "custom-columns=MESSAGE:.message", "--no-headers")
	if !strings.Contains(ev, "[quota.sandboxes]") {
		t.Errorf("no BulkheadRefused event names [quota.sandboxes]:\n%s", ev)
	}
	if out, err := c.Kubectl(ctx, "-n", "burst", "delete", "pods", "--all", "--wait=true"); err != nil {
		t.Errorf("delete the second burst: %v: %s", err, out)
	}
}
