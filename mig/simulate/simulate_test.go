package simulate

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

func TestParseTrace(t *testing.T) {
	tests := []struct {
		name, in, err string
		n             int
	}{
		{"arrivals and departures", "# comment\n0 arrive a t1 3g.71gb\n0.5 arrive b t2 1g.18gb tenant # isolated\n\n2 depart a\n", "", 3},
		{"exclusive", "0 arrive a t1 7g.141gb exclusive\n", "", 1},
		{"time goes back", "1 arrive a t 1g.18gb\n0.5 depart a\n", "trace line 2: time 0.5 is before", 0},
		{"bad time", "x arrive a t 1g.18gb\n", `trace line 1: time "x"`, 0},
		{"negative time", "-1 arrive a t 1g.18gb\n", "non-negative", 0},
		{"unknown event", "0 leave a\n", `event "leave"`, 0},
		{"depart unknown", "0 depart a\n", "id a: departs without arriving", 0},
		{"duplicate live id", "0 arrive a t 1g.18gb\n1 arrive a t 1g.18gb\n", "id a: already live", 0},
		{"bad isolation", "0 arrive a t 1g.18gb nobody\n", `isolation "nobody"`, 0},
		{"short arrive", "0 arrive a t\n", "arrive: want", 0},
		{"empty", "# nothing\n", "no events", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, err := ParseTrace(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || len(ev) != tt.n {
				t.Fatalf("%d events, %v", len(ev), err)
			}
		})
	}
}

func TestSyntheticRoundTripsAndIsDeterministic(t *testing.T) {
	o := SyntheticOptions{Model: "h100", GPUs: 2, Seed: 42, Arrivals: 200, IsolatedShare: 0.2}
	a, err := Synthetic(o)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Synthetic(o)
	var bufA, bufB bytes.Buffer
	WriteTrace(&bufA, a)
	WriteTrace(&bufB, b)
	if bufA.String() != bufB.String() {
		t.Fatal("same seed, different traces")
	}
	back, err := ParseTrace(&bufA)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != 400 || back[0].Kind != Arrive {
		t.Fatalf("%d events", len(back))
	}
	bad := []struct {
		o    SyntheticOptions
		want string
	}{
		{SyntheticOptions{Model: "t4", GPUs: 1}, "unknown"},
		{SyntheticOptions{Model: "h100", GPUs: 0}, "gpus 0"},
		{SyntheticOptions{Model: "h100", GPUs: 1, Load: -1}, "load -1"},
		{SyntheticOptions{Model: "h100", GPUs: 1, IsolatedShare: 2}, "isolated share 2"},
		{SyntheticOptions{Model: "h100", GPUs: 1, Mix: []float64{1}}, "mix has 1 shares"},
		{SyntheticOptions{Model: "h100", GPUs: 1, Mix: make([]float64, 7)}, "mix is all zero"},
		{SyntheticOptions{Model: "h100", GPUs: 1, Lifetimes: "pareto"}, `lifetimes "pareto"`},
	}
	for _, tt := range bad {
		if _, err := Synthetic(tt.o); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Synthetic(%+v): %v, want %q", tt.o, err, tt.want)
		}
	}
}

// First-fit puts the 1g at slot 0 and then cannot place the 4g; best fit
// puts the 1g at slot 6 and places both, as the exact optimum does.
func TestBestFitBeatsFirstFitOnATrap(t *testing.T) {
	ev, err := ParseTrace(strings.NewReader("0 arrive a t 1g.18gb\n1 arrive b t 4g.71gb\n2 arrive c t 2g.35gb\n"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Compare(ev, "h200", 1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range rs {
		got[r.Strategy] = r.Accepted
	}
	want := map[string]int{"best-fit": 3, "first-fit": 2, "driver-order": 3, "spread": 2, "exact optimum": 3, "exact optimum (compute)": 3, "repack oracle": 3}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s accepted %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// The exact optimum bounds every strategy that accepts whatever fits, and
// the offline optimum bounds the exact one.
func TestExactOptimumBoundsStrategies(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		for _, gpus := range []int{1, 2} {
			ev, err := Synthetic(SyntheticOptions{Model: "a100-40gb", GPUs: gpus, Seed: seed, Arrivals: 12, Load: 1.5, IsolatedShare: 0.2})
			if err != nil {
				t.Fatal(err)
			}
			ex, err := RunExact(ev, "a100-40gb", gpus)
			if errors.Is(err, ErrTooLarge) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []mig.Strategy{mig.BestFit, mig.FirstFit, mig.Spread} {
				r, err := Run(ev, "a100-40gb", gpus, s)
				if err != nil {
					t.Fatal(err)
				}
				if r.Accepted > ex.Accepted || r.Arrivals != ex.Arrivals {
					t.Errorf("seed %d gpus %d: %s accepted %d/%d > exact %d/%d", seed, gpus, s, r.Accepted, r.Arrivals, ex.Accepted, ex.Arrivals)
				}
				if r.Utilisation < 0 || r.Utilisation > 1 || math.IsNaN(r.Fragmentation) || r.ServedCompute > 1 {
					t.Errorf("%s: figures out of range %+v", s, r)
				}
			}
			exc, err := RunExactCompute(ev, "a100-40gb", gpus)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []mig.Strategy{mig.BestFit, mig.FirstFit, mig.DriverOrder, mig.Spread} {
				r, _ := Run(ev, "a100-40gb", gpus, s)
				if r.served > exc.served || r.requested != exc.requested {
					t.Errorf("seed %d gpus %d: %s served %d/%d > exact compute %d/%d", seed, gpus, s, r.served, r.requested, exc.served, exc.requested)
				}
			}
			if exc.Accepted > ex.Accepted {
				t.Errorf("seed %d: compute optimum accepts %d > request optimum %d", seed, exc.Accepted, ex.Accepted)
			}
			off, err := RunExactOffline(ev, "a100-40gb", gpus)
			if err == nil && off.Accepted < ex.Accepted {
				t.Errorf("seed %d: offline %d < exact %d", seed, off.Accepted, ex.Accepted)
			}
		}
	}
}

func TestRunRejectsForeignProfiles(t *testing.T) {
	ev, _ := ParseTrace(strings.NewReader("0 arrive a t 3g.71gb\n"))
	if _, err := Run(ev, "a100-40gb", 1, mig.BestFit); err == nil || !strings.Contains(err.Error(), `profile "3g.71gb": not a a100-40gb profile`) {
		t.Fatalf("error %v", err)
	}
	if _, err := RunExact(ev, "a100-40gb", 1); err == nil {
		t.Fatal("exact accepted a foreign profile")
	}
	if _, err := RunExact(ev, "a100-40gb", MaxExactGPUs+1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("large instance: %v", err)
	}
}

// Bimodal lifetimes keep the arrivals, profiles and tenants of the
// exponential trace with the same seed and about the same mean lifetime.
func TestBimodalLifetimesShareArrivals(t *testing.T) {
	o := SyntheticOptions{Model: "h200", GPUs: 8, Seed: 5, Arrivals: 4000}
	exp, _ := Synthetic(o)
	o.Lifetimes = Bimodal
	bi, err := Synthetic(o)
	if err != nil {
		t.Fatal(err)
	}
	mean := func(ev []Event) (map[string]Event, float64) {
		arr := map[string]Event{}
		sum := 0.0
		for _, e := range ev {
			if e.Kind == Arrive {
				arr[e.ID] = e
			} else {
				sum += e.Time - arr[e.ID].Time
			}
		}
		return arr, sum / float64(len(arr))
	}
	a, ma := mean(exp)
	b, mb := mean(bi)
	for id, e := range a {
		if b[id] != e {
			t.Fatalf("%s: %+v vs %+v", id, e, b[id])
		}
	}
	if math.Abs(mb/ma-1) > 0.15 {
		t.Fatalf("mean lifetime %.1f (bimodal) vs %.1f", mb, ma)
	}
}

func TestPoolSumsAndDropsIncomplete(t *testing.T) {
	runs := [][]Result{
		{{Strategy: "a", Arrivals: 10, Accepted: 5, requested: 20, served: 10, Utilisation: 0.5}, {Strategy: "b", Arrivals: 10, Accepted: 9}},
		{{Strategy: "a", Arrivals: 30, Accepted: 25, requested: 20, served: 5, Utilisation: 0.7}},
	}
	got := Pool(runs)
	if len(got) != 1 || got[0].Strategy != "a" {
		t.Fatalf("pooled %+v, want only a", got)
	}
	a := got[0]
	if a.Accepted != 30 || a.Arrivals != 40 || a.Acceptance != 0.75 || a.ServedCompute != 15.0/40 || math.Abs(a.Utilisation-0.6) > 1e-12 {
		t.Fatalf("pooled %+v", a)
	}
}
