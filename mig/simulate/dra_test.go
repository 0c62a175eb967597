package simulate

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// TestDRAFirstFitNeverOversubscribes allocates and releases at random on
// a published node and checks, after every step, that no counter is below
// zero or above what was published and that the devices held at once are a
// placement the hardware accepts.
func TestDRAFirstFitNeverOversubscribes(t *testing.T) {
	for _, o := range DRAOrders {
		t.Run(o.String(), func(t *testing.T) {
			const gpus = 3
			m, _ := mig.Model("h200")
			node, err := newDRANode("h200", gpus, o)
			if err != nil {
				t.Fatal(err)
			}
			initial := map[string]map[string]int64{}
			for set, cs := range node.avail {
				initial[set] = map[string]int64{}
				for k, v := range cs {
					initial[set][k] = v
				}
			}
			rng := rand.New(rand.NewPCG(7, 11))
			var held []int
			accepted := 0
			for step := 0; step < 5000; step++ {
				if len(held) > 0 && rng.IntN(3) == 0 {
					i := rng.IntN(len(held))
					node.release(held[i])
					held = append(held[:i], held[i+1:]...)
				} else if d := node.allocate(m.Profiles[rng.IntN(len(m.Profiles))].Name); d >= 0 {
					held = append(held, d)
					accepted++
				}
				for set, cs := range node.avail {
					for k, v := range cs {
						if v < 0 || v > initial[set][k] {
							t.Fatalf("step %d: counter %s/%s = %d (published %d)", step, set, k, v, initial[set][k])
						}
					}
				}
				occ := make([]mig.Occupancy, gpus)
				for _, d := range held {
					part := node.devices[d].part
					prof, _ := m.Profile(part.Profile)
					if !occ[part.GPU].Fits(prof, part.Start) {
						t.Fatalf("step %d: %s held with devices the hardware cannot hold at once", step, node.devices[d].name)
					}
					occ[part.GPU].Add(prof, part.Start)
				}
			}
			if accepted < 1000 {
				t.Fatalf("only %d allocations in 5000 steps: the walk does not exercise full GPUs", accepted)
			}
		})
	}
}

// TestDRAFirstFitHandTrace replays a tiny trace on one H200 and checks each
// arrival's device against placements worked out by hand from the
// published orders.
func TestDRAFirstFitHandTrace(t *testing.T) {
	const trace = `0 arrive a t 1g.18gb
1 arrive b t 4g.71gb
2 depart a
3 arrive c t 3g.71gb
4 arrive d t 1g.18gb
5 arrive e t 2g.35gb
`
	tests := []struct {
		order dra.Order
		want  []string // device per arrival, "" when refused
	}{
		// Preferred: a 1g at slot 6 keeps the 4g's slots free; the 3g
		// then takes 4 (a left), and the GPU's 7 compute slices are used.
		{dra.OrderPreferred, []string{"gpu0-1g-18gb-at6", "gpu0-4g-71gb-at0", "gpu0-3g-71gb-at4", "", ""}},
		// Ascending: the 1g at slot 0 keeps the 4g out; the 3g goes to
		// 0, then a 1g to 4 and the 2g finds no pair left.
		{dra.OrderAscending, []string{"gpu0-1g-18gb-at0", "", "gpu0-3g-71gb-at0", "gpu0-1g-18gb-at4", ""}},
	}
	events, err := ParseTrace(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.order.String(), func(t *testing.T) {
			node, err := newDRANode("h200", 1, tt.order)
			if err != nil {
				t.Fatal(err)
			}
			held := map[string]int{}
			var got []string
			for _, e := range events {
				if e.Kind == Depart {
					if d, ok := held[e.ID]; ok {
						node.release(d)
					}
					continue
				}
				d := node.allocate(e.Profile)
				if d < 0 {
					got = append(got, "")
					continue
				}
				held[e.ID] = d
				got = append(got, node.devices[d].name)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("devices %q\nwant    %q", got, tt.want)
			}
			r, err := RunDRA(events, "h200", 1, tt.order)
			if err != nil {
				t.Fatal(err)
			}
			accepted := 0
			for _, w := range tt.want {
				if w != "" {
					accepted++
				}
			}
			if r.Accepted != accepted || r.Arrivals != 5 {
				t.Fatalf("RunDRA accepted %d of %d, want %d of 5", r.Accepted, r.Arrivals, accepted)
			}
		})
	}
}

// First fit over the ascending order is mig.FirstFit: the same trace gives
// the same figures, arrival by arrival.
func TestDRAFirstFitAscendingIsFirstFit(t *testing.T) {
	tests := []struct {
		model string
		gpus  int
		mix   string
		seed  uint64
	}{
		{"h200", 8, "mixed", 1},
		{"h100", 3, "large", 2},
		{"a100-40gb", 1, "small", 3},
	}
	for _, tt := range tests {
		t.Run(tt.model+" "+tt.mix, func(t *testing.T) {
			ev, err := Synthetic(SyntheticOptions{Model: tt.model, GPUs: tt.gpus, Seed: tt.seed, Arrivals: 800, Load: 1.5, Mix: Mixes[tt.mix]})
			if err != nil {
				t.Fatal(err)
			}
			ff, err := Run(ev, tt.model, tt.gpus, mig.FirstFit)
			if err != nil {
				t.Fatal(err)
			}
			d, err := RunDRA(ev, tt.model, tt.gpus, dra.OrderAscending)
			if err != nil {
				t.Fatal(err)
			}
			if d.Strategy != DRAFirstFitAscending {
				t.Errorf("strategy %q", d.Strategy)
			}
			d.Strategy = ff.Strategy
			if !reflect.DeepEqual(d, ff) {
				t.Fatalf("dra-first-fit-ascending %+v\nfirst-fit               %+v", d, ff)
			}
			p, err := RunDRA(ev, tt.model, tt.gpus, dra.OrderPreferred)
			if err != nil {
				t.Fatal(err)
			}
			if p.Accepted == 0 || p.Strategy != DRAFirstFit {
				t.Fatalf("%+v", p)
			}
		})
	}
}

func TestDRAFirstFitRefusesIsolation(t *testing.T) {
	ev, err := Synthetic(SyntheticOptions{Model: "h200", GPUs: 2, Seed: 1, Arrivals: 50, IsolatedShare: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RunDRA(ev, "h200", 2, dra.OrderPreferred); !errors.Is(err, ErrIsolationUnsupported) {
		t.Fatalf("RunDRA with isolated requests: %v", err)
	}
	rs, err := Compare(ev, "h200", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if strings.HasPrefix(r.Strategy, "dra-") {
			t.Errorf("Compare replayed %s over a trace with isolated requests", r.Strategy)
		}
	}
	plain, _ := Synthetic(SyntheticOptions{Model: "h200", GPUs: 2, Seed: 1, Arrivals: 50})
	rs, err = Compare(plain, "h200", 2)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rs {
		names = append(names, r.Strategy)
	}
	if got := strings.Join(names, ","); !strings.Contains(got, "spread,dra-first-fit,dra-first-fit-ascending,") {
		t.Errorf("Compare rows %s: want both DRA rows after the strategies", got)
	}
}
