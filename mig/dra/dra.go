package dra

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

const (
	// DriverName is the DRA driver that publishes Bulkhead's MIG slices. It
	// is also the domain of the devices' attributes and capacities.
	DriverName = "mig.bulkhead.dev"
	// DeviceClassName is the DeviceClass a ResourceClaim names to ask for
	// one of Bulkhead's MIG slices.
	DeviceClassName = "mig.bulkhead.dev"
)

// Attributes and capacities of every published device, unqualified: the
// API qualifies them with DriverName (CEL: device.attributes["mig.bulkhead.dev"].profile).
const (
	// AttrProfile is the profile name, "3g.71gb". A claim selects on it.
	AttrProfile = "profile"
	// AttrModel is the GPU's short model name, "h200".
	AttrModel = "model"
	// AttrGPUIndex is the NVML index of the parent GPU.
	AttrGPUIndex = "gpuIndex"
	// AttrGPUUUID is the parent GPU's UUID, "GPU-…".
	AttrGPUUUID = "gpuUUID"
	// AttrStart is the placement's first memory slot, as NVML reports it.
	AttrStart = "placementStart"
	// AttrSize is the placement's number of memory slots.
	AttrSize = "placementSize"
	// AttrCompute is the number of compute slices.
	AttrCompute = "computeSlices"
	// AttrMedia is true for the "+me" profile that owns the media engines.
	AttrMedia = "media"
	// CapMemory is the slice's memory as its profile name gives it, in
	// decimal gigabytes ("71G" for 3g.71gb).
	CapMemory = "memory"
)

// Counter names in every GPU's counter set.
const (
	// CounterCompute counts the GPU's compute slices.
	CounterCompute = "compute-slices"
	counterSlot    = "memory-slot-" // + slot index, one per memory slot
	counterLimit   = "-instances"   // profile label + this: an instance limit
)

// Order is the order devices are published in: the placement policy the
// scheduler's first fit follows (see the package doc).
type Order int

const (
	// OrderPreferred is Bulkhead's: profiles smallest first, then GPUs by
	// index, then each profile's starts in best fit's order of preference.
	OrderPreferred Order = iota
	// OrderAscending is the naive order: profiles as the geometry lists
	// them, then GPUs by index, then starts ascending. First fit over it
	// places as mig.FirstFit does.
	OrderAscending
)

func (o Order) String() string {
	if o == OrderAscending {
		return "ascending"
	}
	return "preferred"
}

// Options shape a publication.
type Options struct {
	// Order is the device order (OrderPreferred by default).
	Order Order
}

// Slice is the content of one ResourceSlice of the node's pool: counter
// sets or devices, never both (the API refuses a slice with both).
type Slice struct {
	// SharedCounters are the counter sets of up to 8 GPUs.
	SharedCounters []resourcev1.CounterSet
	// Devices are up to 64 devices, in the order first fit tries them.
	Devices []resourcev1.Device
}

// Publish builds the ResourceSlice content for a node's GPUs: counter slices
// first, then device slices, every profile's devices kept in one slice
// where they fit. GPUs without MIG mode, or whose MIG mode change waits for
// a reset, publish nothing (whole GPUs are not offered through DRA). The
// same GPUs and options always give the same slices.
func Publish(gpus []mig.GPUInfo, o Options) ([]Slice, error) {
	if o.Order != OrderPreferred && o.Order != OrderAscending {
		return nil, fmt.Errorf("order %d: want OrderPreferred or OrderAscending", o.Order)
	}
	gpus = append([]mig.GPUInfo(nil), gpus...)
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	type published struct {
		info  mig.GPUInfo
		model *mig.GPUModel
	}
	var pub []published
	for i, g := range gpus {
		if i > 0 && gpus[i-1].Index == g.Index {
			return nil, fmt.Errorf("gpu index %d: listed twice", g.Index)
		}
		if g.Index < 0 {
			return nil, fmt.Errorf("gpu index %d: must not be negative", g.Index)
		}
		if !g.MIGEnabled || g.MIGPending {
			continue
		}
		if g.UUID == "" {
			return nil, fmt.Errorf("gpu %d: uuid: must not be empty", g.Index)
		}
		m, err := mig.Model(g.Model)
		if err != nil {
			return nil, fmt.Errorf("gpu %d: %w", g.Index, err)
		}
		pub = append(pub, published{g, m})
	}
	if len(pub) == 0 {
		return nil, nil
	}

	var out []Slice
	for i := 0; i < len(pub); i += resourcev1.ResourceSliceMaxCounterSets {
		var s Slice
		for _, p := range pub[i:min(i+resourcev1.ResourceSliceMaxCounterSets, len(pub))] {
			s.SharedCounters = append(s.SharedCounters, counterSet(p.info.Index, p.model))
		}
		out = append(out, s)
	}

	// One group per (model, profile): the devices a claim for that
	// profile walks, in the order it walks them.
	type group struct {
		model   *mig.GPUModel
		profile *mig.Profile
	}
	var groups []group
	seen := map[*mig.GPUModel]bool{}
	for _, p := range pub {
		if seen[p.model] {
			continue
		}
		seen[p.model] = true
		for _, prof := range profileOrder(p.model, o.Order) {
			groups = append(groups, group{p.model, prof})
		}
	}
	const maxDevices = resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures
	var cur []resourcev1.Device
	flush := func() {
		if len(cur) > 0 {
			out = append(out, Slice{Devices: cur})
			cur = nil
		}
	}
	for _, g := range groups {
		starts := startOrder(g.model, g.profile, o.Order)
		var devs []resourcev1.Device
		for _, p := range pub {
			if p.model != g.model {
				continue
			}
			for _, st := range starts {
				devs = append(devs, device(p.info, p.model, g.profile, st))
			}
		}
		if len(cur)+len(devs) > maxDevices {
			flush()
		}
		for _, d := range devs {
			if len(cur) == maxDevices {
				flush()
			}
			cur = append(cur, d)
		}
	}
	flush()
	return out, nil
}

// Specs completes slices into ResourceSlice specs of one pool named after
// the node, generation 1, as the kubelet plugin helper would publish them.
func Specs(node string, slices []Slice) []resourcev1.ResourceSliceSpec {
	out := make([]resourcev1.ResourceSliceSpec, len(slices))
	for i, s := range slices {
		out[i] = resourcev1.ResourceSliceSpec{
			Driver:         DriverName,
			Pool:           resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(slices))},
			NodeName:       &node,
			SharedCounters: s.SharedCounters,
			Devices:        s.Devices,
		}
	}
	return out
}

// DeviceClass is the class a claim names to get one of Bulkhead's slices.
func DeviceClass() *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourcev1.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: DeviceClassName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", DriverName)},
		}}},
	}
}

// ProfileSelector is the CEL expression a claim's request uses to ask for
// one profile, e.g. `device.attributes["mig.bulkhead.dev"].profile == "3g.71gb"`.
func ProfileSelector(profile string) string {
	return fmt.Sprintf("device.attributes[%q].%s == %q", DriverName, AttrProfile, profile)
}

// DeviceName is the name of the device for profile at start on GPU gpu: a
// DNS label, unique in the node's pool ("gpu0-1g-18gb-me-at6").
func DeviceName(gpu int, profile string, start int) string {
	return fmt.Sprintf("gpu%d-%s-at%d", gpu, label(profile), start)
}

// CounterSetName is the name of GPU gpu's counter set.
func CounterSetName(gpu int) string { return "gpu" + strconv.Itoa(gpu) }

// SlotCounter is the name of memory slot i's counter.
func SlotCounter(i int) string { return counterSlot + strconv.Itoa(i) }

// label turns a profile name into DNS-label characters: "1g.18gb+me" -> "1g-18gb-me".
func label(profile string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(profile))
}

// limited reports whether a profile's instance limit is tighter than what
// its memory slots and compute slices already allow, so that it needs a
// counter of its own.
func limited(p *mig.Profile) bool {
	natural := min(len(p.Starts), mig.ComputeSlices/p.Compute, mig.MemorySlots/p.Slots)
	return p.Instances < natural
}

func counterSet(gpu int, m *mig.GPUModel) resourcev1.CounterSet {
	cs := resourcev1.CounterSet{Name: CounterSetName(gpu), Counters: map[string]resourcev1.Counter{
		CounterCompute: {Value: *resource.NewQuantity(mig.ComputeSlices, resource.DecimalSI)},
	}}
	for i := 0; i < mig.MemorySlots; i++ {
		cs.Counters[SlotCounter(i)] = resourcev1.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
	}
	for i := range m.Profiles {
		if p := &m.Profiles[i]; limited(p) {
			cs.Counters[label(p.Name)+counterLimit] = resourcev1.Counter{Value: *resource.NewQuantity(int64(p.Instances), resource.DecimalSI)}
		}
	}
	return cs
}

func device(g mig.GPUInfo, m *mig.GPUModel, p *mig.Profile, start int) resourcev1.Device {
	one := *resource.NewQuantity(1, resource.DecimalSI)
	use := map[string]resourcev1.Counter{
		CounterCompute: {Value: *resource.NewQuantity(int64(p.Compute), resource.DecimalSI)},
	}
	for i := start; i < start+p.Slots; i++ {
		use[SlotCounter(i)] = resourcev1.Counter{Value: one}
	}
	if limited(p) {
		use[label(p.Name)+counterLimit] = resourcev1.Counter{Value: one}
	}
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }
	num := func(n int) resourcev1.DeviceAttribute { v := int64(n); return resourcev1.DeviceAttribute{IntValue: &v} }
	media := p.Media
	return resourcev1.Device{
		Name: DeviceName(g.Index, p.Name, start),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			AttrProfile:  str(p.Name),
			AttrModel:    str(m.Name),
			AttrGPUIndex: num(g.Index),
			AttrGPUUUID:  str(g.UUID),
			AttrStart:    num(start),
			AttrSize:     num(p.Slots),
			AttrCompute:  num(p.Compute),
			AttrMedia:    {BoolValue: &media},
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			CapMemory: {Value: *resource.NewScaledQuantity(int64(p.MemoryGB), resource.Giga)},
		},
		ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: CounterSetName(g.Index), Counters: use}},
	}
}

// profileOrder lists a model's profiles in the order claims should find
// them: smallest first (memory slots, then compute, plain before "+me") for
// OrderPreferred, as the geometry lists them for OrderAscending.
func profileOrder(m *mig.GPUModel, o Order) []*mig.Profile {
	out := make([]*mig.Profile, len(m.Profiles))
	for i := range m.Profiles {
		out[i] = &m.Profiles[i]
	}
	if o == OrderPreferred {
		sort.SliceStable(out, func(i, j int) bool {
			a, b := out[i], out[j]
			if a.Slots != b.Slots {
				return a.Slots < b.Slots
			}
			if a.Compute != b.Compute {
				return a.Compute < b.Compute
			}
			return !a.Media && b.Media
		})
	}
	return out
}

// startOrder lists a profile's starts in the order first fit should try
// them on one GPU. OrderPreferred asks Bulkhead's own allocator (best fit)
// to fill an empty GPU with the profile alone and takes the starts in the
// order it chose them; starts it never reached follow ascending.
func startOrder(m *mig.GPUModel, p *mig.Profile, o Order) []int {
	if o == OrderAscending {
		return append([]int(nil), p.Starts...)
	}
	var out []int
	taken := map[int]bool{}
	a, err := mig.NewAllocator(mig.NodeGPUs(m.Name, 1), nil, mig.WithStrategy(mig.BestFit))
	if err == nil {
		for i := 0; i < len(p.Starts); i++ {
			pl, err := a.Allocate(mig.Request{Owner: "order-" + strconv.Itoa(i), Tenant: "order", Profile: p.Name})
			if err != nil {
				break
			}
			out = append(out, pl.Start)
			taken[pl.Start] = true
		}
	}
	for _, s := range p.Starts {
		if !taken[s] {
			out = append(out, s)
		}
	}
	return out
}

// Partition is the MIG placement a published device stands for.
type Partition struct {
	// GPU is the NVML index of the parent GPU.
	GPU int
	// GPUUUID is the parent GPU's UUID.
	GPUUUID string
	// Model is the GPU's short model name.
	Model string
	// Profile is the profile name.
	Profile string
	// Start and Size are the placement in memory slots.
	Start, Size int
	// Compute is the number of compute slices.
	Compute int
}

// PartitionOf reads back what a published device stands for, checking it
// against the geometry: the kubelet plugin's way from an allocated device
// to the placement it must create.
func PartitionOf(d resourcev1.Device) (Partition, error) {
	var (
		p    Partition
		errs []string
	)
	str := func(name resourcev1.QualifiedName) string {
		a, ok := d.Attributes[name]
		if !ok || a.StringValue == nil {
			errs = append(errs, string(name)+": missing or not a string")
			return ""
		}
		return *a.StringValue
	}
	num := func(name resourcev1.QualifiedName) int {
		a, ok := d.Attributes[name]
		if !ok || a.IntValue == nil {
			errs = append(errs, string(name)+": missing or not an int")
			return -1
		}
		return int(*a.IntValue)
	}
	p.GPU, p.GPUUUID, p.Model, p.Profile = num(AttrGPUIndex), str(AttrGPUUUID), str(AttrModel), str(AttrProfile)
	p.Start, p.Size, p.Compute = num(AttrStart), num(AttrSize), num(AttrCompute)
	if len(errs) > 0 {
		return Partition{}, fmt.Errorf("device %s: %s", d.Name, strings.Join(errs, "; "))
	}
	m, err := mig.Model(p.Model)
	if err != nil {
		return Partition{}, fmt.Errorf("device %s: %w", d.Name, err)
	}
	prof, err := m.Profile(p.Profile)
	if err != nil {
		return Partition{}, fmt.Errorf("device %s: %w", d.Name, err)
	}
	if !prof.ValidStart(p.Start) || prof.Slots != p.Size || prof.Compute != p.Compute {
		return Partition{}, fmt.Errorf("device %s: %s at %d size %d compute %d: not a %s placement", d.Name, p.Profile, p.Start, p.Size, p.Compute, m.Name)
	}
	if want := DeviceName(p.GPU, p.Profile, p.Start); d.Name != want {
		return Partition{}, fmt.Errorf("device %s: attributes name device %s", d.Name, want)
	}
	return p, nil
}
