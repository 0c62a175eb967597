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
var stageOrder = []string{"since-exec", "create", "added", "open.ledger", "open.mig", "open.fence", "open.policy", "open.policy-wait", "gc", "decide", "reserve", "gpu", "sandbox", "fence", "fence.netns", "fence.ledger", "fence.register", "activate"}

// BenchmarkPodStart times 20 pod starts through the CRI for each of:
// Bulkhead gVisor with the pipeline (policy, ledger, GPU, eBPF fence) off
// and on (the same shim binary, switched by pipeline.enabled), containerd's
// own containerd-shim-runc-v2 and Bulkhead's runc tier with the pipeline
// on. It prints p50/p95 of each, the ratios, and the shim's own stage
// timings at p50. Run with -benchtime 1x; -bench BenchmarkPodStart/gvisor
// or /runc runs one runtime.
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
	b.Run("gvisor", func(b *testing.B) {
		for range b.N {
			plain := startNode(b, node.Options{})
			podStarts(b, plain, "research", 2) // warm caches (image unpack, first runsc)
			series["gvisor-off"] = podStarts(b, plain, "research", starts)
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

	rows := []struct{ key, label, baseline string }{
		{"gvisor-off", "Bulkhead gVisor, pipeline off", ""},
		{"gvisor-on", "Bulkhead gVisor, pipeline on", "gvisor-off"},
		{"runc-upstream", "upstream containerd-shim-runc-v2", ""},
		{"runc-on", "Bulkhead runc tier, pipeline on", "runc-upstream"},
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
		ratio := ""
		if base, ok := series[r.baseline]; ok {
			ratio = fmt.Sprintf("%.2f× %s", float64(p50)/float64(percentile(base.total, 0.5)), r.baseline)
			b.ReportMetric(float64(p50)/float64(percentile(base.total, 0.5)), "p50-ratio-"+r.key)
		}
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms-"+r.key)
		fmt.Fprintf(w, "%s\t%v\t%v\t%v\t%s\n", r.label, p50.Round(time.Millisecond), percentile(s.total, 0.95).Round(time.Millisecond),
			percentile(s.sandbox, 0.5).Round(time.Millisecond), ratio)
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
	fmt.Println("  upstream containerd-shim-runsc-v1: not measured here: it cannot start a pod without CAP_SYS_RESOURCE (oom_score_adj), see docs/benchmarks.md; Bulkhead gVisor with the pipeline off is the same gVisor library behind Bulkhead's own manager")
}
