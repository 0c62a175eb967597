package mig

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

var (
	// ErrInsufficientResources means no GPU of the node can host the
	// request now. The wrapping error names what did not fit and why.
	ErrInsufficientResources = errors.New("insufficient resources")
	// ErrInvalidRequest means the request (or a stored placement) is
	// malformed or breaks a rule regardless of the node's occupancy.
	ErrInvalidRequest = errors.New("invalid request")
)

// wholeGPUProfile is the Profile a whole-GPU placement is stored with in
// the ledger. Callers ask with Request.WholeGPU and test Placement.Whole;
// the name a pod asks for a whole GPU with is the policy's (ProfileWhole),
// which the runtime maps to Request.WholeGPU, never passing it through.
const wholeGPUProfile = "whole"

// Isolation is the co-tenancy rule a placement carries for as long as it
// lives. It is stored with the placement so a rebuilt allocator keeps it.
type Isolation string

const (
	// IsolationShared lets the GPU host other tenants' slices.
	IsolationShared Isolation = ""
	// IsolationTenant keeps the GPU to one tenant: no slice of another
	// tenant may share it while this placement lives.
	IsolationTenant Isolation = "tenant"
	// IsolationExclusive keeps the physical GPU to this placement alone.
	IsolationExclusive Isolation = "exclusive"
)

func (i Isolation) valid() bool {
	return i == IsolationShared || i == IsolationTenant || i == IsolationExclusive
}

// GPU is one physical GPU of the node as the allocator sees it.
type GPU struct {
	// Index is the NVML device index.
	Index int `json:"index"`
	// Model is the short model name, see Model.
	Model string `json:"model"`
	// NoMIG marks a GPU with MIG mode off: it only takes whole-GPU
	// requests. With WithStrictMIGMode a MIG-enabled GPU never takes a
	// whole-GPU request either: CUDA sees no device there without MIG
	// capabilities, so the sandbox could not use it.
	NoMIG bool `json:"no_mig,omitempty"`
	// Unavailable says why the GPU takes no new placement at all, e.g. a
	// MIG mode change that waits for a GPU reset; "" when it is usable.
	// Placements it already holds are kept (and released as usual).
	Unavailable string `json:"unavailable,omitempty"`
}

// NodeGPUs returns n GPUs of one model, indices 0..n-1.
func NodeGPUs(model string, n int) []GPU {
	gpus := make([]GPU, n)
	for i := range gpus {
		gpus[i] = GPU{Index: i, Model: model}
	}
	return gpus
}

// Placement is one MIG slice (or whole GPU) held by a sandbox. It is both the
// allocator's answer and the record the node ledger stores.
type Placement struct {
	// GPU is the NVML index of the physical GPU.
	GPU int `json:"gpu"`
	// Profile is the profile name ("3g.71gb"), or "whole" for a whole GPU
	// (see Whole).
	Profile string `json:"profile"`
	// Start is the first memory slot, as in an NVML placement.
	Start int `json:"start"`
	// Size is the number of memory slots, as in an NVML placement.
	Size int `json:"size"`
	// Compute is the number of compute slices.
	Compute int `json:"compute"`
	// Tenant owns the slice for co-tenancy rules.
	Tenant string `json:"tenant"`
	// Owner is the sandbox (pod) id that holds the slice.
	Owner string `json:"owner"`
	// Isolation is the co-tenancy rule the slice imposes on its GPU.
	Isolation Isolation `json:"isolation,omitempty"`
}

// Whole reports whether the placement is a whole GPU outside MIG.
func (p Placement) Whole() bool { return p.Profile == wholeGPUProfile }

func (p Placement) String() string {
	return fmt.Sprintf("gpu%d %s start %d size %d (tenant %s, owner %s)", p.GPU, p.Profile, p.Start, p.Size, p.Tenant, p.Owner)
}

// Request asks for one slice.
type Request struct {
	// Owner is the sandbox id; Release(Owner) frees everything it holds.
	Owner string
	// Tenant is the tenant derived from the pod's namespace.
	Tenant string
	// Profile names the exact profile. Leave empty to ask by MinMemoryGB
	// and MinCompute instead; the smallest profile that fits is chosen.
	Profile string
	// MinMemoryGB is the least memory (GB, as in profile names).
	MinMemoryGB int
	// MinCompute is the least number of compute slices.
	MinCompute int
	// Media asks for the "+me" profile when choosing by minimums.
	Media bool
	// MaxProfile caps the slice: its compute and memory may not exceed
	// this profile's (policy's size cap). Empty: no cap.
	MaxProfile string
	// Isolation is the co-tenancy rule from policy.
	Isolation Isolation
	// WholeGPU asks for an entire empty GPU instead of a MIG slice.
	WholeGPU bool
}

func (r *Request) validate() error {
	switch {
	case r.Owner == "":
		return fmt.Errorf("%w: owner: must not be empty", ErrInvalidRequest)
	case r.Tenant == "":
		return fmt.Errorf("%w: tenant: must not be empty", ErrInvalidRequest)
	case !r.Isolation.valid():
		return fmt.Errorf("%w: isolation %q: want \"\", %q or %q", ErrInvalidRequest, r.Isolation, IsolationTenant, IsolationExclusive)
	case r.MinMemoryGB < 0:
		return fmt.Errorf("%w: min_memory_gb %d: must not be negative", ErrInvalidRequest, r.MinMemoryGB)
	case r.MinCompute < 0 || r.MinCompute > ComputeSlices:
		return fmt.Errorf("%w: min_compute %d: must be 0..%d", ErrInvalidRequest, r.MinCompute, ComputeSlices)
	case r.WholeGPU && (r.Profile != "" || r.MinMemoryGB != 0 || r.MinCompute != 0):
		return fmt.Errorf("%w: whole_gpu: excludes profile and minimums", ErrInvalidRequest)
	case r.Profile != "" && (r.MinMemoryGB != 0 || r.MinCompute != 0 || r.Media):
		return fmt.Errorf("%w: profile %q: give a profile or minimums, not both", ErrInvalidRequest, r.Profile)
	case !r.WholeGPU && r.Profile == "" && r.MinMemoryGB == 0 && r.MinCompute == 0 && !r.Media:
		return fmt.Errorf("%w: profile: name a profile, minimums or whole_gpu", ErrInvalidRequest)
	}
	return nil
}

func (r *Request) what() string {
	switch {
	case r.WholeGPU:
		return "a whole GPU"
	case r.Profile != "":
		return r.Profile
	default:
		s := fmt.Sprintf("a slice with >= %d GB and >= %d compute", r.MinMemoryGB, r.MinCompute)
		if r.Media {
			s += " (+me)"
		}
		return s
	}
}

// Strategy chooses among feasible placements.
type Strategy int

const (
	// BestFit minimises lost future capacity: it picks the placement
	// after which the GPU can still host the most compute of every
	// profile, packing used GPUs before empty ones. The default.
	BestFit Strategy = iota
	// FirstFit takes the first GPU by index and the lowest start that
	// fits: the usual "first fit" baseline. The driver itself places
	// differently (see DriverOrder).
	FirstFit
	// Spread takes the least used GPU and the lowest start that fits, as
	// a scheduler scoring GPUs by free capacity (Kubernetes'
	// LeastAllocated) with first fit on the GPU would. A baseline.
	Spread
	// DriverOrder takes the first GPU by index and, on it, the start the
	// NVIDIA driver picks when asked for a GPU instance without a
	// placement, as NVIDIA's MIG user guide shows it: memory-slot pairs
	// 6-7, 4-5, 0-1, 2-3 in that order, lower slot first within a pair, so
	// a lone 1g lands at slot 6 and a 2g or 3g at slot 4. A baseline: what
	// a node agent gets by letting the driver place on the first GPU with
	// room.
	DriverOrder
)

// driverStartRank ranks a start as driver auto-placement tries it (see
// DriverOrder); lower goes first.
func driverStartRank(start int) int {
	pairRank := [MemorySlots / 2]int{2, 3, 1, 0}
	return pairRank[start/2]*2 + start%2
}

func (s Strategy) String() string {
	switch s {
	case FirstFit:
		return "first-fit"
	case Spread:
		return "spread"
	case DriverOrder:
		return "driver-order"
	}
	return "best-fit"
}

// Option configures an Allocator.
type Option func(*Allocator)

// WithStrategy selects the placement strategy (BestFit by default).
func WithStrategy(s Strategy) Option { return func(a *Allocator) { a.strategy = s } }

// WithStrictMIGMode keeps whole-GPU requests off MIG-enabled GPUs (see
// GPU.NoMIG). Without it a whole-GPU request may take any empty GPU, which
// suits simulated nodes whose GPUs are all in MIG mode.
func WithStrictMIGMode() Option { return func(a *Allocator) { a.strictMIG = true } }

type gpuSlot struct {
	index       int
	noMIG       bool
	unavailable string // GPU.Unavailable
	model       *GPUModel
	state       gpuState
	placements  []Placement // sorted by start
}

// Allocator places slices over a node's GPUs. It holds no lock: the caller
// (the node ledger) serialises access and persists State.
type Allocator struct {
	strategy  Strategy
	strictMIG bool
	gpus      []gpuSlot // sorted by index
}

// NodeState is the serialisable form of an allocator.
type NodeState struct {
	GPUs       []GPU       `json:"gpus"`
	Placements []Placement `json:"placements"`
}

// NewAllocator builds an allocator for gpus holding the existing placements
// (as read from the ledger). A placement that is unknown, invalid or
// conflicting is an error: the ledger and the geometry disagree.
func NewAllocator(gpus []GPU, existing []Placement, opts ...Option) (*Allocator, error) {
	a := &Allocator{}
	for _, o := range opts {
		o(a)
	}
	seen := map[int]bool{}
	for _, g := range gpus {
		if g.Index < 0 {
			return nil, fmt.Errorf("gpu index %d: must not be negative", g.Index)
		}
		if seen[g.Index] {
			return nil, fmt.Errorf("gpu index %d: listed twice", g.Index)
		}
		seen[g.Index] = true
		m, err := Model(g.Model)
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", g.Index, err)
		}
		a.gpus = append(a.gpus, gpuSlot{index: g.Index, noMIG: g.NoMIG, unavailable: g.Unavailable, model: m})
	}
	sort.Slice(a.gpus, func(i, j int) bool { return a.gpus[i].index < a.gpus[j].index })
	for _, p := range existing {
		if err := a.restore(p); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// FromState rebuilds an allocator from NodeState.
func FromState(st NodeState, opts ...Option) (*Allocator, error) {
	return NewAllocator(st.GPUs, st.Placements, opts...)
}

// State returns the serialisable state: GPUs and placements in order.
func (a *Allocator) State() NodeState {
	st := NodeState{Placements: a.Placements()}
	for _, g := range a.gpus {
		st.GPUs = append(st.GPUs, GPU{Index: g.index, Model: g.model.Name, NoMIG: g.noMIG, Unavailable: g.unavailable})
	}
	return st
}

// Clone returns an independent copy.
func (a *Allocator) Clone() *Allocator {
	c := &Allocator{strategy: a.strategy, strictMIG: a.strictMIG, gpus: make([]gpuSlot, len(a.gpus))}
	copy(c.gpus, a.gpus)
	for i := range c.gpus {
		c.gpus[i].placements = append([]Placement(nil), a.gpus[i].placements...)
	}
	return c
}

func (a *Allocator) gpu(index int) *gpuSlot {
	i := sort.Search(len(a.gpus), func(i int) bool { return a.gpus[i].index >= index })
	if i < len(a.gpus) && a.gpus[i].index == index {
		return &a.gpus[i]
	}
	return nil
}

func (a *Allocator) restore(p Placement) error {
	g := a.gpu(p.GPU)
	if g == nil {
		return fmt.Errorf("%w: placement %s: gpu %d is not on this node", ErrInvalidRequest, p, p.GPU)
	}
	if p.Owner == "" || p.Tenant == "" {
		return fmt.Errorf("%w: placement %s: owner and tenant must not be empty", ErrInvalidRequest, p)
	}
	if !p.Isolation.valid() {
		return fmt.Errorf("%w: placement %s: isolation %q unknown", ErrInvalidRequest, p, p.Isolation)
	}
	if why := g.admits(p.Tenant, p.Isolation, p.Whole()); why != "" {
		return fmt.Errorf("%w: placement %s: %s", ErrInvalidRequest, p, why)
	}
	if !a.modeFits(g, p.Whole()) {
		return fmt.Errorf("%w: placement %s: %s", ErrInvalidRequest, p, g.modeMismatch())
	}
	if p.Whole() {
		if p.Start != 0 {
			return fmt.Errorf("%w: placement %s: whole GPU must start at 0", ErrInvalidRequest, p)
		}
		g.takeWhole(p)
		return nil
	}
	prof, err := g.model.Profile(p.Profile)
	if err != nil {
		return fmt.Errorf("%w: placement on gpu %d: %v", ErrInvalidRequest, p.GPU, err)
	}
	if why := g.state.fits(prof, p.Start); why != "" {
		return fmt.Errorf("%w: placement %s: %s", ErrInvalidRequest, p, why)
	}
	g.take(prof, p)
	return nil
}

func (g *gpuSlot) take(prof *Profile, p Placement) {
	p.Profile, p.Size, p.Compute = prof.Name, prof.Slots, prof.Compute
	g.state.add(prof, p.Start)
	g.insert(p)
}

func (g *gpuSlot) takeWhole(p Placement) {
	p.Start, p.Size, p.Compute = 0, MemorySlots, ComputeSlices
	g.state.whole = true
	g.insert(p)
}

func (g *gpuSlot) insert(p Placement) {
	i := sort.Search(len(g.placements), func(i int) bool { return g.placements[i].Start >= p.Start })
	g.placements = append(g.placements, Placement{})
	copy(g.placements[i+1:], g.placements[i:])
	g.placements[i] = p
}

// modeFits applies the GPU's MIG mode: slices need MIG, and in strict mode
// whole GPUs need it off.
func (a *Allocator) modeFits(g *gpuSlot, whole bool) bool {
	if whole {
		return g.noMIG || !a.strictMIG
	}
	return !g.noMIG
}

func (g *gpuSlot) modeMismatch() string {
	if g.noMIG {
		return "MIG mode off: whole GPU only"
	}
	return "MIG mode on: no whole GPU"
}

// admits says why the GPU's co-tenancy rules refuse a tenant, or "".
func (g *gpuSlot) admits(tenant string, iso Isolation, whole bool) string {
	if (iso == IsolationExclusive || whole) && len(g.placements) > 0 {
		return "needs an empty GPU"
	}
	for _, e := range g.placements {
		switch {
		case e.Isolation == IsolationExclusive || e.Whole():
			return "held exclusively by " + e.Owner
		case e.Isolation == IsolationTenant && e.Tenant != tenant:
			return "kept to tenant " + e.Tenant
		case iso == IsolationTenant && e.Tenant != tenant:
			return "shared with tenant " + e.Tenant
		}
	}
	return ""
}

// candidates resolves the profiles a request may use on a model.
func (r *Request) candidates(m *GPUModel) ([]*Profile, error) {
	var out []*Profile
	if r.Profile != "" {
		p, err := m.Profile(r.Profile)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		out = []*Profile{p}
	} else {
		out = m.Smallest(r.MinMemoryGB, r.MinCompute, r.Media)
	}
	if r.MaxProfile != "" {
		max, err := m.Profile(r.MaxProfile)
		if err != nil {
			return nil, fmt.Errorf("%w: max_profile: %v", ErrInvalidRequest, err)
		}
		kept := out[:0:0]
		for _, p := range out {
			if p.Compute <= max.Compute && p.MemoryGB <= max.MemoryGB {
				kept = append(kept, p)
			}
		}
		if len(kept) == 0 {
			return nil, fmt.Errorf("%w: %s exceeds max_profile %s", ErrInvalidRequest, r.what(), max.Name)
		}
		out = kept
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no %s profile offers %s", ErrInvalidRequest, m.Name, r.what())
	}
	return out, nil
}

// choice is one feasible placement and its rank; lower ranks win.
type choice struct {
	gpu     *gpuSlot
	prof    *Profile
	start   int
	rank    int // profile rank among the candidates: smaller profiles first
	loss    int // capacity lost on the GPU
	used    int // compute already used on the GPU
	orderNo int // GPU position
}

func (c *choice) better(o *choice, s Strategy) bool {
	if o.gpu == nil {
		return true
	}
	if c.rank != o.rank {
		return c.rank < o.rank
	}
	switch s {
	case BestFit:
		if c.loss != o.loss {
			return c.loss < o.loss
		}
		if c.used != o.used {
			return c.used > o.used
		}
	case Spread:
		if c.used != o.used {
			return c.used < o.used
		}
	}
	if c.orderNo != o.orderNo {
		return c.orderNo < o.orderNo
	}
	if s == DriverOrder {
		return driverStartRank(c.start) < driverStartRank(o.start)
	}
	return c.start < o.start
}

// refusal is why one GPU could not take a request; formatted only when the
// whole request fails, to keep placement free of allocations.
type refusal struct {
	gpu  int
	prof *Profile
	why  string
}

func (r refusal) String() string {
	if r.prof != nil {
		return fmt.Sprintf("gpu%d: %s: %s", r.gpu, r.prof.Name, r.why)
	}
	return fmt.Sprintf("gpu%d: %s", r.gpu, r.why)
}

// Allocate places one request. It never changes the allocator on error. The
// result depends only on the current placements, the request and the
// strategy.
func (a *Allocator) Allocate(req Request) (Placement, error) {
	if err := req.validate(); err != nil {
		return Placement{}, err
	}
	var (
		best      choice
		refusals  []refusal
		invalid   error
		lastModel *GPUModel
		cands     []*Profile
		candErr   error
	)
	for gi := range a.gpus {
		g := &a.gpus[gi]
		if g.unavailable != "" {
			refusals = append(refusals, refusal{gpu: g.index, why: g.unavailable})
			continue
		}
		if !a.modeFits(g, req.WholeGPU) {
			refusals = append(refusals, refusal{gpu: g.index, why: g.modeMismatch()})
			continue
		}
		if why := g.admits(req.Tenant, req.Isolation, req.WholeGPU); why != "" {
			refusals = append(refusals, refusal{gpu: g.index, why: why})
			continue
		}
		if req.WholeGPU {
			if g.state.empty() {
				c := choice{gpu: g, orderNo: gi}
				if c.better(&best, a.strategy) {
					best = c
				}
			} else {
				refusals = append(refusals, refusal{gpu: g.index, why: "not empty"})
			}
			continue
		}
		if g.model != lastModel {
			lastModel = g.model
			cands, candErr = req.candidates(g.model)
		}
		if candErr != nil {
			invalid = candErr
			continue
		}
		before := 0
		if a.strategy == BestFit {
			before = g.state.capacity(g.model)
		}
		first := refusal{gpu: g.index}
		for rank, p := range cands {
			for _, start := range p.Starts {
				if w := g.state.fits(p, start); w != "" {
					if first.why == "" {
						first.prof, first.why = p, w
					}
					continue
				}
				c := choice{gpu: g, prof: p, start: start, rank: rank, used: g.state.compute, orderNo: gi}
				if a.strategy == BestFit {
					after := g.state
					after.add(p, start)
					c.loss = before - after.capacity(g.model)
				}
				if c.better(&best, a.strategy) {
					best = c
				}
			}
		}
		if first.why != "" {
			refusals = append(refusals, first)
		}
	}
	if best.gpu == nil {
		if invalid != nil {
			return Placement{}, invalid
		}
		reasons := make([]string, 0, len(refusals)+1)
		for _, r := range refusals {
			reasons = append(reasons, r.String())
		}
		if len(a.gpus) == 0 {
			reasons = append(reasons, "node has no GPUs")
		}
		return Placement{}, fmt.Errorf("%w: %s for tenant %s (owner %s) does not fit: %s",
			ErrInsufficientResources, req.what(), req.Tenant, req.Owner, strings.Join(reasons, "; "))
	}
	p := Placement{GPU: best.gpu.index, Start: best.start, Tenant: req.Tenant, Owner: req.Owner, Isolation: req.Isolation}
	if req.WholeGPU {
		p.Profile = wholeGPUProfile
		best.gpu.takeWhole(p)
		p.Size, p.Compute = MemorySlots, ComputeSlices
		return p, nil
	}
	best.gpu.take(best.prof, p)
	p.Profile, p.Size, p.Compute = best.prof.Name, best.prof.Slots, best.prof.Compute
	return p, nil
}

// Plan places several requests all or nothing: on error the allocator is
// unchanged and the error names the first request that did not fit.
func (a *Allocator) Plan(reqs []Request) ([]Placement, error) {
	c := a.Clone()
	out := make([]Placement, 0, len(reqs))
	for i, r := range reqs {
		p, err := c.Allocate(r)
		if err != nil {
			return nil, fmt.Errorf("request %d: %w", i+1, err)
		}
		out = append(out, p)
	}
	*a = *c
	return out, nil
}

// Release frees every placement the owner holds and returns them. Releasing
// an owner that holds nothing is not an error, so teardown and GC may repeat.
func (a *Allocator) Release(owner string) []Placement {
	var out []Placement
	for gi := range a.gpus {
		g := &a.gpus[gi]
		kept := g.placements[:0]
		for _, p := range g.placements {
			if p.Owner != owner {
				kept = append(kept, p)
				continue
			}
			out = append(out, p)
			g.free(p)
		}
		g.placements = kept
	}
	return out
}

func (g *gpuSlot) free(p Placement) {
	if p.Whole() {
		g.state.whole = false
		return
	}
	prof, err := g.model.Profile(p.Profile)
	if err != nil {
		return // cannot happen: placements are validated on entry
	}
	g.state.remove(prof, p.Start)
}

// Placements lists every placement ordered by GPU and start.
func (a *Allocator) Placements() []Placement {
	var out []Placement
	for _, g := range a.gpus {
		out = append(out, g.placements...)
	}
	return out
}

// GPUUsage summarises one GPU's occupancy.
type GPUUsage struct {
	Index int `json:"index"`
	// Model is the short model name.
	Model string `json:"model"`
	// Compute is the compute slices in use (7 for a whole GPU).
	Compute int `json:"compute"`
	// Slots is the memory slots in use.
	Slots int `json:"slots"`
	// LargestFree is the compute of the largest profile that still fits.
	LargestFree int `json:"largest_free"`
}

// Usage reports every GPU's occupancy ordered by index.
func (a *Allocator) Usage() []GPUUsage {
	out := make([]GPUUsage, len(a.gpus))
	for i, g := range a.gpus {
		u := GPUUsage{Index: g.index, Model: g.model.Name, Compute: g.state.compute, Slots: g.state.usedSlots(), LargestFree: g.state.largestFree(g.model)}
		if g.state.whole {
			u.Compute, u.Slots = ComputeSlices, MemorySlots
		}
		out[i] = u
	}
	return out
}
