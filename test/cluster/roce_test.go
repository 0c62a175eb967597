package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// rocePods are the RoCE matrix's pods: tenant platform (trusted, RDMA on
// its own VF) with a granted pod on each node and one on node-b that does
// not ask for RDMA, and tenant training (standard, RDMA on its own VF too)
// with a granted pod on node-a.
var rocePods = []struct {
	name, ns, node string
	rdma           bool
}{
	{"pa", "platform", NodeA, true},
	{"pb", "platform", NodeB, true},
	{"pn", "platform", NodeB, false},
	{"ta", "training", NodeA, true},
}

// rdmaProbePod is ProbePod asking for RDMA (bulkhead.dev/rdma: "true").
func rdmaProbePod(name, ns, nodeName string) string {
	m := ProbePod(name, ns, nodeName)
	return strings.Replace(m, "  labels: {app: "+name+"}\n",
		fmt.Sprintf("  labels: {app: %s}\n  annotations: {%s: \"true\"}\n", name, policy.AnnotationRDMA), 1)
}

// testRoCEAcrossNodes proves through kubectl that RoCEv2 (UDP 4791) passes
// between two pods of one tenant on two nodes when both hold the RDMA grant,
// both ways and both families, and drops for every other pair: the same
// tenant with one end not granted, and two granted tenants. Each node
// learns the other node's pod's grant from the API server (the pod's
// request) and its own policy (the namespace's tier), never from the
// request alone.
func testRoCEAcrossNodes(ctx context.Context, t *testing.T, c *Cluster) {
	for _, p := range rocePods {
		m := ProbePod(p.name, p.ns, p.node)
		if p.rdma {
			m = rdmaProbePod(p.name, p.ns, p.node)
		}
		if out, err := c.KubectlStdin(ctx, m, "apply", "-f", "-"); err != nil {
			t.Fatalf("pod %s/%s: %v: %s", p.ns, p.name, err, out)
		}
	}
	t.Cleanup(func() {
		for _, p := range rocePods {
			_, _ = c.Kubectl(context.Background(), "-n", p.ns, "delete", "pod", p.name, "--wait=false")
		}
	})
	peers := map[string]peer{}
	for _, p := range rocePods {
		if out, err := c.Kubectl(ctx, "-n", p.ns, "wait", "--for=condition=Ready", "pod/"+p.name, "--timeout=180s"); err != nil {
			d, _ := c.Kubectl(ctx, "-n", p.ns, "describe", "pod", p.name)
			t.Fatalf("pod %s/%s not Ready: %v: %s\n%s", p.ns, p.name, err, out, d)
		}
		a, err := getAddrs(ctx, c, "pod", p.ns, p.name, "{.status.podIPs[*].ip}")
		if err != nil {
			t.Fatal(err)
		}
		peers[p.name] = a
	}
	var cases []probeCase
	for _, v6 := range []bool{false, true} {
		for _, pc := range []struct {
			from, to string
			pass     bool
		}{
			{"pa", "pb", true}, {"pb", "pa", true}, // one tenant, both granted, across nodes
			{"pa", "pn", false}, {"pn", "pa", false}, // one tenant, one end not granted
			{"pb", "ta", false}, {"ta", "pb", false}, // two granted tenants
		} {
			cases = append(cases, probeCase{pc.from, pc.to, "roce", v6, pc.pass})
		}
		// The pair that must not exchange RoCEv2 still exchanges TCP:
		// the drops above are the RDMA rule, not an unknown address.
		cases = append(cases, probeCase{"pa", "pn", "tcp", v6, true}, probeCase{"pn", "pa", "tcp", v6, true})
	}
	var mu sync.Mutex
	results := map[string]string{}
	word := map[bool]string{true: "pass", false: "drop"}
	// Passing cases first, retried while the other node learns the pod
	// (and its grant) from the API server; then every drop once, at once.
	for _, pass := range []bool{true, false} {
		var wg sync.WaitGroup
		for _, pc := range cases {
			if pc.pass != pass {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				deadline := time.Now().Add(30 * time.Second)
				for {
					got, err := kubectlProbe(ctx, c, peers[pc.from], pc.mode, peers[pc.to].addr(pc.v6))
					if err == nil && (got == pc.pass || !pc.pass || time.Now().After(deadline)) {
						mu.Lock()
						results[pc.String()] = word[got]
						mu.Unlock()
						if got != pc.pass {
							t.Errorf("%s: %s, want %s", pc, word[got], word[pc.pass])
						}
						return
					}
					if err != nil {
						t.Errorf("%s: %v", pc, err)
						return
					}
					time.Sleep(500 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	}
	var b strings.Builder
	for _, pc := range cases {
		fmt.Fprintf(&b, "  %-26s %s\n", pc, results[pc.String()])
	}
	t.Logf("pa, ta on %s; pb, pn on %s; pa, pb, ta ask for RDMA\n$ kubectl -n NS exec FROM -- netprobe udp|tcp ADDR:4791|8080   (%d probes)\n%s",
		NodeA, NodeB, len(cases), b.String())
	for _, w := range c.Nodes {
		t.Logf("%s: %s", w.Name, remoteGrants(ctx, t, w))
	}
}

// remoteGrants is the line of `bulkhead node status` that counts the remote
// pods the node's fence holds, for the log.
func remoteGrants(ctx context.Context, t *testing.T, w *Worker) string {
	for _, l := range strings.Split(nodeStatus(ctx, t, w), "\n") {
		if strings.Contains(l, "remote") {
			return strings.TrimSpace(l)
		}
	}
	return "(no remote line in node status)"
}
