package nvmlbackend

import (
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// Discovery is one GPU's MIG geometry as NVML reports it. Discover reads it
// without changing anything: no MIG mode change, no instance created.
type Discovery struct {
	Index     int    `json:"index"`
	Name      string `json:"name"`
	UUID      string `json:"uuid"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// MIGMode is "enabled", "disabled", "enabled, pending disabled" (and
	// the reverse) or "not supported".
	MIGMode string `json:"migMode"`
	// Model is Bulkhead's geometry for the GPU ("h200"); ModelError says
	// why there is none.
	Model      string `json:"model,omitempty"`
	ModelError string `json:"modelError,omitempty"`
	// Profiles are every GPU-instance profile the driver offers, in the
	// order of the nvml.GPU_INSTANCE_PROFILE_* enum.
	Profiles []DiscoveredProfile `json:"profiles"`
}

// DiscoveredProfile is one GPU-instance profile as NVML reports it.
type DiscoveredProfile struct {
	// Enum is the nvml.GPU_INSTANCE_PROFILE_* value it was asked for with;
	// ID is the profile ID the driver gives it.
	Enum int    `json:"enum"`
	ID   uint32 `json:"id"`
	// Name is the driver's own name ("MIG 3g.71gb"), where it gives one;
	// NameError says why it gave none.
	Name       string `json:"name,omitempty"`
	NameError  string `json:"nameError,omitempty"`
	Slices     int    `json:"slices"`
	Instances  int    `json:"instances"`
	MemoryMiB  uint64 `json:"memoryMiB"`
	Media      bool   `json:"media"`
	Placements []Span `json:"placements"`
	// PlacementError is set when the driver gave the profile but not its
	// placements.
	PlacementError string `json:"placementError,omitempty"`
}

// Span is a placement in memory slots.
type Span struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// DiscoverOptions shape Discover.
type DiscoverOptions struct {
	// ProfileNames reads each profile's name through the versioned profile
	// query (nvmlDeviceGetGpuInstanceProfileInfoV, version 3). Only real
	// NVML has it: go-nvml's mocks do not implement the call.
	ProfileNames bool
}

// Discover reads every GPU's MIG profiles and possible placements from
// NVML. NVML reports placements whether MIG mode is on or off, so a GPU
// can be compared with what Bulkhead would publish before MIG is enabled.
func Discover(lib nvml.Interface, opts DiscoverOptions) ([]Discovery, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, nvmlErr("init", ret)
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr("device count", ret)
	}
	out := make([]Discovery, 0, n)
	for i := 0; i < n; i++ {
		d, err := discoverGPU(lib, i, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func discoverGPU(lib nvml.Interface, i int, opts DiscoverOptions) (Discovery, error) {
	d := Discovery{Index: i}
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("gpu %d", i), ret)
	}
	var mem nvml.Memory
	for _, step := range []struct {
		what string
		call func() nvml.Return
	}{
		{"name", func() (r nvml.Return) { d.Name, r = dev.GetName(); return }},
		{"uuid", func() (r nvml.Return) { d.UUID, r = dev.GetUUID(); return }},
		{"memory", func() (r nvml.Return) { mem, r = dev.GetMemoryInfo(); return }},
	} {
		if ret := step.call(); ret != nvml.SUCCESS {
			return d, nvmlErr(fmt.Sprintf("gpu %d %s", i, step.what), ret)
		}
	}
	d.MemoryMiB = mem.Total / (1024 * 1024)
	if m, err := mig.ModelForDevice(d.Name, d.MemoryMiB); err != nil {
		d.ModelError = err.Error()
	} else {
		d.Model = m.Name
	}
	switch current, pending, ret := dev.GetMigMode(); {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		d.MIGMode = "not supported"
		return d, nil
	case ret != nvml.SUCCESS:
		return d, nvmlErr(fmt.Sprintf("gpu %d mig mode", i), ret)
	case current != pending:
		d.MIGMode = migModeName(current) + ", pending " + migModeName(pending)
	default:
		d.MIGMode = migModeName(current)
	}
	for enum := 0; enum < nvml.GPU_INSTANCE_PROFILE_COUNT; enum++ {
		info, ret := dev.GetGpuInstanceProfileInfo(enum)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // the driver does not offer this profile on this GPU
		}
		if ret != nvml.SUCCESS {
			return d, nvmlErr(fmt.Sprintf("gpu %d profile enum %d", i, enum), ret)
		}
		p := DiscoveredProfile{
			Enum: enum, ID: info.Id,
			Slices: int(info.SliceCount), Instances: int(info.InstanceCount),
			MemoryMiB: info.MemorySizeMB,
			Media:     info.JpegCount > 0 && info.OfaCount > 0,
		}
		if opts.ProfileNames {
			if v3, ret := dev.GetGpuInstanceProfileInfoV(enum).V3(); ret == nvml.SUCCESS {
				p.Name = cString(v3.Name[:])
			} else if v2, ret2 := dev.GetGpuInstanceProfileInfoV(enum).V2(); ret2 == nvml.SUCCESS {
				p.Name = cString(v2.Name[:])
			} else {
				p.NameError = fmt.Sprintf("profile info v3: %v, v2: %v", ret, ret2)
			}
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			p.PlacementError = nvmlErr("placements", ret).Error()
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, Span{Start: int(pl.Start), Size: int(pl.Size)})
		}
		sort.Slice(p.Placements, func(a, b int) bool { return p.Placements[a].Start < p.Placements[b].Start })
		d.Profiles = append(d.Profiles, p)
	}
	return d, nil
}

func cString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// ProfileCheck is one of Bulkhead's profiles set against the driver's.
type ProfileCheck struct {
	Profile string `json:"profile"`
	// Driver is the driver's profile with the same enum; nil when the
	// driver does not offer it.
	Driver *DiscoveredProfile `json:"driver,omitempty"`
	// Published are the placements of the devices Bulkhead publishes for
	// the profile, ascending.
	Published []Span `json:"published"`
	// Together is how many of those devices the published counters let
	// the scheduler allocate at once on an empty GPU.
	Together int `json:"together"`
	// Problems are the differences; none when the two agree.
	Problems []string `json:"problems,omitempty"`
}

// Comparison sets what Bulkhead's DRA driver publishes for a GPU against
// what its driver reports.
type Comparison struct {
	GPU      int            `json:"gpu"`
	Model    string         `json:"model"`
	Devices  int            `json:"devices"`
	Profiles []ProfileCheck `json:"profiles"`
	// Unpublished are the driver's profiles Bulkhead's geometry does not
	// have, and so does not publish.
	Unpublished []DiscoveredProfile `json:"unpublished,omitempty"`
}

// OK reports whether every published profile matches the driver.
func (c Comparison) OK() bool {
	for _, p := range c.Profiles {
		if len(p.Problems) > 0 {
			return false
		}
	}
	return true
}

// Compare builds what the DRA driver publishes for d's GPU (as if MIG mode
// were on: a GPU with MIG off publishes nothing) and checks it device by
// device against the driver's profiles and placements: the same profiles
// with the same compute slices, instance limit, media engines and name, one
// device per possible placement and no other, and counters that let
// exactly the driver's instance limit be allocated together.
func Compare(d Discovery) (Comparison, error) {
	m, err := mig.Model(d.Model)
	if err != nil {
		return Comparison{}, fmt.Errorf("gpu %d (%s): %s", d.Index, d.Name, d.ModelError)
	}
	uuid := d.UUID
	if uuid == "" {
		uuid = fmt.Sprintf("GPU-unknown-%d", d.Index)
	}
	slices, err := dra.Publish([]mig.GPUInfo{{Index: d.Index, UUID: uuid, Name: d.Name, Model: m.Name, MIGEnabled: true}}, dra.Options{})
	if err != nil {
		return Comparison{}, fmt.Errorf("gpu %d: publish: %w", d.Index, err)
	}
	counters := map[string]int64{}
	byProfile := map[string][]resourcev1.Device{}
	c := Comparison{GPU: d.Index, Model: m.Name}
	for _, s := range slices {
		for _, cs := range s.SharedCounters {
			for name, v := range cs.Counters {
				counters[name] = v.Value.Value()
			}
		}
		for _, dev := range s.Devices {
			p, err := dra.PartitionOf(dev)
			if err != nil {
				return Comparison{}, fmt.Errorf("gpu %d: %w", d.Index, err)
			}
			byProfile[p.Profile] = append(byProfile[p.Profile], dev)
			c.Devices++
		}
	}
	byEnum := map[int]*DiscoveredProfile{}
	for i := range d.Profiles {
		byEnum[d.Profiles[i].Enum] = &d.Profiles[i]
	}
	used := map[int]bool{}
	for i := range m.Profiles {
		p := &m.Profiles[i]
		pc := ProfileCheck{Profile: p.Name, Driver: byEnum[p.NVMLProfile]}
		for _, dev := range byProfile[p.Name] {
			part, _ := dra.PartitionOf(dev)
			pc.Published = append(pc.Published, Span{Start: part.Start, Size: part.Size})
		}
		sort.Slice(pc.Published, func(a, b int) bool { return pc.Published[a].Start < pc.Published[b].Start })
		pc.Together = together(byProfile[p.Name], counters)
		if pc.Driver == nil {
			pc.Problems = append(pc.Problems, "published, but the driver does not offer this profile")
			c.Profiles = append(c.Profiles, pc)
			continue
		}
		used[p.NVMLProfile] = true
		pc.Problems = checkAgainstDriver(p, pc)
		c.Profiles = append(c.Profiles, pc)
	}
	for _, dp := range d.Profiles {
		if !used[dp.Enum] {
			c.Unpublished = append(c.Unpublished, dp)
		}
	}
	return c, nil
}

func checkAgainstDriver(p *mig.Profile, pc ProfileCheck) []string {
	drv := pc.Driver
	var problems []string
	add := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	if drv.Slices != p.Compute {
		add("compute slices: driver %d, published %d", drv.Slices, p.Compute)
	}
	if drv.Instances != p.Instances {
		add("instance limit: driver %d, geometry %d", drv.Instances, p.Instances)
	}
	if drv.Media != p.MediaEngines {
		add("media engines (JPEG and OFA): driver %v, geometry %v", drv.Media, p.MediaEngines)
	}
	if drv.Name != "" && strings.TrimPrefix(drv.Name, "MIG ") != p.Name {
		add("name: driver %q, published %q", drv.Name, p.Name)
	}
	if drv.PlacementError != "" {
		add("placements: %s", drv.PlacementError)
	} else if a, b := FormatSpans(drv.Placements), FormatSpans(pc.Published); a != b {
		add("placements: driver %s, published devices %s", a, b)
	}
	if pc.Together != drv.Instances {
		add("allocatable together on an empty GPU: driver %d, published counters %d", drv.Instances, pc.Together)
	}
	return problems
}

// FormatSpans writes placements as NVML's tools do: {0,4}:4, or
// {0:2,4:4} when their sizes differ.
func FormatSpans(s []Span) string {
	if len(s) == 0 {
		return "{}"
	}
	same := true
	for _, x := range s {
		same = same && x.Size == s[0].Size
	}
	parts := make([]string, len(s))
	for i, x := range s {
		if same {
			parts[i] = fmt.Sprint(x.Start)
		} else {
			parts[i] = fmt.Sprintf("%d:%d", x.Start, x.Size)
		}
	}
	if same {
		return fmt.Sprintf("{%s}:%d", strings.Join(parts, ","), s[0].Size)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// together is the largest number of devs the counters allow at once: what
// the scheduler's allocator could hand out for one profile on an empty GPU.
func together(devs []resourcev1.Device, counters map[string]int64) int {
	best := 0
	for set := 0; set < 1<<len(devs); set++ {
		use := map[string]int64{}
		n, fits := 0, true
		for i, dev := range devs {
			if set&(1<<i) == 0 {
				continue
			}
			n++
			for _, cc := range dev.ConsumesCounters {
				for name, v := range cc.Counters {
					use[name] += v.Value.Value()
					if use[name] > counters[name] {
						fits = false
					}
				}
			}
		}
		if fits && n > best {
			best = n
		}
	}
	return best
}
