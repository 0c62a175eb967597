package simulate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// Limits of the exact optimum: the search is exponential in the trace.
const (
	// MaxExactGPUs is the largest node RunExact accepts.
	MaxExactGPUs = 3
	// MaxExactArrivals is the longest trace (in arrivals) RunExact accepts.
	MaxExactArrivals = 40
	// maxExactStates bounds the memo; beyond it RunExact gives up.
	maxExactStates = 300_000
)

// computeUnit separates the two parts of RunExactCompute's objective; it
// exceeds MaxExactArrivals.
const computeUnit = 1000

// ErrTooLarge means an instance is too large for the exact optimum.
var ErrTooLarge = errors.New("instance too large for the exact optimum")

// exact finds the most arrivals a placement strategy could accept on the
// trace without moving a slice once placed, knowing every future event. It
// is a memoised search over every placement (and, with admission control,
// every accept/reject decision); GPUs with the same live slices are
// interchangeable.
type exact struct {
	// admission lets the optimum turn away a request that would fit.
	// Without it the optimum is work-conserving like the allocator: a
	// request is accepted whenever some placement exists, and only the
	// choice of placement is optimised.
	admission bool
	// byCompute maximises accepted compute slices instead of accepted
	// requests.
	byCompute bool
	model     *mig.GPUModel
	events    []Event
	prof      []*mig.Profile // per event (arrivals)
	iso       []mig.Isolation
	tenant    []string
	gpus      []mig.Occupancy
	holders   [][]holder // per GPU, the live slices
	memo      map[string]int
	gain      []int // per arrival: 1, or with byCompute its compute slices × computeUnit + 1
	after     []int // gain of the arrivals from event i on
}

type holder struct {
	event int // index of the arrival
	start int
}

// RunExact computes the best acceptance any placement choice could reach
// on a small instance, accepting every request that fits somewhere as the
// allocator does: the exact optimum for the placement decision, and so the
// bound Bulkhead's best fit is measured against. Served compute,
// fragmentation and utilisation are measured on one optimal path (the
// first optimal placement at every arrival); only the acceptance is
// optimal, another optimal path may score differently on them.
func RunExact(events []Event, model string, gpus int) (Result, error) {
	return runExact(events, model, gpus, false, false)
}

// RunExactCompute is RunExact maximising accepted compute slices (the
// served compute) instead of accepted requests: the bound for the packing
// itself, which counting requests does not measure (a placement that keeps
// a later 7g out and three 1g in wins on requests). Among the placements
// with the most compute it takes one with the most requests; its
// ServedCompute is optimal.
func RunExactCompute(events []Event, model string, gpus int) (Result, error) {
	return runExact(events, model, gpus, false, true)
}

// RunExactOffline is RunExact with admission control: the optimum may also
// refuse a request that fits to make room for later ones. No online
// strategy that accepts what fits can reach it; it shows what knowing the
// future is worth.
func RunExactOffline(events []Event, model string, gpus int) (Result, error) {
	return runExact(events, model, gpus, true, false)
}

func runExact(events []Event, model string, gpus int, admission, byCompute bool) (Result, error) {
	m, err := mig.Model(model)
	if err != nil {
		return Result{}, err
	}
	arrivals := 0
	for _, e := range events {
		if e.Kind == Arrive {
			arrivals++
		}
	}
	if gpus < 1 || gpus > MaxExactGPUs || arrivals > MaxExactArrivals {
		return Result{}, fmt.Errorf("%w: %d GPUs and %d arrivals (at most %d and %d)", ErrTooLarge, gpus, arrivals, MaxExactGPUs, MaxExactArrivals)
	}
	x := &exact{admission: admission, byCompute: byCompute, model: m, events: events, gpus: make([]mig.Occupancy, gpus), holders: make([][]holder, gpus),
		memo: map[string]int{}, prof: make([]*mig.Profile, len(events)), iso: make([]mig.Isolation, len(events)),
		tenant: make([]string, len(events)), after: make([]int, len(events)+1), gain: make([]int, len(events))}
	for i := len(events) - 1; i >= 0; i-- {
		x.after[i] = x.after[i+1]
		e := events[i]
		if e.Kind != Arrive {
			continue
		}
		p, err := m.Profile(e.Profile)
		if err != nil {
			return Result{}, fmt.Errorf("event %d (%s): %w", i+1, e.ID, err)
		}
		x.prof[i], x.iso[i], x.tenant[i] = p, e.Isolation, e.Tenant
		x.gain[i] = 1
		if byCompute {
			// Lexicographic: most compute, then most requests.
			x.gain[i] = p.Compute*computeUnit + 1
		}
		x.after[i] += x.gain[i]
	}
	best, err := x.solve(0, map[string]int{})
	if err != nil {
		return Result{}, err
	}
	r, err := x.replay(best, gpus)
	if err != nil {
		return Result{}, err
	}
	r.Strategy = "exact optimum"
	switch {
	case admission:
		r.Strategy = "offline optimum (admission control)"
	case byCompute:
		r.Strategy = "exact optimum (compute)"
	}
	return r, nil
}

// replay walks one optimal path (the first optimal choice at every arrival,
// in the order solve tries them) and measures it as Run measures a
// strategy: acceptance, served compute, fragmentation and utilisation.
func (x *exact) replay(best, gpus int) (Result, error) {
	var r Result
	live := map[string]int{}
	used, fragSum, fragN := 0, 0.0, 0
	var integral, last float64
	for i, e := range x.events {
		integral += float64(used) * (e.Time - last)
		last = e.Time
		if e.Kind == Depart {
			g, ok := live[e.ID]
			if !ok {
				continue
			}
			hs := x.holders[g]
			for k := range hs {
				if x.events[hs[k].event].ID == e.ID {
					x.gpus[g].Remove(x.prof[hs[k].event], hs[k].start)
					used -= x.prof[hs[k].event].Compute
					x.holders[g] = append(append([]holder(nil), hs[:k]...), hs[k+1:]...)
					break
				}
			}
			delete(live, e.ID)
			continue
		}
		r.Arrivals++
		r.arrive(e.Profile)
		p := x.prof[i]
		r.requested += p.Compute
		for g := range x.gpus {
			if f, ok := fragmentationOf(x.model, x.gpus[g]); ok {
				fragSum += f
				fragN++
			}
		}
		target, err := x.solve(i, live)
		if err != nil {
			return Result{}, err
		}
		if x.admission {
			v, err := x.solve(i+1, live)
			if err != nil {
				return Result{}, err
			}
			if v == target {
				continue // refused on purpose
			}
		}
		placed := false
		triedEmpty := false
		for g := 0; g < len(x.gpus) && !placed; g++ {
			if x.gpus[g].Empty() {
				if triedEmpty {
					continue
				}
				triedEmpty = true
			}
			if !x.admits(g, i) {
				continue
			}
			for _, st := range p.Starts {
				if !x.gpus[g].Fits(p, st) {
					continue
				}
				x.gpus[g].Add(p, st)
				hs := x.holders[g]
				x.holders[g] = append(append([]holder(nil), hs...), holder{event: i, start: st})
				live[e.ID] = g
				v, err := x.solve(i+1, live)
				if err != nil {
					return Result{}, err
				}
				if v+x.gain[i] == target {
					placed = true
					break
				}
				delete(live, e.ID)
				x.holders[g] = hs
				x.gpus[g].Remove(p, st)
			}
		}
		if placed {
			r.Accepted++
			r.accept(e.Profile)
			r.served += p.Compute
			used += p.Compute
		}
	}
	if got := x.pathValue(r); got != best {
		return Result{}, fmt.Errorf("exact optimum: replayed path is worth %d, the search found %d", got, best)
	}
	r.finish(integral, last, gpus)
	r.Fragmentation = math.NaN()
	if fragN > 0 {
		r.Fragmentation = fragSum / float64(fragN)
	}
	return r, nil
}

// pathValue is the objective of a replayed path.
func (x *exact) pathValue(r Result) int {
	if x.byCompute {
		return r.served*computeUnit + r.Accepted
	}
	return r.Accepted
}

// fragmentationOf is fragmentation's term for one GPU: 1 - largest
// profile that still fits / free compute, and false when no compute is free.
func fragmentationOf(m *mig.GPUModel, o mig.Occupancy) (float64, bool) {
	free := mig.ComputeSlices - o.Compute()
	if free <= 0 {
		return 0, false
	}
	largest := 0
	for pi := range m.Profiles {
		p := &m.Profiles[pi]
		if p.Compute <= largest {
			continue
		}
		for _, st := range p.Starts {
			if o.Fits(p, st) {
				largest = p.Compute
				break
			}
		}
	}
	return 1 - float64(largest)/float64(free), true
}

func (x *exact) key(i int) string {
	parts := make([]string, len(x.holders))
	for g, hs := range x.holders {
		ids := make([]string, len(hs))
		for k, h := range hs {
			ids[k] = strconv.Itoa(h.event) + "@" + strconv.Itoa(h.start)
		}
		sort.Strings(ids)
		parts[g] = strings.Join(ids, ",")
	}
	sort.Strings(parts)
	return strconv.Itoa(i) + "|" + strings.Join(parts, "|")
}

// admits applies the co-tenancy rules of the allocator.
func (x *exact) admits(g, ev int) bool {
	for _, h := range x.holders[g] {
		switch {
		case x.iso[ev] == mig.IsolationExclusive,
			x.iso[h.event] == mig.IsolationExclusive,
			x.iso[h.event] == mig.IsolationTenant && x.tenant[h.event] != x.tenant[ev],
			x.iso[ev] == mig.IsolationTenant && x.tenant[h.event] != x.tenant[ev]:
			return false
		}
	}
	return true
}

// solve returns the most arrivals acceptable from event i on. live maps
// the ids of accepted, not yet departed slices to their GPU.
func (x *exact) solve(i int, live map[string]int) (int, error) {
	for i < len(x.events) && x.events[i].Kind == Depart {
		e := x.events[i]
		g, ok := live[e.ID]
		if !ok {
			i++
			continue
		}
		// Depart, recurse, restore.
		hs := x.holders[g]
		var k int
		for k = range hs {
			if x.events[hs[k].event].ID == e.ID {
				break
			}
		}
		h := hs[k]
		x.gpus[g].Remove(x.prof[h.event], h.start)
		x.holders[g] = append(append([]holder(nil), hs[:k]...), hs[k+1:]...)
		delete(live, e.ID)
		v, err := x.solve(i+1, live)
		live[e.ID] = g
		x.holders[g] = hs
		x.gpus[g].Add(x.prof[h.event], h.start)
		return v, err
	}
	if i >= len(x.events) {
		return 0, nil
	}
	key := x.key(i)
	if v, ok := x.memo[key]; ok {
		return v, nil
	}
	if len(x.memo) >= maxExactStates {
		return 0, fmt.Errorf("%w: more than %d states", ErrTooLarge, maxExactStates)
	}
	e := x.events[i]
	p := x.prof[i]
	best, placed := -1, false
	if x.admission {
		v, err := x.solve(i+1, live) // reject
		if err != nil {
			return 0, err
		}
		best = v
	}
	triedEmpty := false
	for g := range x.gpus {
		if best == x.after[i] {
			break // every remaining arrival accepted: nothing can beat it
		}
		if x.gpus[g].Empty() {
			if triedEmpty {
				continue // empty GPUs are interchangeable
			}
			triedEmpty = true
		}
		if !x.admits(g, i) {
			continue
		}
		for _, st := range p.Starts {
			if !x.gpus[g].Fits(p, st) {
				continue
			}
			placed = true
			x.gpus[g].Add(p, st)
			hs := x.holders[g]
			x.holders[g] = append(append([]holder(nil), hs...), holder{event: i, start: st})
			live[e.ID] = g
			v, err := x.solve(i+1, live)
			delete(live, e.ID)
			x.holders[g] = hs
			x.gpus[g].Remove(p, st)
			if err != nil {
				return 0, err
			}
			if v+x.gain[i] > best {
				best = v + x.gain[i]
			}
		}
	}
	if !placed && !x.admission {
		v, err := x.solve(i+1, live) // nothing fits: refused
		if err != nil {
			return 0, err
		}
		best = v
	}
	x.memo[key] = best
	return best, nil
}
