package mig

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// shapeTokens name a profile independently of the model's memory sizes.
var shapeTokens = map[string]int{"1g": 0, "1g+me": 1, "1g.2x": 2, "2g": 3, "3g": 4, "4g": 5, "7g": 6}

// layout parses "4g@0 3g@4" into placements on GPU 0 of model m.
func layout(t *testing.T, m *GPUModel, s string) []Placement {
	t.Helper()
	var out []Placement
	for i, tok := range strings.Fields(s) {
		var shape string
		var start int
		at := strings.IndexByte(tok, '@')
		shape = tok[:at]
		fmt.Sscanf(tok[at+1:], "%d", &start)
		idx, ok := shapeTokens[shape]
		if !ok {
			t.Fatalf("bad token %q", tok)
		}
		out = append(out, Placement{GPU: 0, Profile: m.Profiles[idx].Name, Start: start, Tenant: "t", Owner: fmt.Sprintf("o%d", i)})
	}
	return out
}

// Every model accepts exactly the layouts hardware accepts.
func TestLayouts(t *testing.T) {
	tests := []struct {
		layout string
		why    string // "" feasible, else the reason it is refused
	}{
		{"7g@0", ""},
		{"4g@0 3g@4", ""},
		{"3g@0 3g@4", ""},
		{"2g@0 2g@2 2g@4 1g@6", ""},
		{"2g@0 2g@2 2g@4 1g.2x@6", ""},
		{"1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6", ""},
		{"1g.2x@0 1g.2x@2 1g.2x@4 1g.2x@6", ""},
		{"4g@0 2g@4 1g@6", ""},
		{"3g@0 1g@4 1g@5 1g@6", ""},
		{"1g+me@3 1g@0 1g@1 1g@2 1g@4 1g@5 1g@6", ""},
		{"3g@4 2g@0 1g@2 1g@3", ""},
		{"7g@0 1g@0", "memory slots taken"},
		{"4g@0 3g@0", "memory slots taken"},
		{"3g@4 1g.2x@6", "memory slots taken"},
		{"2g@2 1g.2x@2", "memory slots taken"},
		{"1g+me@0 1g+me@1", "instance limit reached"},
		{"1g@7", "invalid placement"},
		{"2g@6", "invalid placement"},
		{"3g@2", "invalid placement"},
		{"4g@4", "invalid placement"},
		{"1g.2x@1", "invalid placement"},
		{"7g@1", "invalid placement"},
	}
	for _, model := range Models() {
		m, _ := Model(model)
		for _, tt := range tests {
			t.Run(model+"/"+tt.layout, func(t *testing.T) {
				_, err := NewAllocator(NodeGPUs(model, 1), layout(t, m, tt.layout))
				if tt.why == "" {
					if err != nil {
						t.Fatalf("feasible layout refused: %v", err)
					}
					return
				}
				if err == nil || !strings.Contains(err.Error(), tt.why) {
					t.Fatalf("error %v, want %q", err, tt.why)
				}
			})
		}
	}
}

// The compute limit is checked on its own, not only through memory slots.
func TestComputeLimit(t *testing.T) {
	m, _ := Model("h200")
	s := gpuState{compute: 6}
	if why := s.fits(&m.Profiles[3], 0); why != "compute slices exhausted" {
		t.Fatalf("fits = %q", why)
	}
}

func TestAllocateNamesAndConstraints(t *testing.T) {
	type step struct {
		req  Request
		want string // "gpuN profile@start" or "error: substring"
	}
	r := func(owner, tenant, profile string) Request {
		return Request{Owner: owner, Tenant: tenant, Profile: profile}
	}
	tests := []struct {
		name  string
		gpus  int
		steps []step
	}{
		{"best fit keeps 7g room on the second GPU", 2, []step{
			{r("a", "t1", "1g.18gb"), "gpu0 1g.18gb@6"},
			{r("b", "t1", "3g.71gb"), "gpu0 3g.71gb@0"},
			{r("c", "t1", "7g.141gb"), "gpu1 7g.141gb@0"},
		}},
		{"min memory picks the smallest profile", 1, []step{
			{Request{Owner: "a", Tenant: "t", MinMemoryGB: 30}, "gpu0 1g.35gb@6"},
			{Request{Owner: "b", Tenant: "t", MinCompute: 3}, "gpu0 3g.71gb@0"},
			{Request{Owner: "c", Tenant: "t", MinMemoryGB: 30, MinCompute: 2}, "gpu0 2g.35gb@4"},
		}},
		{"min falls back to a larger profile", 1, []step{
			{r("a", "t", "4g.71gb"), "gpu0 4g.71gb@0"},
			{r("b", "t", "2g.35gb"), "gpu0 2g.35gb@4"},
			{r("c", "t", "1g.35gb"), "gpu0 1g.35gb@6"},
			{Request{Owner: "d", Tenant: "t", MinCompute: 1}, "error: insufficient resources"},
		}},
		{"tenant isolation keeps other tenants off", 2, []step{
			{Request{Owner: "a", Tenant: "t1", Profile: "1g.18gb", Isolation: IsolationTenant}, "gpu0 1g.18gb@6"},
			{r("b", "t2", "1g.18gb"), "gpu1 1g.18gb@6"},
			{r("c", "t1", "1g.18gb"), "gpu0 1g.18gb@4"},
			{r("d", "t3", "4g.71gb"), "gpu1 4g.71gb@0"},
			{r("e", "t3", "4g.71gb"), "error: gpu0: kept to tenant t1"},
		}},
		{"isolated request avoids shared GPUs", 2, []step{
			{r("a", "t1", "1g.18gb"), "gpu0 1g.18gb@6"},
			{Request{Owner: "b", Tenant: "t2", Profile: "1g.18gb", Isolation: IsolationTenant}, "gpu1 1g.18gb@6"},
			{Request{Owner: "c", Tenant: "t3", Profile: "1g.18gb", Isolation: IsolationTenant}, "error: shared with tenant"},
		}},
		{"exclusive takes an empty GPU alone", 2, []step{
			{r("a", "t1", "1g.18gb"), "gpu0 1g.18gb@6"},
			{Request{Owner: "b", Tenant: "t1", Profile: "1g.18gb", Isolation: IsolationExclusive}, "gpu1 1g.18gb@6"},
			{r("c", "t1", "1g.18gb"), "gpu0 1g.18gb@4"},
			{Request{Owner: "d", Tenant: "t1", Profile: "1g.18gb", Isolation: IsolationExclusive}, "error: needs an empty GPU"},
		}},
		{"max profile caps minimums and names", 1, []step{
			{Request{Owner: "a", Tenant: "t", MinCompute: 1, MaxProfile: "2g.35gb"}, "gpu0 1g.18gb@6"},
			{Request{Owner: "b", Tenant: "t", Profile: "3g.71gb", MaxProfile: "2g.35gb"}, "error: 3g.71gb exceeds max_profile 2g.35gb"},
			{Request{Owner: "c", Tenant: "t", MinMemoryGB: 60, MaxProfile: "2g.35gb"}, "error: exceeds max_profile"},
		}},
		{"whole GPU takes an empty GPU", 2, []step{
			{r("a", "t1", "1g.18gb"), "gpu0 1g.18gb@6"},
			{Request{Owner: "b", Tenant: "t2", WholeGPU: true}, "gpu1 whole@0"},
			{Request{Owner: "c", Tenant: "t2", WholeGPU: true}, "error: gpu0: needs an empty GPU; gpu1: needs an empty GPU"},
			{r("d", "t1", "7g.141gb"), "error: gpu1: held exclusively by b"},
		}},
		{"strict: whole GPU only on GPUs without MIG", 3, []step{
			{r("a", "t1", "1g.18gb"), "gpu0 1g.18gb@6"},
			{Request{Owner: "b", Tenant: "t2", WholeGPU: true}, "gpu2 whole@0"},
			{Request{Owner: "c", Tenant: "t2", WholeGPU: true}, "error: gpu0: MIG mode on: no whole GPU; gpu1: MIG mode on: no whole GPU; gpu2: needs an empty GPU"},
			{r("d", "t1", "7g.141gb"), "gpu1 7g.141gb@0"},
			{r("e", "t1", "7g.141gb"), "error: gpu2: MIG mode off: whole GPU only"},
		}},
		{"invalid requests name the field", 1, []step{
			{Request{Tenant: "t", Profile: "1g.18gb"}, "error: owner: must not be empty"},
			{Request{Owner: "a", Profile: "1g.18gb"}, "error: tenant: must not be empty"},
			{Request{Owner: "a", Tenant: "t"}, "error: profile: name a profile"},
			{Request{Owner: "a", Tenant: "t", Profile: "3g.40gb"}, `error: profile "3g.40gb": not a h200 profile`},
			{Request{Owner: "a", Tenant: "t", MinCompute: 9}, "error: min_compute 9"},
			{Request{Owner: "a", Tenant: "t", Profile: "1g.18gb", Isolation: "nobody"}, `error: isolation "nobody"`},
			{Request{Owner: "a", Tenant: "t", Profile: "1g.18gb", MinCompute: 1}, "error: give a profile or minimums"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gpus := NodeGPUs("h200", tt.gpus)
			if tt.gpus == 3 {
				gpus[2].NoMIG = true
			}
			var opts []Option
			if tt.gpus == 3 {
				opts = append(opts, WithStrictMIGMode())
			}
			a, err := NewAllocator(gpus, nil, opts...)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				p, err := a.Allocate(s.req)
				got := fmt.Sprintf("gpu%d %s@%d", p.GPU, p.Profile, p.Start)
				if err != nil {
					got = "error: " + err.Error()
				}
				if strings.HasPrefix(s.want, "error: ") {
					if err == nil || !strings.Contains(got, s.want[len("error: "):]) {
						t.Fatalf("step %d: got %q, want %q", i, got, s.want)
					}
					continue
				}
				if got != s.want {
					t.Fatalf("step %d: got %q, want %q", i, got, s.want)
				}
			}
		})
	}
}

func TestErrorsWrapSentinels(t *testing.T) {
	a, _ := NewAllocator(NodeGPUs("h100", 1), nil)
	if _, err := a.Allocate(Request{Owner: "a", Tenant: "t", Profile: "7g.80gb"}); err != nil {
		t.Fatal(err)
	}
	_, err := a.Allocate(Request{Owner: "b", Tenant: "t", Profile: "1g.10gb"})
	if !errors.Is(err, ErrInsufficientResources) || !strings.Contains(err.Error(), "1g.10gb for tenant t (owner b) does not fit: gpu0: 1g.10gb: memory slots taken") {
		t.Fatalf("error %v", err)
	}
	_, err = a.Allocate(Request{Owner: "b", Tenant: "t", Profile: "1g.18gb"})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("error %v, want ErrInvalidRequest", err)
	}
}

func TestReleaseRestoresAndIsIdempotent(t *testing.T) {
	a, _ := NewAllocator(NodeGPUs("a100-40gb", 1), nil)
	before := a.gpus[0].state
	p1, _ := a.Allocate(Request{Owner: "pod", Tenant: "t", Profile: "3g.20gb"})
	p2, _ := a.Allocate(Request{Owner: "pod", Tenant: "t", Profile: "2g.10gb"})
	got := a.Release("pod")
	if len(got) != 2 || got[0] != p2 && got[1] != p2 || a.gpus[0].state != before {
		t.Fatalf("release %v (placed %v %v), state %+v", got, p1, p2, a.gpus[0].state)
	}
	if again := a.Release("pod"); len(again) != 0 {
		t.Fatalf("second release freed %v", again)
	}
}

func TestPlanAllOrNothing(t *testing.T) {
	a, _ := NewAllocator(NodeGPUs("h200", 1), nil)
	reqs := []Request{
		{Owner: "a", Tenant: "t", Profile: "4g.71gb"},
		{Owner: "b", Tenant: "t", Profile: "3g.71gb"},
		{Owner: "c", Tenant: "t", Profile: "1g.18gb"},
	}
	_, err := a.Plan(reqs)
	if !errors.Is(err, ErrInsufficientResources) || !strings.Contains(err.Error(), "request 3") {
		t.Fatalf("error %v", err)
	}
	if n := len(a.Placements()); n != 0 {
		t.Fatalf("failed plan left %d placements", n)
	}
	ps, err := a.Plan(reqs[:2])
	if err != nil || len(ps) != 2 || len(a.Placements()) != 2 {
		t.Fatalf("plan %v, %v", ps, err)
	}
}

// A rebuilt allocator (another shim process reading the ledger) decides the
// same as the one that wrote the state.
func TestStateRoundTripDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	a, _ := NewAllocator(NodeGPUs("b200", 4), nil)
	m, _ := Model("b200")
	for i := 0; i < 12; i++ {
		p := m.Profiles[rng.IntN(len(m.Profiles))]
		a.Allocate(Request{Owner: fmt.Sprint("o", i), Tenant: fmt.Sprint("t", i%3), Profile: p.Name})
	}
	data, err := json.Marshal(a.State())
	if err != nil {
		t.Fatal(err)
	}
	var st NodeState
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	b, err := FromState(st)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		req := Request{Owner: fmt.Sprint("n", i), Tenant: "t9", MinMemoryGB: rng.IntN(60)}
		pa, ea := a.Allocate(req)
		pb, eb := b.Allocate(req)
		if pa != pb || fmt.Sprint(ea) != fmt.Sprint(eb) {
			t.Fatalf("request %d: %v/%v vs %v/%v", i, pa, ea, pb, eb)
		}
	}
}

func TestNewAllocatorRejectsBadInput(t *testing.T) {
	tests := []struct {
		gpus     []GPU
		existing []Placement
		want     string
	}{
		{[]GPU{{Index: 0, Model: "h200"}, {Index: 0, Model: "h200"}}, nil, "gpu index 0: listed twice"},
		{[]GPU{{Index: -1, Model: "h200"}}, nil, "gpu index -1"},
		{[]GPU{{Index: 0, Model: "t4"}}, nil, `gpu 0: gpu model "t4"`},
		{NodeGPUs("h200", 1), []Placement{{GPU: 3, Profile: "1g.18gb", Tenant: "t", Owner: "o"}}, "gpu 3 is not on this node"},
		{NodeGPUs("h200", 1), []Placement{{GPU: 0, Profile: "1g.18gb", Owner: "o"}}, "owner and tenant"},
		{[]GPU{{Index: 0, Model: "h200", NoMIG: true}}, []Placement{{GPU: 0, Profile: "whole", Start: 2, Tenant: "t", Owner: "o"}}, "whole GPU must start at 0"},
		{[]GPU{{Index: 0, Model: "h200", NoMIG: true}}, []Placement{{GPU: 0, Profile: "1g.18gb", Tenant: "t", Owner: "o"}}, "MIG mode off: whole GPU only"},
		{NodeGPUs("h200", 1), []Placement{
			{GPU: 0, Profile: "1g.18gb", Tenant: "t", Owner: "o", Isolation: IsolationTenant},
			{GPU: 0, Profile: "1g.18gb", Start: 1, Tenant: "u", Owner: "p"}}, "kept to tenant t"},
	}
	for _, tt := range tests {
		_, err := NewAllocator(tt.gpus, tt.existing)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewAllocator(%v, %v) error %v, want %q", tt.gpus, tt.existing, err, tt.want)
		}
	}
}

// Property: random allocate/release sequences never overlap, never exceed 7
// compute slices or an instance limit, and releasing restores capacity
// exactly (the state equals one rebuilt from the remaining placements).
func TestPropertyRandomSequences(t *testing.T) {
	for _, model := range Models() {
		for _, strat := range []Strategy{BestFit, FirstFit, Spread, DriverOrder} {
			t.Run(model+"/"+strat.String(), func(t *testing.T) {
				m, _ := Model(model)
				rng := rand.New(rand.NewPCG(uint64(len(model)), uint64(strat)))
				a, _ := NewAllocator(NodeGPUs(model, 3), nil, WithStrategy(strat))
				var live []string
				for op := 0; op < 3000; op++ {
					if len(live) > 0 && rng.IntN(3) == 0 {
						i := rng.IntN(len(live))
						before := a.Clone()
						freed := a.Release(live[i])
						if len(freed) != 1 {
							t.Fatalf("op %d: release %s freed %v", op, live[i], freed)
						}
						live = append(live[:i], live[i+1:]...)
						// Re-allocating what was freed at the same spot must succeed.
						again, err := NewAllocator(NodeGPUs(model, 3), append(a.Placements(), freed[0]))
						if err != nil {
							t.Fatalf("op %d: freed spot not reusable: %v", op, err)
						}
						if fmt.Sprint(again.gpus) != fmt.Sprint(before.gpus) {
							t.Fatalf("op %d: release+restore differs from before", op)
						}
					} else {
						req := Request{Owner: fmt.Sprint("o", op), Tenant: fmt.Sprint("t", rng.IntN(4))}
						switch rng.IntN(3) {
						case 0:
							req.Profile = m.Profiles[rng.IntN(len(m.Profiles))].Name
						case 1:
							req.MinMemoryGB = 1 + rng.IntN(m.MemoryGB/2)
						default:
							req.MinCompute = 1 + rng.IntN(4)
						}
						if rng.IntN(8) == 0 {
							req.Isolation = IsolationTenant
						}
						p, err := a.Allocate(req)
						if err == nil {
							live = append(live, p.Owner)
						} else if !errors.Is(err, ErrInsufficientResources) {
							t.Fatalf("op %d: %v", op, err)
						}
					}
					checkInvariants(t, a)
				}
			})
		}
	}
}

func checkInvariants(t *testing.T, a *Allocator) {
	t.Helper()
	for _, g := range a.gpus {
		var mask uint8
		compute := 0
		counts := map[string]int{}
		tenants := map[string]bool{}
		locked := ""
		for _, p := range g.placements {
			prof, err := g.model.Profile(p.Profile)
			if err != nil {
				t.Fatal(err)
			}
			if !prof.ValidStart(p.Start) {
				t.Fatalf("gpu%d: %s at invalid start %d", g.index, p.Profile, p.Start)
			}
			if mask&prof.SlotMask(p.Start) != 0 {
				t.Fatalf("gpu%d: %s at %d overlaps", g.index, p.Profile, p.Start)
			}
			mask |= prof.SlotMask(p.Start)
			compute += prof.Compute
			counts[p.Profile]++
			if counts[p.Profile] > prof.Instances {
				t.Fatalf("gpu%d: %d x %s", g.index, counts[p.Profile], p.Profile)
			}
			tenants[p.Tenant] = true
			if p.Isolation == IsolationTenant {
				locked = p.Tenant
			}
		}
		if compute > ComputeSlices {
			t.Fatalf("gpu%d: %d compute slices", g.index, compute)
		}
		if locked != "" && len(tenants) > 1 {
			t.Fatalf("gpu%d: kept to %s but hosts %v", g.index, locked, tenants)
		}
		if mask != g.state.slots || compute != g.state.compute {
			t.Fatalf("gpu%d: state %+v disagrees with placements (mask %08b compute %d)", g.index, g.state, mask, compute)
		}
	}
}

// DriverOrder reproduces the placements NVIDIA's MIG user guide shows for
// `nvidia-smi mig -cgi` without explicit placements on an A100-40GB,
// including the documented failure of 19,19,14,9 (the 3g no longer fits).
func TestDriverOrderMatchesUserGuide(t *testing.T) {
	tests := []struct {
		cgi  string
		want string
	}{
		{"3g.20gb 1g.5gb 2g.10gb 1g.5gb", "3g.20gb@4 1g.5gb@0 2g.10gb@2 1g.5gb@1"},
		{"2g.10gb 1g.5gb 1g.5gb 1g.5gb 1g.5gb 1g.5gb", "2g.10gb@4 1g.5gb@6 1g.5gb@0 1g.5gb@1 1g.5gb@2 1g.5gb@3"},
		{"1g.5gb 2g.10gb 4g.20gb", "1g.5gb@6 2g.10gb@4 4g.20gb@0"},
		{"1g.5gb 1g.5gb 2g.10gb 3g.20gb", "1g.5gb@6 1g.5gb@4 2g.10gb@0 refused"},
	}
	for _, tt := range tests {
		a, _ := NewAllocator(NodeGPUs("a100-40gb", 1), nil, WithStrategy(DriverOrder))
		var got []string
		for i, prof := range strings.Fields(tt.cgi) {
			p, err := a.Allocate(Request{Owner: fmt.Sprint(i), Tenant: "t", Profile: prof})
			if err != nil {
				got = append(got, "refused")
				continue
			}
			got = append(got, fmt.Sprintf("%s@%d", p.Profile, p.Start))
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("-cgi %s: got %s, want %s", tt.cgi, strings.Join(got, " "), tt.want)
		}
	}
}

// A GPU marked Unavailable (its MIG mode change waits for a reset) keeps
// what it holds but takes nothing new, and a refusal says why.
func TestUnavailableGPUTakesNothing(t *testing.T) {
	const why = "MIG mode change pending a GPU reset: MIG mode is enabled, pending disabled"
	gpus := NodeGPUs("h200", 2)
	gpus[1].Unavailable = why
	held := Placement{GPU: 1, Profile: "3g.71gb", Start: 4, Tenant: "t", Owner: "old"}
	a, err := NewAllocator(gpus, []Placement{held})
	if err != nil {
		t.Fatalf("a placement it already holds: %v", err)
	}
	tests := []struct {
		req  Request
		want string // placement, or "error: " and a substring
	}{
		{Request{Owner: "a", Tenant: "t", Profile: "7g.141gb"}, "gpu0 7g.141gb@0"},
		{Request{Owner: "b", Tenant: "t", Profile: "1g.18gb"}, "error: gpu1: " + why},
		{Request{Owner: "c", Tenant: "t", WholeGPU: true}, "error: gpu1: " + why},
	}
	for i, tt := range tests {
		p, err := a.Allocate(tt.req)
		got := fmt.Sprintf("gpu%d %s@%d", p.GPU, p.Profile, p.Start)
		if err != nil {
			got = "error: " + err.Error()
		}
		if want, isErr := strings.CutPrefix(tt.want, "error: "); isErr {
			if !errors.Is(err, ErrInsufficientResources) || !strings.Contains(got, want) {
				t.Errorf("request %d: %q, want insufficient resources naming %q", i, got, want)
			}
		} else if got != tt.want {
			t.Errorf("request %d: %q, want %q", i, got, tt.want)
		}
	}
	if rel := a.Release("old"); len(rel) != 1 {
		t.Errorf("release of the held slice: %+v", rel)
	}
	if st := a.State(); st.GPUs[1].Unavailable != why {
		t.Errorf("state lost the reason: %+v", st.GPUs[1])
	}
}
