package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// startSeries is one configuration's pod starts, sorted: the whole start
// (RunPodSandbox + CreateContainer + StartContainer) and its
// RunPodSandbox part, and the stages the Bulkhead shim logged for them.
type startSeries struct {
	total, sandbox []time.Duration
	stages         map[string][]time.Duration
}

// podStarts times n pod starts on the default handler.
func podStarts(b *testing.B, n *node.Node, ns string, count int) startSeries {
	return podStartsOn(b, n, node.Handler, ns, count)
}

// podStartsOn times count pod starts on the runtime handler handler, one
// after another; pods are removed between starts and removal is not timed.
func podStartsOn(b *testing.B, n *node.Node, handler, ns string, count int) startSeries {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	logFrom := len(n.Log())
	var s startSeries
	for i := range count {
		cfg := podConfig(n, fmt.Sprintf("bench-%d", i), ns, nil)
		start := time.Now()
		id, err := runPodOn(ctx, n, handler, cfg)
		if err != nil {
			b.Fatal(err)
		}
		s.sandbox = append(s.sandbox, time.Since(start))
		if _, err := startContainer(ctx, n, id, cfg, "main", "exec sleep 3600"); err != nil {
			b.Fatal(err)
		}
		s.total = append(s.total, time.Since(start))
		if err := removePod(ctx, n, id); err != nil {
			b.Fatal(err)
		}
	}
	sortDurations(s.total)
	sortDurations(s.sandbox)
	s.stages = shimStages(n.Log()[logFrom:])
	return s
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

var (
	createdLine = regexp.MustCompile(`created in ([0-9.]+[mµn]?s), ([0-9.]+[mµn]?s) after the shim started \(([^)]*)\)`)
	stageField  = regexp.MustCompile(`([a-z.-]+)=([0-9.]+)ms`)
)

// shimStages collects, per stage, the durations the Bulkhead shim logged
// for each sandbox it created (runtime's "created in" line), sorted.
// "create" is the whole sandbox create in the shim, "added" that but the
// task service's own create (the sandbox step), "since-exec" the time from
// the shim process's start to the end of it.
func shimStages(log string) map[string][]time.Duration {
	out := map[string][]time.Duration{}
	for _, line := range strings.Split(log, "\n") {
		m := createdLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		create, createErr := time.ParseDuration(m[1])
		if createErr == nil {
			out["create"] = append(out["create"], create)
		}
		if d, err := time.ParseDuration(m[2]); err == nil {
			out["since-exec"] = append(out["since-exec"], d)
		}
		var taskCreate time.Duration
		for _, f := range stageField.FindAllStringSubmatch(m[3], -1) {
			ms, err := strconv.ParseFloat(f[2], 64)
			if err == nil {
				d := time.Duration(ms * float64(time.Millisecond))
				out[f[1]] = append(out[f[1]], d)
				if f[1] == "sandbox" {
					taskCreate = d
				}
			}
		}
		// What Bulkhead added to the sandbox's create: all of it but the
		// task service's own create (runsc's or runc's).
		if createErr == nil {
			out["added"] = append(out["added"], create-taskCreate)
		}
	}
	for _, d := range out {
		sortDurations(d)
	}
	return out
}

// stageOrder is the order the stages are printed in.
var stageOrder = []string{"since-exec", "create", "added", "open.wait", "open.ledger", "open.mig", "open.fence", "open.policy", "open.policy-wait", "gc", "decide", "reserve", "gpu", "sandbox", "fence", "fence.netns", "fence.ledger", "fence.register", "activate"}

// BenchmarkPodStart times 20 pod starts through the CRI for each of:
// gVisor's own containerd-shim-runsc-v1 (where this process has
// CAP_SYS_RESOURCE, node.UpstreamRunscMissing), Bulkhead gVisor with the
// pipeline (policy, ledger, GPU, eBPF fence) off and on (the same shim
// binary, switched by pipeline.enabled), containerd's own
// containerd-shim-runc-v2 and Bulkhead's runc tier with the pipeline on. It
// prints p50/p95 of each, the ratios, and the shim's own stage timings at
// p50. Run with -benchtime 1x; -bench BenchmarkPodStart/gvisor or /runc runs
// one runtime.
func BenchmarkPodStart(b *testing.B) {
	starts := 20
	if v := os.Getenv("BULKHEAD_BENCH_STARTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BULKHEAD_BENCH_STARTS=%q: want a positive count", v)
		}
		starts = n
	}
	series := map[string]startSeries{}
	upstreamRunscWhy := node.UpstreamRunscMissing()
	b.Run("gvisor", func(b *testing.B) {
		for range b.N {
			plain := startNode(b, node.Options{})
			podStarts(b, plain, "research", 2) // warm caches (image unpack, first runsc)
			series["gvisor-off"] = podStarts(b, plain, "research", starts)
			if upstreamRunscWhy == "" {
				podStartsOn(b, plain, node.UpstreamRunscHandler, "research", 2)
				series["gvisor-upstream"] = podStartsOn(b, plain, node.UpstreamRunscHandler, "research", starts)
			}
			plain.Stop(context.Background())

			pn := startPipelineNodeB(b)
			podStarts(b, pn.Node, "research", 2)
			series["gvisor-on"] = podStarts(b, pn.Node, "research", starts)
			pn.Stop(context.Background())
		}
	})
	b.Run("runc", func(b *testing.B) {
		if why := runcTierMissing(); why != "" {
			b.Skip("runc tier: not measured (" + why + ")")
		}
		for range b.N {
			plain := startNode(b, node.Options{})
			podStartsOn(b, plain, node.UpstreamRuncHandler, "platform", 2)
			series["runc-upstream"] = podStartsOn(b, plain, node.UpstreamRuncHandler, "platform", starts)
			plain.Stop(context.Background())

			pn := startPipelineNodeB(b)
			podStartsOn(b, pn.Node, node.RuncHandler, "platform", 2)
			series["runc-on"] = podStartsOn(b, pn.Node, node.RuncHandler, "platform", starts)
			pn.Stop(context.Background())
		}
	})

	rows := []struct {
		key, label string
		baselines  []string
	}{
		{"gvisor-upstream", "upstream containerd-shim-runsc-v1", nil},
		{"gvisor-off", "Bulkhead gVisor, pipeline off", []string{"gvisor-upstream"}},
		{"gvisor-on", "Bulkhead gVisor, pipeline on", []string{"gvisor-off", "gvisor-upstream"}},
		{"runc-upstream", "upstream containerd-shim-runc-v2", nil},
		{"runc-on", "Bulkhead runc tier, pipeline on", []string{"runc-upstream"}},
	}
	fmt.Printf("pod start (RunPodSandbox + CreateContainer + StartContainer), %d pods each:\n", starts)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\tp50\tp95\tRunPodSandbox p50\tp50 ratio")
	for _, r := range rows {
		s, ok := series[r.key]
		if !ok {
			continue
		}
		p50 := percentile(s.total, 0.5)
		var ratios []string
		for _, baseline := range r.baselines {
			base, ok := series[baseline]
			if !ok {
				continue
			}
			ratio := float64(p50) / float64(percentile(base.total, 0.5))
			ratios = append(ratios, fmt.Sprintf("%.2f× %s", ratio, baseline))
			b.ReportMetric(ratio, "p50-ratio-"+r.key+"-to-"+baseline)
		}
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms-"+r.key)
		fmt.Fprintf(w, "%s\t%v\t%v\t%v\t%s\n", r.label, p50.Round(time.Millisecond), percentile(s.total, 0.95).Round(time.Millisecond),
			percentile(s.sandbox, 0.5).Round(time.Millisecond), strings.Join(ratios, ", "))
	}
	w.Flush()
	for _, key := range []string{"gvisor-on", "runc-on"} {
		s, ok := series[key]
		if !ok || len(s.stages) == 0 {
			continue
		}
		var parts []string
		for _, name := range stageOrder {
			if d := s.stages[name]; len(d) > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(percentile(d, 0.5).Microseconds())/1000))
			}
		}
		fmt.Printf("  %s, shim stages p50 (ms, %d sandboxes): %s\n", key, len(s.stages["create"]), strings.Join(parts, ", "))
	}
	if _, measured := series["gvisor-upstream"]; measured {
		fmt.Println("  upstream containerd-shim-runsc-v1: gVisor's own shim of the same gVisor version, same runsc and runsc flags; " + upstreamRunscGrouping())
	} else if upstreamRunscWhy != "" {
		fmt.Printf("  upstream containerd-shim-runsc-v1: not measured: %s; the gVisor baseline is Bulkhead gVisor with the pipeline off (the same gVisor library behind Bulkhead's own manager), see docs/benchmarks.md\n", upstreamRunscWhy)
	}
}

// upstreamRunscGrouping says how many shim processes gVisor's own shim
// starts per pod: its manager reads grouping only from a machine-wide file,
// which a bench node does not write (node.UpstreamRunscHandler).
func upstreamRunscGrouping() string {
	for _, f := range []string{"/run/containerd/runsc/config.toml", "/etc/containerd/runsc/config.toml"} {
		if _, err := os.Stat(f); err == nil {
			return "shim grouping as this machine's " + f + " sets it (Bulkhead: one shim per pod)"
		}
	}
	return "one shim per container, as it ships (no machine-wide config.toml turns grouping on); Bulkhead: one shim per pod"
}

// TestUpstreamRunscHandler: the bench's gVisor baseline is wired. Where
// this process has CAP_SYS_RESOURCE, a pod on handler upstream-runsc runs
// in gVisor under the node's own runsc root for it (so gVisor's task service
// read the options file the CRI options point to). Without the capability,
// the pod reaches gVisor's shim manager and fails as docs/benchmarks.md
// says, on the shim's oom_score_adj, and leaves no shim running.
func TestUpstreamRunscHandler(t *testing.T) {
	if _, err := node.LookPath("containerd-shim-runsc-v1"); err != nil {
		t.Skip("needs containerd-shim-runsc-v1 (make tools-node)")
	}
	hasCap, err := node.HasCapability(unix.CAP_SYS_RESOURCE)
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := podConfig(n, "upstream-runsc", "default", nil)
	id, err := runPodOn(ctx, n, node.UpstreamRunscHandler, pod)
	if !hasCap {
		if err == nil {
			t.Fatal("RunPodSandbox on upstream-runsc succeeded without CAP_SYS_RESOURCE: the bench would skip a baseline it could measure")
		}
		for _, want := range []string{"failed to set OOM Score on shim", "oom_score_adj: permission denied"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("RunPodSandbox on upstream-runsc: want an error with %q, got: %v", want, err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(processes(n.Dir(), "containerd-shim-runsc-v1")) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("shims left running after the failed start: %q", processes(n.Dir(), "containerd-shim-runsc-v1"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("no CAP_SYS_RESOURCE here; gVisor's manager refused as expected: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("RunPodSandbox on upstream-runsc: %v", err)
	}
	c, err := startContainer(ctx, n, id, pod, "main", "exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	if dmesg, err := execSync(ctx, n, c, "dmesg"); err != nil || !strings.Contains(dmesg, "gVisor") {
		t.Errorf("dmesg inside the upstream-runsc pod does not show gVisor (err %v):\n%s", err, dmesg)
	}
	if sandboxes := processes(n.UpstreamRunscRoot, "boot"); len(sandboxes) != 1 {
		t.Errorf("want 1 runsc sandbox under %s (the options file's root), got %d: %q", n.UpstreamRunscRoot, len(sandboxes), sandboxes)
	}
	if err := removePod(ctx, n, id); err != nil {
		t.Fatal(err)
	}
}
