// Package simulate replays arrival/departure traces of MIG slice requests
// against a node and measures how well a placement strategy packs them:
// acceptance rate, served compute, fragmentation and slice utilisation, for
// Bulkhead's best fit and the baselines (first fit at the lowest start, the
// driver's own placement order, spreading, and the Kubernetes scheduler's
// first fit over the devices mig/dra publishes), against the exact optima of
// small instances (every placement tried, the future known) and a repack
// oracle that may move every slice at every arrival.
//
// Invariant: every strategy sees the same events in the same order; a
// request refused by a strategy never departs from it.
package simulate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// Kind is an event's kind.
type Kind int

const (
	// Arrive is a new slice request.
	Arrive Kind = iota
	// Depart releases the slice of an earlier arrival.
	Depart
)

// Event is one line of a trace.
type Event struct {
	Time      float64
	Kind      Kind
	ID        string
	Tenant    string        // arrivals only
	Profile   string        // arrivals only
	Isolation mig.Isolation // arrivals only
}

// ParseTrace reads a text trace, one event per line, '#' starts a comment:
//
//	<time> arrive <id> <tenant> <profile> [tenant|exclusive]
//	<time> depart <id>
//
// Times must not decrease; ids must be unique among live requests.
func ParseTrace(r io.Reader) ([]Event, error) {
	var out []Event
	live := map[string]bool{}
	last := math.Inf(-1)
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		t := sc.Text()
		if i := strings.IndexByte(t, '#'); i >= 0 {
			t = t[:i]
		}
		f := strings.Fields(t)
		if len(f) == 0 {
			continue
		}
		if len(f) < 3 {
			return nil, fmt.Errorf("trace line %d: %q: want <time> arrive|depart <id> ...", line, strings.TrimSpace(t))
		}
		tm, err := strconv.ParseFloat(f[0], 64)
		if err != nil || math.IsNaN(tm) || math.IsInf(tm, 0) || tm < 0 {
			return nil, fmt.Errorf("trace line %d: time %q: want a non-negative number", line, f[0])
		}
		if tm < last {
			return nil, fmt.Errorf("trace line %d: time %g is before the previous event's %g", line, tm, last)
		}
		last = tm
		e := Event{Time: tm, ID: f[2]}
		switch f[1] {
		case "arrive":
			if len(f) < 5 || len(f) > 6 {
				return nil, fmt.Errorf("trace line %d: arrive: want <time> arrive <id> <tenant> <profile> [tenant|exclusive]", line)
			}
			if live[e.ID] {
				return nil, fmt.Errorf("trace line %d: id %s: already live", line, e.ID)
			}
			e.Kind, e.Tenant, e.Profile = Arrive, f[3], f[4]
			if len(f) == 6 {
				e.Isolation = mig.Isolation(f[5])
				if e.Isolation != mig.IsolationTenant && e.Isolation != mig.IsolationExclusive {
					return nil, fmt.Errorf("trace line %d: isolation %q: want tenant or exclusive", line, f[5])
				}
			}
			live[e.ID] = true
		case "depart":
			if len(f) != 3 {
				return nil, fmt.Errorf("trace line %d: depart: want <time> depart <id>", line)
			}
			if !live[e.ID] {
				return nil, fmt.Errorf("trace line %d: id %s: departs without arriving", line, e.ID)
			}
			e.Kind = Depart
			delete(live, e.ID)
		default:
			return nil, fmt.Errorf("trace line %d: event %q: want arrive or depart", line, f[1])
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace: no events")
	}
	return out, nil
}

// WriteTrace writes events in ParseTrace's format.
func WriteTrace(w io.Writer, events []Event) error {
	bw := bufio.NewWriter(w)
	for _, e := range events {
		if e.Kind == Depart {
			fmt.Fprintf(bw, "%.4f depart %s\n", e.Time, e.ID)
			continue
		}
		fmt.Fprintf(bw, "%.4f arrive %s %s %s", e.Time, e.ID, e.Tenant, e.Profile)
		if e.Isolation != "" {
			fmt.Fprintf(bw, " %s", e.Isolation)
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// DefaultMix is the share of requests per profile shape, in the model's
// profile order (1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g): mostly small
// inference and agent slices, some training-sized ones.
var DefaultMix = []float64{0.30, 0.02, 0.13, 0.20, 0.15, 0.10, 0.10}

// Mixes are named request mixes (shares per profile shape, as DefaultMix)
// for measuring how a strategy depends on the workload.
var Mixes = map[string][]float64{
	// mixed is DefaultMix.
	"mixed": DefaultMix,
	// small: inference and notebook tenants, hardly any whole GPU.
	"small": {0.45, 0.02, 0.20, 0.20, 0.08, 0.03, 0.02},
	// large: training tenants, half the requests 4g or 7g.
	"large": {0.10, 0.00, 0.05, 0.15, 0.20, 0.25, 0.25},
	// uniform: every shape equally likely.
	"uniform": {1, 1, 1, 1, 1, 1, 1},
}

// MixNames lists the keys of Mixes in a fixed order.
func MixNames() []string { return []string{"mixed", "small", "large", "uniform"} }

// Lifetime distributions of synthetic requests.
const (
	// Exponential lifetimes: one mean, coefficient of variation 1.
	Exponential = "exponential"
	// Bimodal lifetimes: 80% short requests (mean a quarter of the
	// overall mean) and 20% long ones (four times it), each exponential.
	// Same mean, so the same offered load, with a coefficient of
	// variation of about 2.3: mixed tenants run short inference and CI
	// jobs next to long-lived services and training.
	Bimodal = "bimodal"
)

// SyntheticOptions shape a synthetic trace.
type SyntheticOptions struct {
	// Model is the GPU model whose profile names the trace uses.
	Model string
	// GPUs is the node size the load is computed for.
	GPUs int
	// Seed makes the trace reproducible.
	Seed uint64
	// Arrivals is the number of requests (default 2000).
	Arrivals int
	// Load is the offered compute as a share of the node's (default 1.2:
	// heavy load, more is asked than fits).
	Load float64
	// Tenants is the number of tenants (default 8).
	Tenants int
	// IsolatedShare is the share of requests that keep their GPU to their
	// tenant (IsolationTenant). Default 0.
	IsolatedShare float64
	// Mix overrides DefaultMix.
	Mix []float64
	// Lifetimes is Exponential (default) or Bimodal.
	Lifetimes string
}

// Synthetic generates a Poisson arrival trace with exponential lifetimes.
func Synthetic(o SyntheticOptions) ([]Event, error) {
	m, err := mig.Model(o.Model)
	if err != nil {
		return nil, err
	}
	if o.GPUs < 1 {
		return nil, fmt.Errorf("synthetic: gpus %d: must be at least 1", o.GPUs)
	}
	if o.Arrivals == 0 {
		o.Arrivals = 2000
	}
	if o.Load == 0 {
		o.Load = 1.2
	}
	if o.Tenants == 0 {
		o.Tenants = 8
	}
	if o.Mix == nil {
		o.Mix = DefaultMix
	}
	if o.Lifetimes == "" {
		o.Lifetimes = Exponential
	}
	switch {
	case o.Arrivals < 1:
		return nil, fmt.Errorf("synthetic: arrivals %d: must be positive", o.Arrivals)
	case o.Load < 0:
		return nil, fmt.Errorf("synthetic: load %g: must be positive", o.Load)
	case o.IsolatedShare < 0 || o.IsolatedShare > 1:
		return nil, fmt.Errorf("synthetic: isolated share %g: must be 0..1", o.IsolatedShare)
	case o.Lifetimes != Exponential && o.Lifetimes != Bimodal:
		return nil, fmt.Errorf("synthetic: lifetimes %q: want %s or %s", o.Lifetimes, Exponential, Bimodal)
	case len(o.Mix) != len(m.Profiles):
		return nil, fmt.Errorf("synthetic: mix has %d shares, %s has %d profiles", len(o.Mix), m.Name, len(m.Profiles))
	}
	total, meanCompute := 0.0, 0.0
	for i, w := range o.Mix {
		if w < 0 {
			return nil, fmt.Errorf("synthetic: mix share %d is negative", i)
		}
		total += w
		meanCompute += w * float64(m.Profiles[i].Compute)
	}
	if total == 0 {
		return nil, fmt.Errorf("synthetic: mix is all zero")
	}
	meanCompute /= total
	// Arrival rate 1: Little's law gives the mean lifetime for the load.
	meanLife := o.Load * float64(mig.ComputeSlices*o.GPUs) / meanCompute
	rng := rand.New(rand.NewPCG(o.Seed, 0x6d6967))
	lifeRng := rand.New(rand.NewPCG(o.Seed, 0x6c696665))
	var events []Event
	t := 0.0
	for i := 0; i < o.Arrivals; i++ {
		t += rng.ExpFloat64()
		x := rng.Float64() * total
		pi := 0
		for ; pi < len(o.Mix)-1 && x >= o.Mix[pi]; pi++ {
			x -= o.Mix[pi]
		}
		e := Event{Time: t, Kind: Arrive, ID: fmt.Sprintf("r%d", i), Tenant: fmt.Sprintf("t%d", rng.IntN(o.Tenants)), Profile: m.Profiles[pi].Name}
		if rng.Float64() < o.IsolatedShare {
			e.Isolation = mig.IsolationTenant
		}
		life := meanLife
		if o.Lifetimes == Bimodal {
			// A separate stream: both models share arrivals,
			// profiles, tenants and draws for a seed.
			if lifeRng.Float64() < 0.8 {
				life = meanLife / 4
			} else {
				life = meanLife * 4
			}
		}
		events = append(events, e, Event{Time: t + rng.ExpFloat64()*life, Kind: Depart, ID: e.ID})
	}
	sort.SliceStable(events, func(i, j int) bool {
		if events[i].Time != events[j].Time {
			return events[i].Time < events[j].Time
		}
		return events[i].Kind == Depart && events[j].Kind == Arrive
	})
	return events, nil
}

// Result is one strategy's figures over a trace.
type Result struct {
	Strategy string
	Arrivals int
	Accepted int
	// Acceptance is Accepted / Arrivals.
	Acceptance float64
	// ServedCompute is the share of requested compute slices accepted:
	// acceptance weighted by slice size. Counting requests alone rewards
	// turning away large slices; this does not. NaN where not tracked.
	ServedCompute float64
	requested     int
	served        int
	// Fragmentation is the mean, over arrivals and over GPUs with free
	// compute, of 1 - (largest profile that still fits / free compute).
	// NaN where placements are not tracked (the repack oracle).
	Fragmentation float64
	// Utilisation is the time-averaged share of compute slices in use.
	Utilisation float64
	// ByProfile counts arrivals and acceptances per profile name: where a
	// strategy's acceptance comes from (protecting room for large slices
	// costs small ones, and counting requests rewards the opposite).
	ByProfile map[string]Count
}

// Count is the arrivals and acceptances of one profile.
type Count struct {
	Arrivals, Accepted int
}

func (r *Result) arrive(profile string) {
	if r.ByProfile == nil {
		r.ByProfile = map[string]Count{}
	}
	c := r.ByProfile[profile]
	c.Arrivals++
	r.ByProfile[profile] = c
}

func (r *Result) accept(profile string) {
	c := r.ByProfile[profile]
	c.Accepted++
	r.ByProfile[profile] = c
}

// Run replays events on a node of gpus GPUs with a strategy.
func Run(events []Event, model string, gpus int, s mig.Strategy) (Result, error) {
	a, err := mig.NewAllocator(mig.NodeGPUs(model, gpus), nil, mig.WithStrategy(s))
	if err != nil {
		return Result{}, err
	}
	r := Result{Strategy: s.String()}
	accepted := map[string]int{}
	used, fragSum, fragN := 0, 0.0, 0
	var integral, last float64
	for i, e := range events {
		integral += float64(used) * (e.Time - last)
		last = e.Time
		if e.Kind == Depart {
			if c, ok := accepted[e.ID]; ok {
				a.Release(e.ID)
				used -= c
				delete(accepted, e.ID)
			}
			continue
		}
		r.Arrivals++
		r.arrive(e.Profile)
		if prof, err := profileOf(model, e.Profile); err == nil {
			r.requested += prof.Compute
		}
		f, n := fragmentation(a)
		fragSum += f
		fragN += n
		p, err := a.Allocate(mig.Request{Owner: e.ID, Tenant: e.Tenant, Profile: e.Profile, Isolation: e.Isolation})
		if err != nil {
			if !isInsufficient(err) {
				return Result{}, fmt.Errorf("event %d (%s): %w", i+1, e.ID, err)
			}
			continue
		}
		r.Accepted++
		r.accept(e.Profile)
		r.served += p.Compute
		accepted[e.ID] = p.Compute
		used += p.Compute
	}
	r.finish(integral, last, gpus)
	r.Fragmentation = math.NaN()
	if fragN > 0 {
		r.Fragmentation = fragSum / float64(fragN)
	}
	return r, nil
}

func isInsufficient(err error) bool {
	return errors.Is(err, mig.ErrInsufficientResources)
}

func (r *Result) finish(integral, end float64, gpus int) {
	if r.Arrivals > 0 {
		r.Acceptance = float64(r.Accepted) / float64(r.Arrivals)
	}
	r.ServedCompute = math.NaN()
	if r.requested > 0 {
		r.ServedCompute = float64(r.served) / float64(r.requested)
	}
	if end > 0 {
		r.Utilisation = integral / end / float64(mig.ComputeSlices*gpus)
	}
}

func fragmentation(a *mig.Allocator) (float64, int) {
	sum, n := 0.0, 0
	for _, u := range a.Usage() {
		free := mig.ComputeSlices - u.Compute
		if free <= 0 {
			continue
		}
		sum += 1 - float64(u.LargestFree)/float64(free)
		n++
	}
	return sum, n
}

// Strategies are the strategies Compare replays, Bulkhead's first.
var Strategies = []mig.Strategy{mig.BestFit, mig.FirstFit, mig.DriverOrder, mig.Spread}

// Compare runs Strategies over the same events, then the scheduler's first
// fit over the published devices in each of DRAOrders (traces without
// isolated requests only, see RunDRA), then the exact optima
// (requests and compute) when the instance is small enough (see RunExact),
// and the repack oracle when the node is (see RunRepack).
func Compare(events []Event, model string, gpus int) ([]Result, error) {
	var out []Result
	for _, s := range Strategies {
		r, err := Run(events, model, gpus, s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if !hasIsolation(events) {
		for _, o := range DRAOrders {
			r, err := RunDRA(events, model, gpus, o)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
	}
	for _, exact := range []func([]Event, string, int) (Result, error){RunExact, RunExactCompute} {
		r, err := exact(events, model, gpus)
		switch {
		case err == nil:
			out = append(out, r)
		case !errors.Is(err, ErrTooLarge):
			return nil, err
		}
	}
	if gpus <= MaxRepackGPUs {
		r, err := RunRepack(events, model, gpus)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func nan() float64 { return math.NaN() }

func profileOf(model, name string) (*mig.Profile, error) {
	m, err := mig.Model(model)
	if err != nil {
		return nil, err
	}
	return m.Profile(name)
}

// Pool merges the results of several runs (one Compare per trace) by
// strategy, in the order of the first run: acceptance and served compute
// pooled over every arrival, fragmentation and utilisation averaged over
// the runs. A strategy missing from a run (an exact optimum that gave up)
// is dropped, so every pooled figure covers the same traces.
func Pool(runs [][]Result) []Result {
	if len(runs) == 0 {
		return nil
	}
	var out []Result
	for _, first := range runs[0] {
		p := Result{Strategy: first.Strategy}
		complete := true
		for _, run := range runs {
			found := false
			for _, r := range run {
				if r.Strategy != first.Strategy {
					continue
				}
				found = true
				p.Arrivals += r.Arrivals
				p.Accepted += r.Accepted
				p.requested += r.requested
				p.served += r.served
				p.Fragmentation += r.Fragmentation / float64(len(runs))
				for name, c := range r.ByProfile {
					if p.ByProfile == nil {
						p.ByProfile = map[string]Count{}
					}
					q := p.ByProfile[name]
					q.Arrivals += c.Arrivals
					q.Accepted += c.Accepted
					p.ByProfile[name] = q
				}
				p.Utilisation += r.Utilisation / float64(len(runs))
			}
			complete = complete && found
		}
		if !complete {
			continue
		}
		if p.Arrivals > 0 {
			p.Acceptance = float64(p.Accepted) / float64(p.Arrivals)
		}
		p.ServedCompute = math.NaN()
		if p.requested > 0 {
			p.ServedCompute = float64(p.served) / float64(p.requested)
		}
		out = append(out, p)
	}
	return out
}
