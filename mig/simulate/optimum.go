package simulate

import (
	"fmt"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// MaxRepackGPUs is the largest node the repack oracle is computed for:
// counts per profile are packed in 6 bits (at most 7 per GPU).
const MaxRepackGPUs = 8

const bitsPerProfile = 6

// optimum (the repack oracle) decides exactly whether a multiset of slices fits on k GPUs if
// every slice may be moved (repacked) at will. A GPU's content is one of the
// model's Configurations. The search puts the largest remaining profile on
// the next GPU together with a combination that is maximal for what remains
// (any packing can be rearranged into that form, since dropping slices from
// a feasible GPU keeps it feasible); answers are memoised for the run.
type optimum struct {
	nprof   int
	configs []uint64        // encoded configurations, empty excluded
	isCfg   map[uint64]bool // for the maximality test
	memo    map[uint64]bool // (k, remaining) -> fits
	compute []int
}

func newOptimum(m *mig.GPUModel) *optimum {
	o := &optimum{nprof: len(m.Profiles), isCfg: map[uint64]bool{}, memo: map[uint64]bool{}}
	for _, p := range m.Profiles {
		o.compute = append(o.compute, p.Compute)
	}
	for _, c := range m.Configurations() {
		enc := uint64(0)
		for i, n := range c {
			enc |= uint64(n) << (bitsPerProfile * i)
		}
		o.isCfg[enc] = true
		if enc != 0 {
			o.configs = append(o.configs, enc)
		}
	}
	return o
}

func (o *optimum) count(v uint64, i int) int {
	return int(v>>(bitsPerProfile*i)) & (1<<bitsPerProfile - 1)
}

// leq reports c <= v per profile.
func (o *optimum) leq(c, v uint64) bool {
	for i := 0; i < o.nprof; i++ {
		if o.count(c, i) > o.count(v, i) {
			return false
		}
	}
	return true
}

func (o *optimum) fits(k int, v uint64) bool {
	if v == 0 {
		return true
	}
	if k == 0 {
		return false
	}
	compute, largest := 0, -1
	for i := 0; i < o.nprof; i++ {
		n := o.count(v, i)
		compute += n * o.compute[i]
		if n > 0 {
			largest = i
		}
	}
	if compute > mig.ComputeSlices*k {
		return false
	}
	key := uint64(k)<<56 | v
	if r, ok := o.memo[key]; ok {
		return r
	}
	r := false
	for _, c := range o.configs {
		if o.count(c, largest) == 0 || !o.leq(c, v) || !o.maximal(c, v) {
			continue
		}
		if o.fits(k-1, v-c) {
			r = true
			break
		}
	}
	o.memo[key] = r
	return r
}

// maximal: no further slice of v fits next to c on the same GPU.
func (o *optimum) maximal(c, v uint64) bool {
	for i := 0; i < o.nprof; i++ {
		if o.count(c, i) < o.count(v, i) && o.isCfg[c+1<<(bitsPerProfile*i)] {
			return false
		}
	}
	return true
}

// RunRepack replays events accepting an arrival whenever the live slices
// plus the new one can be packed on the node in any arrangement, as if every
// slice could be moved at every arrival. It shows how much fragmentation
// costs in utilisation; it is not a bound on acceptance (accepting every
// large slice that fits can turn away more small ones later). Tenant
// isolation is relaxed (the result's name says so when the trace uses it).
func RunRepack(events []Event, model string, gpus int) (Result, error) {
	m, err := mig.Model(model)
	if err != nil {
		return Result{}, err
	}
	if gpus < 1 || gpus > MaxRepackGPUs {
		return Result{}, fmt.Errorf("repack oracle: gpus %d: must be 1..%d", gpus, MaxRepackGPUs)
	}
	o := newOptimum(m)
	index := map[string]int{}
	for i, p := range m.Profiles {
		index[p.Name] = i
	}
	r := Result{Strategy: "repack oracle"}
	relaxed := false
	live := map[string]int{}
	var v uint64
	used := 0
	var integral, last float64
	for i, e := range events {
		integral += float64(used) * (e.Time - last)
		last = e.Time
		if e.Kind == Depart {
			if pi, ok := live[e.ID]; ok {
				v -= 1 << (bitsPerProfile * pi)
				used -= m.Profiles[pi].Compute
				delete(live, e.ID)
			}
			continue
		}
		pi, ok := index[e.Profile]
		if !ok {
			return Result{}, fmt.Errorf("event %d (%s): profile %q: not a %s profile", i+1, e.ID, e.Profile, m.Name)
		}
		relaxed = relaxed || e.Isolation != mig.IsolationShared
		r.Arrivals++
		r.arrive(e.Profile)
		r.requested += m.Profiles[pi].Compute
		next := v + 1<<(bitsPerProfile*pi)
		if o.count(v, pi) >= m.Profiles[pi].Instances*gpus || !o.fits(gpus, next) {
			continue
		}
		v = next
		live[e.ID] = pi
		used += m.Profiles[pi].Compute
		r.served += m.Profiles[pi].Compute
		r.Accepted++
		r.accept(e.Profile)
	}
	if relaxed {
		r.Strategy = "repack oracle (isolation relaxed)"
	}
	r.finish(integral, last, gpus)
	r.Fragmentation = nan()
	return r, nil
}
