package cluster

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bhnode "github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// testNodeRollout restarts the node DaemonSet as an operator rolls it out
// (a new image, a changed config: `kubectl rollout restart`), one node at a
// time, under the traffic matrix's pods: while each node's agent is
// replaced the fence keeps its verdicts (xa -> xb passes, xa -> yb drops,
// probed throughout), every node keeps its reservations, the installer
// finds nothing to change and leaves containerd running, and afterwards
// the new agents place and fence new pods on both nodes.
func testNodeRollout(ctx context.Context, t *testing.T, c *Cluster) {
	a := c.Node(NodeA)
	peers := nodeBPeers(ctx, t, c)
	reservations := func(w *Worker) []string {
		l, err := bhnode.OpenLedgerReadOnly(w.Node.HostPath("/var/lib/bulkhead/ledger.db"))
		if err != nil {
			t.Fatalf("node %s ledger: %v", w.Name, err)
		}
		var ids []string
		_ = l.View(func(tx *bhnode.LedgerTx) error {
			res, err := tx.List()
			if err != nil {
				t.Errorf("node %s ledger: %v", w.Name, err)
			}
			for _, r := range res {
				ids = append(ids, r.SandboxID+" "+r.Namespace+"/"+r.Pod+" "+r.State)
			}
			return nil
		})
		slices.Sort(ids)
		return ids
	}
	containerdPid := func(w *Worker) string {
		b, _ := os.ReadFile(w.Node.HostPath("/run/containerd/containerd.pid"))
		return strings.TrimSpace(string(b))
	}
	agentPods := func() string {
		out, _ := c.Kubectl(ctx, "-n", webhookNamespace, "get", "pods", "-l", nodeSelector, "-o", "jsonpath={.items[*].metadata.name}")
		return out
	}
	before := map[string][]string{}
	pids := map[string]string{}
	for _, w := range c.Nodes {
		before[w.Name] = reservations(w)
		pids[w.Name] = containerdPid(w)
	}
	podsBefore := agentPods()

	// Probe throughout the rollout.
	var (
		mu     sync.Mutex
		probes int
		wrong  []string
	)
	pctx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for pctx.Err() == nil {
			for _, pc := range []struct {
				to   string
				want bool
			}{{"xb", true}, {"yb", false}} {
				got, err := criProbe(pctx, a, "agents", "xa", "tcp", peers[pc.to].v4)
				if pctx.Err() != nil {
					return
				}
				mu.Lock()
				probes++
				if err != nil || got != pc.want {
					wrong = append(wrong, fmt.Sprintf("%s xa -> %s: passed=%v (%v), want %v", time.Now().Format(time.TimeOnly), pc.to, got, err, pc.want))
				}
				mu.Unlock()
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	started := time.Now()
	for _, args := range [][]string{
		{"-n", webhookNamespace, "rollout", "restart", "daemonset/" + nodeDaemonSet},
		{"-n", webhookNamespace, "rollout", "status", "daemonset/" + nodeDaemonSet, "--timeout=240s"},
	} {
		if out, err := c.Kubectl(ctx, args...); err != nil {
			stopProbes()
			wg.Wait()
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rolled := time.Since(started)
	// A few more rounds on the new agents.
	time.Sleep(2 * time.Second)
	stopProbes()
	wg.Wait()
	t.Logf("$ kubectl -n bulkhead-system rollout restart daemonset/bulkhead-node; kubectl rollout status ...\n"+
		"rolled out in %s (pods %s -> %s); %d probes of xa -> xb (pass) and xa -> yb (drop) during it, %d wrong",
		rolled.Round(time.Millisecond), podsBefore, agentPods(), probes, len(wrong))
	for _, w := range wrong {
		t.Errorf("during the rollout: %s", w)
	}
	if probes < 4 {
		t.Errorf("only %d probes ran during the rollout", probes)
	}
	if after := agentPods(); after == podsBefore {
		t.Errorf("the DaemonSet's pods were not replaced: %s", after)
	}
	for _, w := range c.Nodes {
		if len(before[w.Name]) == 0 {
			t.Errorf("node %s had no reservation before the rollout: nothing to keep", w.Name)
		}
		t.Logf("node %s: %d reservations, containerd pid %s, before the rollout", w.Name, len(before[w.Name]), pids[w.Name])
		if got := reservations(w); !slices.Equal(got, before[w.Name]) {
			t.Errorf("node %s reservations changed by the rollout:\nbefore %q\nafter  %q", w.Name, before[w.Name], got)
		}
		if got := containerdPid(w); got != pids[w.Name] {
			t.Errorf("node %s: containerd restarted by the rollout (pid %s -> %s): the installer found a change", w.Name, pids[w.Name], got)
		}
	}
	// The new agents place and fence new pods on both nodes.
	for _, w := range c.Nodes {
		name := "after-rollout-" + w.Name
		if out, err := c.KubectlStdin(ctx, OnNode(Pod(name, "agents", "bulkhead", nil), w.Name), "apply", "-f", "-"); err != nil {
			t.Errorf("kubectl apply %s: %v\n%s", name, err, out)
			continue
		}
		if out, err := c.Kubectl(ctx, "-n", "agents", "wait", "--for=condition=Ready", "pod/"+name, "--timeout=120s"); err != nil {
			d, _ := c.Kubectl(ctx, "-n", "agents", "describe", "pod", name)
			t.Errorf("pod %s not Ready after the rollout: %v: %s\n%s", name, err, out, d)
		}
		if status, _ := w.NodeStatus(ctx, ""); !strings.Contains(status, "AGENT: running") {
			t.Errorf("node %s after the rollout:\n%s", w.Name, status)
		}
		if out, err := c.Kubectl(ctx, "-n", "agents", "delete", "pod", name, "--wait=true"); err != nil {
			t.Errorf("delete %s: %v: %s", name, err, out)
		}
	}
}
