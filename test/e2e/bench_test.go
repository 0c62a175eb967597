package e2e

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// podStarts times n pod starts (RunPodSandbox + CreateContainer +
// StartContainer) one after another; pods are removed between starts and
// removal is not timed.
func podStarts(b *testing.B, n *node.Node, ns string, count int) []time.Duration {
	return podStartsOn(b, n, node.Handler, ns, count)
}

// podStartsOn is podStarts on the runtime handler handler.
func podStartsOn(b *testing.B, n *node.Node, handler, ns string, count int) []time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var times []time.Duration
	for i := range count {
		cfg := podConfig(n, fmt.Sprintf("bench-%d", i), ns, nil)
		start := time.Now()
		id, err := runPodOn(ctx, n, handler, cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := startContainer(ctx, n, id, cfg, "main", "exec sleep 3600"); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(start))
		if err := removePod(ctx, n, id); err != nil {
			b.Fatal(err)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return times
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

// BenchmarkPodStart compares 20 pod starts through the CRI with Bulkhead's
// pipeline (policy, ledger, GPU, eBPF fence) enabled and disabled: the same
// shim binary, switched by pipeline.enabled. Run with -benchtime 1x.
func BenchmarkPodStart(b *testing.B) {
	const starts = 20
	var off, on []time.Duration
	var runcUpstream, runcOn []time.Duration
	runc := runcTierMissing() == ""
	for range b.N {
		b.StopTimer()
		plain := startNode(b, node.Options{})
		podStarts(b, plain, "research", 2) // warm caches (image unpack, first runsc)
		off = podStarts(b, plain, "research", starts)
		if runc {
			podStartsOn(b, plain, node.UpstreamRuncHandler, "platform", 2)
			runcUpstream = podStartsOn(b, plain, node.UpstreamRuncHandler, "platform", starts)
		}
		plain.Stop(context.Background())

		pn := startPipelineNodeB(b)
		podStarts(b, pn.Node, "research", 2)
		on = podStarts(b, pn.Node, "research", starts)
		if runc {
			podStartsOn(b, pn.Node, node.RuncHandler, "platform", 2)
			runcOn = podStartsOn(b, pn.Node, node.RuncHandler, "platform", starts)
		}
		pn.Stop(context.Background())
	}
	p50off, p95off := percentile(off, 0.5), percentile(off, 0.95)
	p50on, p95on := percentile(on, 0.5), percentile(on, 0.95)
	b.ReportMetric(float64(p50off.Milliseconds()), "p50-off-ms")
	b.ReportMetric(float64(p95off.Milliseconds()), "p95-off-ms")
	b.ReportMetric(float64(p50on.Milliseconds()), "p50-on-ms")
	b.ReportMetric(float64(p95on.Milliseconds()), "p95-on-ms")
	b.ReportMetric(float64(p50on)/float64(p50off), "p50-ratio")
	b.ReportMetric(float64(p95on)/float64(p95off), "p95-ratio")
	fmt.Printf("pod start (Run+Create+Start, %d pods): pipeline off p50 %v p95 %v | on p50 %v p95 %v | ratio p50 %.2f p95 %.2f\n",
		starts, p50off, p95off, p50on, p95on, float64(p50on)/float64(p50off), float64(p95on)/float64(p95off))
	fmt.Println("  upstream containerd-shim-runsc-v1: not measured here: it cannot start a pod without CAP_SYS_RESOURCE (oom_score_adj), see docs/benchmarks.md; Bulkhead gVisor with the pipeline off is the same gVisor library behind Bulkhead's own manager")
	if !runc {
		fmt.Println("  runc tier: not measured (" + runcTierMissing() + ")")
		return
	}
	p50u, p95u := percentile(runcUpstream, 0.5), percentile(runcUpstream, 0.95)
	p50r, p95r := percentile(runcOn, 0.5), percentile(runcOn, 0.95)
	b.ReportMetric(float64(p50u.Milliseconds()), "p50-runc-upstream-ms")
	b.ReportMetric(float64(p50r.Milliseconds()), "p50-runc-bulkhead-ms")
	b.ReportMetric(float64(p50r)/float64(p50u), "p50-runc-ratio")
	fmt.Printf("  runc: upstream containerd-shim-runc-v2 p50 %v p95 %v | Bulkhead runc tier (pipeline on) p50 %v p95 %v | ratio p50 %.2f p95 %.2f\n",
		p50u, p95u, p50r, p95r, float64(p50r)/float64(p50u), float64(p95r)/float64(p95u))
}
