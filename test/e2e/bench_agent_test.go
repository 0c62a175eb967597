package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// agentPods is how many runc-tier pods BenchmarkAgentMemory runs at once,
// and gvisorPods how many gVisor pods it then starts beside them.
const (
	agentPods  = 100
	gvisorPods = 10
)

// BenchmarkAgentMemory starts 100 pods on a pipeline node, one after
// another, each with a container, and prints the agent's RSS, PSS and peak
// RSS (VmHWM) with 0, 1, 10, 25, 50 and 100 pods running. The pods are of
// the runc tier (tenant platform, handler bulkhead-runc): 100 gVisor
// sandboxes would take this 2-core machine's CPU for minutes and exceed
// the standard tenant's quota, and the agent keeps the same per pod either
// way (its record, its admission). Then it starts 10 gVisor pods beside
// them and prints the agent again (110 pods), and the PSS of each shim,
// gVisor sandbox and gofer, whose binaries' pages are now shared among
// many processes. Run with -benchtime 1x.
func BenchmarkAgentMemory(b *testing.B) {
	if why := runcTierMissing(); why != "" {
		b.Skip("runc tier: not measured (" + why + ")")
	}
	for range b.N {
		pn := startPipelineNodeB(b)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		type sample struct {
			pods          int
			pss, rss, hwm int64
		}
		var samples []sample
		measure := func(pods int) {
			pid := pn.AgentPID()
			pss, rss, err := readMemory(pid)
			if err != nil {
				b.Fatalf("agent (pid %d) with %d pods: %v", pid, pods, err)
			}
			hwm, err := peakRSS(pid)
			if err != nil {
				b.Fatal(err)
			}
			samples = append(samples, sample{pods, pss, rss, hwm})
		}
		measure(0)
		var ids []string
		began := time.Now()
		for i := range agentPods {
			cfg := podConfig(pn.Node, fmt.Sprintf("many-%d", i), "platform", nil)
			id, err := runPodOn(ctx, pn.Node, node.RuncHandler, cfg)
			if err != nil {
				b.Fatalf("pod %d: %v", i, err)
			}
			if _, err := startContainer(ctx, pn.Node, id, cfg, "main", "exec sleep 3600"); err != nil {
				b.Fatalf("pod %d: %v", i, err)
			}
			ids = append(ids, id)
			if slices.Contains([]int{1, 10, 25, 50}, len(ids)) {
				time.Sleep(time.Second)
				measure(len(ids))
			}
		}
		startedIn := time.Since(began)
		time.Sleep(2 * time.Second)
		measure(len(ids))
		shims, shimPSS := shimsUnder(pn.Dir(), "containerd-shim-bulkhead-runc-v1")
		last := samples[len(samples)-1]
		// Then 10 gVisor pods beside them: what a gVisor pod's shim and
		// sandbox take when their binaries' pages are shared ten ways.
		for i := range gvisorPods {
			cfg := podConfig(pn.Node, fmt.Sprintf("gvisor-%d", i), "research", nil)
			id, err := runPodOn(ctx, pn.Node, node.Handler, cfg)
			if err != nil {
				b.Fatalf("gVisor pod %d: %v", i, err)
			}
			if _, err := startContainer(ctx, pn.Node, id, cfg, "main", "exec sleep 3600"); err != nil {
				b.Fatalf("gVisor pod %d: %v", i, err)
			}
			ids = append(ids, id)
		}
		time.Sleep(2 * time.Second)
		measure(len(ids))
		var gvisor []string
		for _, name := range []string{"containerd-shim-bulkhead-v1", "runsc-sandbox", "runsc-gofer"} {
			n, pss := shimsUnder(pn.Dir(), name)
			if n > 0 {
				gvisor = append(gvisor, fmt.Sprintf("%d %s %.1f MB each", n, name, mb(pss)/float64(n)))
				b.ReportMetric(mb(pss)/float64(n), "pss-MB-each-"+name)
			}
		}
		fmt.Printf("bulkhead-agent memory (/proc/PID/smaps_rollup, VmHWM), runc-tier pods each with one container, started one after another (%d in %v):\n", agentPods, startedIn.Round(time.Second))
		w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "pods\tRSS\tPSS\tpeak RSS")
		for _, s := range samples {
			fmt.Fprintf(w, "%d\t%.1f MB\t%.1f MB\t%.1f MB\n", s.pods, mb(s.rss), mb(s.pss), mb(s.hwm))
		}
		w.Flush()
		if shims > 0 {
			fmt.Printf("  with %d runc pods, the %d Bulkhead runc shims: %.1f MB PSS together, %.1f MB each (their binary's pages shared among them)\n", agentPods, shims, mb(shimPSS), mb(shimPSS)/float64(shims))
			b.ReportMetric(mb(shimPSS)/float64(shims), "pss-MB-each-runc-shim")
		}
		fmt.Printf("  with %d gVisor pods beside them, PSS: %s\n", gvisorPods, strings.Join(gvisor, ", "))
		b.ReportMetric(mb(last.rss), "rss-MB-100-pods")
		b.ReportMetric(mb(last.pss), "pss-MB-100-pods")
		b.ReportMetric(mb(last.hwm), "peak-rss-MB")
		b.ReportMetric(float64(last.rss-samples[0].rss)/float64(len(ids)), "rss-kB-per-pod")

		// Removed four at a time, untimed; Stop removes what is left.
		var wg sync.WaitGroup
		work := make(chan string)
		for range 4 {
			wg.Go(func() {
				for id := range work {
					if err := removePod(ctx, pn.Node, id); err != nil {
						b.Error(err)
					}
				}
			})
		}
		for _, id := range ids {
			work <- id
		}
		close(work)
		wg.Wait()
		cancel()
		pn.Stop(context.Background())
	}
}

func mb(kB int64) float64 { return float64(kB) / 1024 }

// shimsUnder counts the processes of node directory dir whose argv[0] is
// name, and sums their PSS (kB).
func shimsUnder(dir, name string) (count int, pss int64) {
	for _, pid := range node.ProcessesUnder(dir) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		if filepath.Base(argv0) != name {
			continue
		}
		if p, _, err := readMemory(pid); err == nil {
			count++
			pss += p
		}
	}
	return count, pss
}

// peakRSS is process pid's VmHWM (kB).
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// lateTenants is e2eTenants and tenant "late" (namespace late): the
// revision that TestBundleHotReload swaps in.
const lateTenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"],   "egress_cidrs": ["10.96.0.0/12"], "quota": {"sandboxes": 5, "gpu_slices": 6, "memory": "64Gi"}},
  "research": {"tier": "standard",  "namespaces": ["research"], "quota": {"sandboxes": 50, "gpu_slices": 28, "memory": "512Gi"}},
  "platform": {"tier": "trusted",   "namespaces": ["platform"]},
  "late":     {"tier": "standard",  "namespaces": ["late"],     "quota": {"sandboxes": 5, "memory": "64Gi"}}
}}}`

// reloadRevision is the revision of the bundle TestBundleHotReload writes.
const reloadRevision = "e2e-hot-reload-2"

// resignBundle builds, from the source the node's bundle was built from
// (<dir>/bundle-src), a bundle of revision with the policy data tenantsJSON,
// signed with the node's own key (<dir>/signing-key.pem) as a security team
// would sign its next revision, and returns its path beside the node's
// bundle (not yet in place).
func resignBundle(dir, revision, tenantsJSON string) (string, error) {
	opa, err := node.LookPath("opa")
	if err != nil {
		return "", fmt.Errorf("needs opa (make tools): %w", err)
	}
	src := filepath.Join(dir, "bundle-src-"+revision)
	if err := os.CopyFS(src, os.DirFS(filepath.Join(dir, "bundle-src"))); err != nil {
		return "", err
	}
	rewrite := func(name string, edit func(map[string]any) error) error {
		p := filepath.Join(src, name)
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := edit(doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if raw, err = json.Marshal(doc); err != nil {
			return err
		}
		return os.WriteFile(p, raw, 0o644)
	}
	if err := rewrite(".manifest", func(m map[string]any) error { m["revision"] = revision; return nil }); err != nil {
		return "", err
	}
	var tenants struct {
		Bulkhead struct {
			Tenants any `json:"tenants"`
		} `json:"bulkhead"`
	}
	if err := json.Unmarshal([]byte(tenantsJSON), &tenants); err != nil {
		return "", err
	}
	if err := rewrite("data.json", func(d map[string]any) error {
		bh, ok := d["bulkhead"].(map[string]any)
		if !ok {
			return fmt.Errorf("no bulkhead object")
		}
		bh["tenants"] = tenants.Bulkhead.Tenants
		return nil
	}); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "bundle-"+revision+".tar.gz")
	if b, err := exec.Command(opa, "build", "--bundle", src, "--signing-key", filepath.Join(dir, "signing-key.pem"), "--signing-alg", "RS256",
		"--verification-key-id", node.BundleKeyID, "--claims-file", filepath.Join(dir, "claims.json"), "--output", out).CombinedOutput(); err != nil {
		return "", fmt.Errorf("opa build: %v: %s", err, b)
	}
	return out, nil
}

// decisionEntry is what TestBundleHotReload reads of a decision log line.
type decisionEntry struct {
	Revision  string    `json:"revision"`
	Timestamp time.Time `json:"timestamp"`
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace"`
	Result    struct {
		Allow bool `json:"allow"`
	} `json:"result"`
}

func readDecisions(t *testing.T, path string) []decisionEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []decisionEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e decisionEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBundleHotReload: a new signed revision of the policy bundle, written
// over the node's bundle while pods start, is enforced by the agent without
// a restart, and no start of a tenant the swap does not touch is refused.
// Pods of tenant research (gVisor) and platform (runc tier) start and are
// removed in two loops; a third tries a pod of namespace late, which the
// first revision does not know (refused) and the second gives a tenant.
// It prints the time from the rename of the new bundle into place to the
// first decision under the new revision (the decision log's timestamp) and
// to the first pod of late admitted; it asserts nothing on time, except
// that the new revision is enforced within 30 s.
func TestBundleHotReload(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	next, err := resignBundle(pn.Dir(), reloadRevision, lateTenants)
	if err != nil {
		t.Fatal(err)
	}

	type start struct {
		ns           string
		began, ended time.Time
		err          error
	}
	var (
		mu      sync.Mutex
		starts  []start
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		counted = func(ns string, ok bool) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, s := range starts {
				if s.ns == ns && (s.err == nil) == ok {
					n++
				}
			}
			return n
		}
	)
	loop := func(ns, handler string, untilAdmitted bool) {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			cfg := podConfig(pn.Node, fmt.Sprintf("%s-%d", ns, i), ns, nil)
			s := start{ns: ns, began: time.Now()}
			var id string
			id, s.err = runPodOn(ctx, pn.Node, handler, cfg)
			s.ended = time.Now()
			mu.Lock()
			starts = append(starts, s)
			mu.Unlock()
			if s.err == nil {
				if err := removePod(ctx, pn.Node, id); err != nil {
					t.Errorf("remove %s/%s: %v", ns, cfg.Metadata.Name, err)
				}
				if untilAdmitted {
					return
				}
			}
			if untilAdmitted {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	wg.Add(2)
	go loop("research", node.Handler, false)
	go loop("late", node.Handler, true)
	if runcTierMissing() == "" {
		wg.Add(1)
		go loop("platform", node.RuncHandler, false)
	}
	// Steady state first: the loops have started pods, and late was refused.
	for counted("research", true) < 2 || counted("late", false) < 2 {
		if ctx.Err() != nil {
			t.Fatal("the loops did not reach a steady state")
		}
		time.Sleep(50 * time.Millisecond)
	}
	bundle := filepath.Join(pn.Dir(), "bundle.tar.gz")
	written := time.Now()
	if err := os.Rename(next, bundle); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for counted("late", true) == 0 {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("30s after revision %s was written, no pod of namespace late was admitted (%d refused)", reloadRevision, counted("late", false))
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A few more starts under the new revision, then stop.
	for after := counted("research", true) + 2; counted("research", true) < after && ctx.Err() == nil; {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	var admittedAt time.Time
	during := map[string]int{}
	for _, s := range starts {
		if s.ns != "late" && s.err != nil {
			t.Errorf("pod of %s refused or failed (began %v after the write): %v", s.ns, s.began.Sub(written).Round(time.Millisecond), s.err)
		}
		if s.ns == "late" && s.err == nil {
			admittedAt = s.ended
		}
		if s.ns != "late" && s.ended.After(written) && s.began.Before(written.Add(2*time.Second)) {
			during[s.ns]++
		}
	}

	var firstNew, lastOld time.Time
	oldAfterNew := 0
	for _, e := range readDecisions(t, filepath.Join(pn.Dir(), "decisions.log")) {
		switch {
		case e.Revision == reloadRevision && firstNew.IsZero():
			firstNew = e.Timestamp
		case e.Revision != reloadRevision:
			lastOld = e.Timestamp
			if !firstNew.IsZero() {
				oldAfterNew++
			}
		}
	}
	if firstNew.IsZero() {
		t.Fatalf("no decision of revision %s in the decision log", reloadRevision)
	}
	// A decision that began before the swap may be logged after one that
	// began after it: counted, not refused.
	t.Logf("revision %s renamed into place; first decision under it %v after; last decision under the old one %v after (%d logged after the first new one); first pod of namespace late admitted (RunPodSandbox returned) %v after; starts of research/platform overlapping the 2 s after the write: %v, none refused",
		reloadRevision, firstNew.Sub(written).Round(time.Millisecond), lastOld.Sub(written).Round(time.Millisecond), oldAfterNew,
		admittedAt.Sub(written).Round(time.Millisecond), during)
	fmt.Printf("bundle hot reload: first decision under the new revision %.0f ms after the write, first late pod admitted %.0f ms after\n",
		float64(firstNew.Sub(written).Microseconds())/1000, float64(admittedAt.Sub(written).Microseconds())/1000)
}
