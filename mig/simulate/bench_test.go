package simulate

import (
	"errors"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// pooled replays seeds 1..seeds of a synthetic trace through Compare and
// pools the figures by strategy; traces the exact optimum gives up on are
// left out when it is attempted, so every row covers the same traces.
func pooled(b *testing.B, o SyntheticOptions, seeds int) map[string]Result {
	var runs [][]Result
	for seed := 1; seed <= seeds; seed++ {
		o.Seed = uint64(seed)
		ev, err := Synthetic(o)
		if err != nil {
			b.Fatal(err)
		}
		rs, err := Compare(ev, o.Model, o.GPUs)
		if err != nil {
			b.Fatal(err)
		}
		exact := false
		for _, r := range rs {
			exact = exact || r.Strategy == "exact optimum"
		}
		if o.GPUs <= MaxExactGPUs && !exact {
			continue
		}
		runs = append(runs, rs)
	}
	out := map[string]Result{}
	for _, r := range Pool(runs) {
		out[r.Strategy] = r
	}
	out["traces"] = Result{Arrivals: len(runs)}
	return out
}

// BenchmarkSimulate8GPU replays heavy-load synthetic traces (offered load
// 1.5x the node's compute, 2000 arrivals, 12 seeds pooled) on 8 H200 GPUs
// and reports each strategy's acceptance, served compute and utilisation,
// and best fit's ratios to the baselines (same traces, same run): first
// fit at the lowest start, the driver's own placement order, and the
// scheduler's first fit over the devices mig/dra publishes.
func BenchmarkSimulate8GPU(b *testing.B) {
	const gpus = 8
	sum := pooled(b, SyntheticOptions{Model: "h200", GPUs: gpus, Load: 1.5}, 12)
	ev, _ := Synthetic(SyntheticOptions{Model: "h200", GPUs: gpus, Seed: 1, Load: 1.5})
	for b.Loop() {
		if _, err := Run(ev, "h200", gpus, mig.BestFit); err != nil {
			b.Fatal(err)
		}
	}
	short := map[string]string{"best-fit": "bestfit", "first-fit": "firstfit", "driver-order": "driver", "spread": "spread", "repack oracle": "repack",
		DRAFirstFit: "dra", DRAFirstFitAscending: "dra-ascending"}
	for name, s := range short {
		r := sum[name]
		b.ReportMetric(r.Acceptance, s+"-accept")
		b.ReportMetric(r.ServedCompute, s+"-served")
		b.ReportMetric(r.Utilisation, s+"-util")
	}
	bf := sum["best-fit"]
	for _, base := range []string{"first-fit", "driver-order", DRAFirstFit} {
		r := sum[base]
		b.ReportMetric(r.Fragmentation, short[base]+"-frag")
		b.ReportMetric(bf.Acceptance/r.Acceptance, "bestfit/"+short[base]+"-accept")
		b.ReportMetric(bf.ServedCompute/r.ServedCompute, "bestfit/"+short[base]+"-served")
	}
	b.ReportMetric(bf.Fragmentation, "bestfit-frag")
}

// BenchmarkExactSmall compares with the exact optima on small heavy-load
// instances (load 1.5; 1 GPU x 24 arrivals, 2 GPUs x 10 and x 16, 3 GPUs x
// 12; 12 seeds each, pooled): acceptance against the optimum over every
// placement for a scheduler that accepts what fits, served compute against
// the optimum that maximises it, and how far above first fit the optimum
// itself is (the most any placement strategy could gain over it).
func BenchmarkExactSmall(b *testing.B) {
	var bf, ff, drv, ex, bfc, exc float64
	for _, shape := range []struct{ gpus, arrivals int }{{1, 24}, {2, 10}, {2, 16}, {3, 12}} {
		sum := pooled(b, SyntheticOptions{Model: "h200", GPUs: shape.gpus, Arrivals: shape.arrivals, Load: 1.5}, 12)
		bf += float64(sum["best-fit"].Accepted)
		ff += float64(sum["first-fit"].Accepted)
		drv += float64(sum["driver-order"].Accepted)
		ex += float64(sum["exact optimum"].Accepted)
		bfc += float64(sum["best-fit"].served)
		exc += float64(sum["exact optimum (compute)"].served)
	}
	ev, _ := Synthetic(SyntheticOptions{Model: "h200", GPUs: 1, Seed: 1, Arrivals: 24, Load: 1.5})
	for b.Loop() {
		if _, err := RunExact(ev, "h200", 1); err != nil && !errors.Is(err, ErrTooLarge) {
			b.Fatal(err)
		}
	}
	b.ReportMetric(bf/ex, "bestfit/exact")
	b.ReportMetric(ff/ex, "firstfit/exact")
	b.ReportMetric(drv/ex, "driver/exact")
	b.ReportMetric(ex/ff, "exact/firstfit")
	b.ReportMetric(bfc/exc, "bestfit/exactcompute-served")
}
