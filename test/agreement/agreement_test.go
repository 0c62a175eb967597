package agreement

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// startNode starts a private node with the full pipeline on the table's
// bundle (signed with the real opa, verified by the shim), a mock H200
// pair for MIG, the eBPF fence, and both Bulkhead shims; or skips saying
// what this machine lacks.
func startNode(t *testing.T, bundle string) *kubelet {
	t.Helper()
	bins := node.BinDirs()
	if err := node.Requirements(bins); err != nil {
		t.Skipf("agreement: the node half %v; the webhook half runs in TestWebhookVerdicts", err)
	}
	for _, bin := range []string{"containerd-shim-bulkhead-runc-v1", "runc"} {
		if _, err := node.LookPath(bin); err != nil {
			t.Skipf("agreement: the node half needs %s for handler %s (make build tools)", bin, runc)
		}
	}
	dir, err := os.MkdirTemp("", "bh-agree-")
	if err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/bh-agree-%d", os.Getpid())
	subnet := fmt.Sprintf("10.197.%d.0/24", os.Getpid()%250)
	extra, err := node.Pipeline{
		Bundle: bundle, TenantsJSON: tenantsJSON, MockModel: "h200", MockGPUs: 2, PinDir: pinDir,
		Signed: true, BinDirs: bins,
	}.ShimConfig(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	kubeletRoot := filepath.Join(dir, "kubelet")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := node.Start(ctx, node.Options{
		Dir: dir, BinDir: bins, Bridge: fmt.Sprintf("bhag%d", os.Getpid()%100000), Subnet: subnet,
		PipelineEnabled: true, ShimConfig: extra, KubeletRoot: kubeletRoot,
	})
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log (tail):\n%s", tail(n.Log(), 40))
		}
		n.Stop(context.Background())
	})
	return &kubelet{n: n, root: kubeletRoot}
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// parallelPods is how many of the table's pods the node starts at once.
const parallelPods = 4

type nodeResult struct {
	got verdict
	err error
}

// runNode runs every case on the node: the ordinary rows parallelPods at
// a time, then the serial rows (GPU capacity, quotas) one by one.
func runNode(k *kubelet, cases []agreeCase) []nodeResult {
	results := make([]nodeResult, len(cases))
	ctx := context.Background()
	run := func(i int) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		got, err := k.verdict(cctx, cases[i])
		results[i] = nodeResult{got, err}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range parallelPods {
		wg.Go(func() {
			for i := range work {
				run(i)
			}
		})
	}
	for i, c := range cases {
		if !c.Serial {
			work <- i
		}
	}
	close(work)
	wg.Wait()
	for i, c := range cases {
		if c.Serial {
			run(i)
		}
	}
	return results
}

// TestAgreement runs every case of the table through the webhook and
// through a real node, and requires both to answer as the table says:
// the same verdict and the same rule ids, except the rows marked invisible
// to one side, where each side answers as its own column says.
func TestAgreement(t *testing.T) {
	cases := table()
	checkTable(t, cases)
	cases = only(t, cases)
	bundle := writeBundle(t)
	w := startWebhook(t, bundle)
	k := startNode(t, bundle)
	began := time.Now()
	results := runNode(k, cases)
	nodeTime := time.Since(began)

	counts := map[string]int{}
	var exceptions []string
	for i, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			wv, msg, werr := w.verdict(context.Background(), c)
			nv, nerr := results[i].got, results[i].err
			if c.Pending != "" {
				counts["pending"]++
				state := fmt.Sprintf("webhook %v (want %v), node %v (want %v)", wv, c.Webhook, nv, c.Node)
				if werr != nil || nerr != nil {
					state += fmt.Sprintf("; errors: webhook %v, node %v", werr, nerr)
				} else if wv.equal(c.Webhook) && nv.equal(c.Node) {
					state = "both sides now answer as the table says: remove Pending"
				}
				t.Skipf("pending (%s): %s", c.Pending, state)
			}
			if werr != nil {
				counts["error"]++
				t.Fatalf("webhook: %v", werr)
			}
			if nerr != nil {
				counts["error"]++
				t.Fatalf("node: %v", nerr)
			}
			ok := true
			if !wv.equal(c.Webhook) {
				ok = false
				t.Errorf("webhook: %v, want %v\n%s", wv, c.Webhook, msg)
			}
			if !nv.equal(c.Node) {
				ok = false
				t.Errorf("node: %v, want %v", nv, c.Node)
			}
			switch {
			case !ok:
				counts["wrong"]++
			case c.Invisible != "":
				counts["exception"]++
				exceptions = append(exceptions, fmt.Sprintf("%s: webhook %v, node %v: %s", c.Name, wv, nv, c.Invisible))
			default:
				counts["agree"]++
			}
		})
	}
	t.Logf("agreement: %d cases (%s); the node ran them in %v", len(cases), fmtCounts(counts), nodeTime.Round(time.Second))
	for _, e := range exceptions {
		t.Logf("exception %s", e)
	}
}
