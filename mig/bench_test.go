package mig

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// halfFullNode returns an 8-GPU H200 allocator filled to about half its
// compute with a fixed mix, so placement has real choices to weigh.
func halfFullNode(b *testing.B, s Strategy) *Allocator {
	a, err := NewAllocator(NodeGPUs("h200", 8), nil, WithStrategy(s))
	if err != nil {
		b.Fatal(err)
	}
	m, _ := Model("h200")
	rng := rand.New(rand.NewPCG(1, 2))
	used := 0
	for i := 0; used < 8*ComputeSlices/2 && i < 1000; i++ {
		p := m.Profiles[rng.IntN(len(m.Profiles)-1)] // no 7g
		if pl, err := a.Allocate(Request{Owner: fmt.Sprint("fill", i), Tenant: fmt.Sprint("t", i%5), Profile: p.Name}); err == nil {
			used += pl.Compute
		}
	}
	return a
}

func percentile(d []time.Duration, q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds()) / 1e3
}

// BenchmarkPlacement8GPU is the latency of one placement decision on a
// half-full 8-GPU node (target < 100 µs), for best fit and, as the baseline
// measured in the same run, first fit.
func BenchmarkPlacement8GPU(b *testing.B) {
	bf, ff := halfFullNode(b, BestFit), halfFullNode(b, FirstFit)
	m, _ := Model("h200")
	reqs := make([]Request, 0, 16)
	for i, p := range m.Profiles {
		reqs = append(reqs, Request{Owner: "bench", Tenant: "t9", Profile: p.Name})
		reqs = append(reqs, Request{Owner: "bench", Tenant: "t9", MinMemoryGB: p.MemoryGB, Isolation: []Isolation{IsolationShared, IsolationTenant}[i%2]})
	}
	var tb, tf []time.Duration
	i := 0
	for b.Loop() {
		r := reqs[i%len(reqs)]
		i++
		start := time.Now()
		bf.Allocate(r)
		tb = append(tb, time.Since(start))
		bf.Release("bench")
		start = time.Now()
		ff.Allocate(r)
		tf = append(tf, time.Since(start))
		ff.Release("bench")
	}
	b.ReportMetric(percentile(tb, 0.5), "bestfit-p50-µs")
	b.ReportMetric(percentile(tb, 0.99), "bestfit-p99-µs")
	b.ReportMetric(percentile(tf, 0.5), "firstfit-p50-µs")
	b.ReportMetric(percentile(tf, 0.99), "firstfit-p99-µs")
	b.ReportMetric(percentile(tb, 0.5)/percentile(tf, 0.5), "bestfit/firstfit-p50")
}

// BenchmarkRebuildAndPlace is what a shim process does per pod: rebuild the
// allocator from the node ledger's placements, then place one slice.
func BenchmarkRebuildAndPlace(b *testing.B) {
	st := halfFullNode(b, BestFit).State()
	var d []time.Duration
	for b.Loop() {
		start := time.Now()
		a, err := FromState(st)
		if err != nil {
			b.Fatal(err)
		}
		a.Allocate(Request{Owner: "bench", Tenant: "t9", Profile: "1g.18gb"})
		d = append(d, time.Since(start))
	}
	b.ReportMetric(percentile(d, 0.5), "p50-µs")
	b.ReportMetric(percentile(d, 0.99), "p99-µs")
}
