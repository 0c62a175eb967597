package mig

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

const (
	// MemorySlots is the number of memory slots a MIG-capable GPU is divided
	// into. NVML reports placements (start, size) in these units.
	MemorySlots = 8
	// ComputeSlices is the number of compute slices (GPCs usable by MIG) on
	// every supported GPU.
	ComputeSlices = 7
)

// Profile is one GPU-instance profile of a GPU model, e.g. "3g.71gb" on H200.
type Profile struct {
	// Name is derived from the other fields ("<compute>g.<memory>gb", plus
	// "+me" for the media-extension variant); it is never a lookup key in
	// the geometry tables.
	Name string
	// Compute is the number of compute slices (the "g" in the name).
	Compute int
	// Slots is the number of memory slots the instance occupies: its size
	// in an NVML placement.
	Slots int
	// MemoryGB is the memory size as it appears in the profile name.
	MemoryGB int
	// Media is true for the "+me" profile that owns all media engines.
	Media bool
	// MediaEngines is true where an instance of the profile has the GPU's
	// JPEG decoders and optical flow accelerator: the "+me" profile and the
	// whole-GPU profile (NVML reports JPEG and OFA for 7g on a real H200,
	// driver 580). The hardware check compares NVML's engine counts with
	// it; Media, not this, is what a request for media engines selects.
	MediaEngines bool
	// Instances is the most instances of this profile a GPU can hold.
	Instances int
	// Starts are the memory slots where an instance may begin, ascending.
	Starts []int
	// NVMLProfile is the nvml.GPU_INSTANCE_PROFILE_* enum to pass to
	// GetGpuInstanceProfileInfo. The profile ID NVML uses to create and
	// list instances is read from the returned info, never assumed.
	NVMLProfile int
	// ComputeProfile is the nvml.COMPUTE_INSTANCE_PROFILE_* enum of the
	// compute instance that spans the whole GPU instance.
	ComputeProfile int

	index int // position in GPUModel.Profiles
}

// SlotMask is the bit mask of memory slots an instance starting at start occupies.
func (p *Profile) SlotMask(start int) uint8 {
	return uint8(((1 << p.Slots) - 1) << start)
}

// ValidStart reports whether start is one of the profile's allowed placements.
func (p *Profile) ValidStart(start int) bool {
	for _, s := range p.Starts {
		if s == start {
			return true
		}
	}
	return false
}

// GPUModel is the MIG geometry of one GPU model.
type GPUModel struct {
	// Name is the short name used on the command line ("h200").
	Name string
	// Product is the product name with its memory ("H200-141GB").
	Product string
	// MemoryGB is the marketed memory size the profile names derive from.
	MemoryGB int
	// Profiles is ordered by compute, then memory, then media extension.
	Profiles []Profile
}

// shape is what every supported model shares: the Ampere, Hopper and
// Blackwell MIG layouts all have 7 compute slices over 8 memory slots with
// the same placements. Only the memory per slot differs.
type shape struct {
	compute, slots, instances int
	media, engines            bool
	starts                    []int
	nvmlProfile, ciProfile    int
}

var shapes = []shape{
	{compute: 1, slots: 1, instances: 7, starts: []int{0, 1, 2, 3, 4, 5, 6}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	{compute: 1, slots: 1, instances: 1, media: true, engines: true, starts: []int{0, 1, 2, 3, 4, 5, 6}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	{compute: 1, slots: 2, instances: 4, starts: []int{0, 2, 4, 6}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE},
	{compute: 2, slots: 2, instances: 3, starts: []int{0, 2, 4}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE},
	{compute: 3, slots: 4, instances: 2, starts: []int{0, 4}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE},
	{compute: 4, slots: 4, instances: 1, starts: []int{0}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_4_SLICE, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE},
	{compute: 7, slots: 8, instances: 1, engines: true, starts: []int{0}, nvmlProfile: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ciProfile: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE},
}

func newModel(name, product string, memoryGB int) *GPUModel {
	m := &GPUModel{Name: name, Product: product, MemoryGB: memoryGB}
	for i, s := range shapes {
		// Memory in the name: the slot share of the marketed size,
		// rounded half up (141 GB / 8 = 17.6 -> "18gb", 180/8*2 = 45).
		gb := (memoryGB*s.slots + MemorySlots/2) / MemorySlots
		p := Profile{
			Compute:        s.compute,
			Slots:          s.slots,
			MemoryGB:       gb,
			Media:          s.media,
			MediaEngines:   s.engines,
			Instances:      s.instances,
			Starts:         s.starts,
			NVMLProfile:    s.nvmlProfile,
			ComputeProfile: s.ciProfile,
			index:          i,
		}
		p.Name = profileName(p.Compute, p.MemoryGB, p.Media)
		m.Profiles = append(m.Profiles, p)
	}
	return m
}

func profileName(compute, memoryGB int, media bool) string {
	n := fmt.Sprintf("%dg.%dgb", compute, memoryGB)
	if media {
		n += "+me"
	}
	return n
}

var models = []*GPUModel{
	newModel("a100-40gb", "A100-40GB", 40),
	newModel("a100-80gb", "A100-80GB", 80),
	newModel("h100", "H100-80GB", 80),
	newModel("h200", "H200-141GB", 141),
	newModel("b200", "B200-180GB", 180),
}

var modelAliases = map[string]string{
	"a100-40gb":  "a100-40gb",
	"a100-80gb":  "a100-80gb",
	"h100":       "h100",
	"h100-80gb":  "h100",
	"h200":       "h200",
	"h200-141gb": "h200",
	"b200":       "b200",
	"b200-180gb": "b200",
}

// Models returns the short names of every supported model.
func Models() []string {
	names := make([]string, len(models))
	for i, m := range models {
		names[i] = m.Name
	}
	return names
}

// Model returns the geometry of a GPU model by its short name ("h200",
// "h100", "a100-40gb", "a100-80gb", "b200"; case-insensitive).
func Model(name string) (*GPUModel, error) {
	key, ok := modelAliases[strings.ToLower(strings.TrimSpace(name))]
	if ok {
		for _, m := range models {
			if m.Name == key {
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("gpu model %q: unknown, want one of %s", name, strings.Join(Models(), ", "))
}

// ModelForDevice maps the name and total memory NVML reports for a device to
// its geometry, e.g. "NVIDIA H200 141GB HBM3e" -> h200.
func ModelForDevice(deviceName string, memoryMiB uint64) (*GPUModel, error) {
	n := strings.ToUpper(deviceName)
	var key string
	switch {
	case strings.Contains(n, "A100"):
		key = "a100-40gb"
		if memoryMiB > 48*1024 || strings.Contains(n, "80GB") {
			key = "a100-80gb"
		}
	case strings.Contains(n, "H100"):
		key = "h100"
	case strings.Contains(n, "H200"):
		key = "h200"
	case strings.Contains(n, "B200"):
		key = "b200"
	default:
		return nil, fmt.Errorf("gpu %q: no MIG geometry for this model (supported: %s)", deviceName, strings.Join(Models(), ", "))
	}
	return Model(key)
}

// Profile looks a profile up by name ("3g.71gb", "MIG 3g.71gb", "1g.18gb+me").
func (m *GPUModel) Profile(name string) (*Profile, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	n = strings.TrimPrefix(n, "mig ")
	for i := range m.Profiles {
		if m.Profiles[i].Name == n {
			return &m.Profiles[i], nil
		}
	}
	names := make([]string, len(m.Profiles))
	for i, p := range m.Profiles {
		names[i] = p.Name
	}
	return nil, fmt.Errorf("profile %q: not a %s profile, want one of %s", name, m.Name, strings.Join(names, ", "))
}

// Smallest returns the profiles that satisfy a minimum memory (GB) and
// compute, smallest first, excluding "+me" unless media is set.
func (m *GPUModel) Smallest(minMemoryGB, minCompute int, media bool) []*Profile {
	var out []*Profile
	for i := range m.Profiles {
		p := &m.Profiles[i]
		if p.Media != media || p.MemoryGB < minMemoryGB || p.Compute < minCompute {
			continue
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Slots != out[j].Slots {
			return out[i].Slots < out[j].Slots
		}
		return out[i].Compute < out[j].Compute
	})
	return out
}

// Configurations lists every combination of instances one GPU of the model
// can hold at once, as counts per profile (indexed like Profiles), ordered
// by their encoding. It includes the empty GPU.
func (m *GPUModel) Configurations() [][]int {
	// Visit every reachable occupancy once: the same counts at other
	// starts may leave room for different additions.
	visited := map[gpuState]bool{}
	seen := map[[8]int8]bool{}
	var walk func(s gpuState)
	walk = func(s gpuState) {
		if visited[s] {
			return
		}
		visited[s] = true
		seen[s.counts] = true
		for pi := range m.Profiles {
			p := &m.Profiles[pi]
			for _, st := range p.Starts {
				if s.fits(p, st) == "" {
					next := s
					next.add(p, st)
					walk(next)
				}
			}
		}
	}
	walk(gpuState{})
	out := make([][]int, 0, len(seen))
	for c := range seen {
		v := make([]int, len(m.Profiles))
		for i := range v {
			v[i] = int(c[i])
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		for k := range out[i] {
			if out[i][k] != out[j][k] {
				return out[i][k] < out[j][k]
			}
		}
		return false
	})
	return out
}
