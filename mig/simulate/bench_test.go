package simulate

import (
	"errors"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// BenchmarkSimulate8GPU replays heavy-load synthetic traces (offered load
// 1.5x the node's compute, 2000 arrivals, 3 seeds) on 8 H200 GPUs and
// reports each strategy's acceptance, served compute and utilisation, and
// best fit's ratios to first fit (the baseline, same traces, same run).
func BenchmarkSimulate8GPU(b *testing.B) {
	const gpus, seeds = 8, 3
	sum := map[string]*Result{}
	order := []string{}
	for seed := uint64(1); seed <= seeds; seed++ {
		ev, err := Synthetic(SyntheticOptions{Model: "h200", GPUs: gpus, Seed: seed, Load: 1.5})
		if err != nil {
			b.Fatal(err)
		}
		rs, err := Compare(ev, "h200", gpus)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range rs {
			s, ok := sum[r.Strategy]
			if !ok {
				s = &Result{Strategy: r.Strategy}
				sum[r.Strategy] = s
				order = append(order, r.Strategy)
			}
			s.Acceptance += r.Acceptance / seeds
			s.ServedCompute += r.ServedCompute / seeds
			s.Utilisation += r.Utilisation / seeds
			s.Fragmentation += r.Fragmentation / seeds
		}
	}
	ev, _ := Synthetic(SyntheticOptions{Model: "h200", GPUs: gpus, Seed: 1, Load: 1.5})
	for b.Loop() {
		if _, err := Run(ev, "h200", gpus, mig.BestFit); err != nil {
			b.Fatal(err)
		}
	}
	short := map[string]string{"best-fit": "bestfit", "first-fit": "firstfit", "spread": "spread", "repack oracle": "repack"}
	for _, name := range order {
		s := sum[name]
		b.ReportMetric(s.Acceptance, short[name]+"-accept")
		b.ReportMetric(s.ServedCompute, short[name]+"-served")
		b.ReportMetric(s.Utilisation, short[name]+"-util")
	}
	bf, ff := sum["best-fit"], sum["first-fit"]
	b.ReportMetric(bf.Fragmentation, "bestfit-frag")
	b.ReportMetric(ff.Fragmentation, "firstfit-frag")
	b.ReportMetric(bf.Acceptance/ff.Acceptance, "bestfit/firstfit-accept")
	b.ReportMetric(bf.ServedCompute/ff.ServedCompute, "bestfit/firstfit-served")
	b.ReportMetric(bf.Utilisation/ff.Utilisation, "bestfit/firstfit-util")
}

// BenchmarkExactSmall compares acceptance with the exact optimum on small
// heavy-load instances (1 GPU x 24 arrivals, 2 GPUs x 10 arrivals, 8 seeds
// each): the optimum over every placement for a scheduler that accepts what
// fits, and the offline optimum that may also refuse.
func BenchmarkExactSmall(b *testing.B) {
	var bf, ff, ex, off float64
	n := 0
	for _, shape := range []struct{ gpus, arrivals int }{{1, 24}, {2, 10}} {
		for seed := uint64(1); seed <= 8; seed++ {
			ev, err := Synthetic(SyntheticOptions{Model: "h200", GPUs: shape.gpus, Seed: seed, Arrivals: shape.arrivals, Load: 1.5})
			if err != nil {
				b.Fatal(err)
			}
			e, err := RunExact(ev, "h200", shape.gpus)
			if errors.Is(err, ErrTooLarge) {
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			o, err := RunExactOffline(ev, "h200", shape.gpus)
			if err != nil {
				continue
			}
			rb, _ := Run(ev, "h200", shape.gpus, mig.BestFit)
			rf, _ := Run(ev, "h200", shape.gpus, mig.FirstFit)
			bf += float64(rb.Accepted)
			ff += float64(rf.Accepted)
			ex += float64(e.Accepted)
			off += float64(o.Accepted)
			n++
		}
	}
	ev, _ := Synthetic(SyntheticOptions{Model: "h200", GPUs: 1, Seed: 1, Arrivals: 24, Load: 1.5})
	for b.Loop() {
		if _, err := RunExact(ev, "h200", 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n), "instances")
	b.ReportMetric(bf/ex, "bestfit/exact")
	b.ReportMetric(ff/ex, "firstfit/exact")
	b.ReportMetric(bf/ff, "bestfit/firstfit")
	b.ReportMetric(bf/off, "bestfit/offline")
}
