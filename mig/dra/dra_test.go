package dra

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

func nodeGPUs(model string, n int) []mig.GPUInfo {
	out := make([]mig.GPUInfo, n)
	for i := range out {
		out[i] = mig.GPUInfo{Index: i, UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Model: model, MIGEnabled: true}
	}
	return out
}

func publish(t *testing.T, gpus []mig.GPUInfo, o Order) []Slice {
	t.Helper()
	s, err := Publish(gpus, Options{Order: o})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func devices(slices []Slice) []resourcev1.Device {
	var out []resourcev1.Device
	for _, s := range slices {
		out = append(out, s.Devices...)
	}
	return out
}

func counterSets(slices []Slice) map[string]resourcev1.CounterSet {
	out := map[string]resourcev1.CounterSet{}
	for _, s := range slices {
		for _, cs := range s.SharedCounters {
			out[cs.Name] = cs
		}
	}
	return out
}

func TestCountersPerGPU(t *testing.T) {
	tests := []struct {
		model string
		gpus  int
		// limits are the instance-limit counters every set must hold.
		limits map[string]int64
	}{
		{"h200", 1, map[string]int64{"1g-18gb-me-instances": 1}},
		{"h200", 8, map[string]int64{"1g-18gb-me-instances": 1}},
		{"h100", 10, map[string]int64{"1g-10gb-me-instances": 1}},
		{"a100-40gb", 2, map[string]int64{"1g-5gb-me-instances": 1}},
		{"b200", 3, map[string]int64{"1g-23gb-me-instances": 1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s x%d", tt.model, tt.gpus), func(t *testing.T) {
			sets := counterSets(publish(t, nodeGPUs(tt.model, tt.gpus), OrderPreferred))
			if len(sets) != tt.gpus {
				t.Fatalf("%d counter sets, want one per GPU (%d)", len(sets), tt.gpus)
			}
			for g := 0; g < tt.gpus; g++ {
				cs, ok := sets[CounterSetName(g)]
				if !ok {
					t.Fatalf("no counter set for gpu %d", g)
				}
				want := map[string]int64{CounterCompute: mig.ComputeSlices}
				for i := 0; i < mig.MemorySlots; i++ {
					want[SlotCounter(i)] = 1
				}
				for k, v := range tt.limits {
					want[k] = v
				}
				got := map[string]int64{}
				for k, c := range cs.Counters {
					got[k] = c.Value.Value()
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("gpu %d counters %v, want %v", g, got, want)
				}
			}
		})
	}
}

func TestEveryPlacementConsumesItsSlots(t *testing.T) {
	for _, model := range mig.Models() {
		t.Run(model, func(t *testing.T) {
			m, _ := mig.Model(model)
			devs := devices(publish(t, nodeGPUs(model, 2), OrderPreferred))
			perGPU := 0
			for _, p := range m.Profiles {
				perGPU += len(p.Starts)
			}
			if len(devs) != 2*perGPU {
				t.Fatalf("%d devices, want %d: one per GPU, profile and start", len(devs), 2*perGPU)
			}
			for _, d := range devs {
				part, err := PartitionOf(d)
				if err != nil {
					t.Fatal(err)
				}
				prof, _ := m.Profile(part.Profile)
				if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != CounterSetName(part.GPU) {
					t.Fatalf("%s consumes %+v, want its own GPU's set only", d.Name, d.ConsumesCounters)
				}
				var slots []int
				for i := 0; i < mig.MemorySlots; i++ {
					if c, ok := d.ConsumesCounters[0].Counters[SlotCounter(i)]; ok {
						if c.Value.Value() != 1 {
							t.Errorf("%s consumes %s of slot %d", d.Name, c.Value.String(), i)
						}
						slots = append(slots, i)
					}
				}
				var want []int
				for i := part.Start; i < part.Start+prof.Slots; i++ {
					want = append(want, i)
				}
				if !reflect.DeepEqual(slots, want) {
					t.Errorf("%s consumes slots %v, want %v", d.Name, slots, want)
				}
				if c := d.ConsumesCounters[0].Counters[CounterCompute]; c.Value.Value() != int64(prof.Compute) {
					t.Errorf("%s consumes %s compute slices, want %d", d.Name, c.Value.String(), prof.Compute)
				}
				if c := d.Capacity[CapMemory]; c.Value.Value() != int64(prof.MemoryGB)*1e9 {
					t.Errorf("%s memory %s, want %d GB", d.Name, c.Value.String(), prof.MemoryGB)
				}
			}
		})
	}
}

func TestOverlappingDevicesShareACounter(t *testing.T) {
	byName := map[string]resourcev1.Device{}
	for _, d := range devices(publish(t, nodeGPUs("h200", 2), OrderPreferred)) {
		byName[d.Name] = d
	}
	tests := []struct {
		a, b   string
		shared []string // counters of value 1 both consume
	}{
		{"gpu0-1g-18gb-at4", "gpu0-3g-71gb-at4", []string{"memory-slot-4"}},
		{"gpu0-4g-71gb-at0", "gpu0-3g-71gb-at0", []string{"memory-slot-0", "memory-slot-1", "memory-slot-2", "memory-slot-3"}},
		{"gpu0-1g-35gb-at6", "gpu0-1g-18gb-at6", []string{"memory-slot-6"}},
		{"gpu0-7g-141gb-at0", "gpu0-1g-18gb-at3", []string{"memory-slot-3"}},
		{"gpu0-1g-18gb+me-at0", "gpu0-1g-18gb+me-at5", []string{"1g-18gb-me-instances"}},
		{"gpu0-3g-71gb-at0", "gpu0-3g-71gb-at4", nil},
		{"gpu0-3g-71gb-at0", "gpu1-3g-71gb-at0", nil},
	}
	for _, tt := range tests {
		t.Run(tt.a+" "+tt.b, func(t *testing.T) {
			a, ok1 := byName[strings.ReplaceAll(tt.a, "+", "-")]
			b, ok2 := byName[strings.ReplaceAll(tt.b, "+", "-")]
			if !ok1 || !ok2 {
				t.Fatalf("device missing: %s %v, %s %v", tt.a, ok1, tt.b, ok2)
			}
			var shared []string
			if a.ConsumesCounters[0].CounterSet == b.ConsumesCounters[0].CounterSet {
				for k := range a.ConsumesCounters[0].Counters {
					if _, ok := b.ConsumesCounters[0].Counters[k]; ok && k != CounterCompute {
						shared = append(shared, k)
					}
				}
			}
			if strings.Join(sorted(shared), ",") != strings.Join(tt.shared, ",") {
				t.Errorf("shared counters %v, want %v", sorted(shared), tt.shared)
			}
		})
	}
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// counterState is what the scheduler tracks of one GPU: counters left.
type counterState map[string]int64

func (c counterState) fits(d resourcev1.Device) bool {
	for k, v := range d.ConsumesCounters[0].Counters {
		if c[k] < v.Value.Value() {
			return false
		}
	}
	return true
}

func (c counterState) take(d resourcev1.Device, sign int64) {
	for k, v := range d.ConsumesCounters[0].Counters {
		c[k] -= sign * v.Value.Value()
	}
}

// TestCountersAreTheHardwareRules walks every occupancy one GPU can reach
// and checks that, in each, the counters allow exactly the devices the
// hardware rules (mig.Occupancy) allow.
func TestCountersAreTheHardwareRules(t *testing.T) {
	for _, model := range []string{"h200", "a100-40gb"} {
		t.Run(model, func(t *testing.T) {
			m, _ := mig.Model(model)
			slices := publish(t, nodeGPUs(model, 1), OrderPreferred)
			devs := devices(slices)
			parts := make([]Partition, len(devs))
			for i, d := range devs {
				parts[i], _ = PartitionOf(d)
			}
			init := counterState{}
			for k, c := range counterSets(slices)[CounterSetName(0)].Counters {
				init[k] = c.Value.Value()
			}
			visited := map[mig.Occupancy]bool{}
			var walk func(o mig.Occupancy, c counterState)
			walk = func(o mig.Occupancy, c counterState) {
				if visited[o] {
					return
				}
				visited[o] = true
				for i, d := range devs {
					prof, _ := m.Profile(parts[i].Profile)
					hw, ctr := o.Fits(prof, parts[i].Start), c.fits(d)
					if hw != ctr {
						t.Fatalf("%s: hardware %v, counters %v (counters left %v)", d.Name, hw, ctr, c)
					}
					if !hw {
						continue
					}
					next := o
					next.Add(prof, parts[i].Start)
					c.take(d, 1)
					walk(next, c)
					c.take(d, -1)
				}
			}
			walk(mig.Occupancy{}, init)
			if len(visited) < 100 {
				t.Fatalf("walked only %d occupancies", len(visited))
			}
		})
	}
}

func TestLimitsAndSplit(t *testing.T) {
	tests := []struct {
		model            string
		gpus             int
		counterSlices    int
		deviceSlices     int
		profilesSplitted int // profiles whose devices span slices
	}{
		{"h200", 1, 1, 1, 0},
		{"h200", 2, 1, 1, 0},
		{"h200", 8, 1, 4, 0},
		{"h200", 9, 2, 4, 0},
		{"h200", 10, 2, 6, 2},
		{"h100", 64, 8, 25, 5},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s x%d", tt.model, tt.gpus), func(t *testing.T) {
			slices := publish(t, nodeGPUs(tt.model, tt.gpus), OrderPreferred)
			var cs, ds int
			names := map[string]bool{}
			sliceOf := map[string]map[int]bool{}
			for si, s := range slices {
				switch {
				case len(s.SharedCounters) > 0 && len(s.Devices) > 0:
					t.Fatalf("slice %d holds counters and devices", si)
				case len(s.SharedCounters) > 0:
					cs++
				default:
					ds++
				}
				if len(s.SharedCounters) > resourcev1.ResourceSliceMaxCounterSets {
					t.Errorf("slice %d: %d counter sets", si, len(s.SharedCounters))
				}
				for _, c := range s.SharedCounters {
					if len(c.Counters) > resourcev1.ResourceSliceMaxCountersPerCounterSet {
						t.Errorf("counter set %s: %d counters", c.Name, len(c.Counters))
					}
				}
				if len(s.Devices) > resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures {
					t.Errorf("slice %d: %d devices consuming counters", si, len(s.Devices))
				}
				for _, d := range s.Devices {
					if names[d.Name] {
						t.Errorf("device %s published twice", d.Name)
					}
					names[d.Name] = true
					if len(d.ConsumesCounters) > resourcev1.ResourceSliceMaxDeviceCounterConsumptionsPerDevice ||
						len(d.ConsumesCounters[0].Counters) > resourcev1.ResourceSliceMaxCountersPerDeviceCounterConsumption {
						t.Errorf("%s: counter consumption over the limits", d.Name)
					}
					if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
						t.Errorf("%s: %d attributes and capacities", d.Name, n)
					}
					p := *d.Attributes[AttrProfile].StringValue
					if sliceOf[p] == nil {
						sliceOf[p] = map[int]bool{}
					}
					sliceOf[p][si] = true
				}
			}
			split := 0
			for _, s := range sliceOf {
				if len(s) > 1 {
					split++
				}
			}
			if cs != tt.counterSlices || ds != tt.deviceSlices || split != tt.profilesSplitted {
				t.Errorf("%d counter slices, %d device slices, %d profiles split; want %d, %d, %d",
					cs, ds, split, tt.counterSlices, tt.deviceSlices, tt.profilesSplitted)
			}
			specs := Specs("node-a", slices)
			for _, s := range specs {
				if s.Pool.ResourceSliceCount != int64(len(slices)) || s.Pool.Name != "node-a" || *s.NodeName != "node-a" || s.Driver != DriverName {
					t.Fatalf("spec %+v", s.Pool)
				}
			}
		})
	}
}

func TestNamesAreValid(t *testing.T) {
	var problems []string
	check := func(what, v string, msgs []string) {
		for _, m := range msgs {
			problems = append(problems, fmt.Sprintf("%s %q: %s", what, v, m))
		}
	}
	check("driver", DriverName, content.IsDNS1123Subdomain(DriverName))
	check("device class", DeviceClassName, content.IsDNS1123Subdomain(DeviceClassName))
	if len(DriverName) > resourcev1.DriverNameMaxLength {
		problems = append(problems, "driver name too long")
	}
	for _, model := range mig.Models() {
		slices := publish(t, nodeGPUs(model, 12), OrderPreferred)
		for _, cs := range counterSets(slices) {
			check("counter set", cs.Name, content.IsDNS1123Label(cs.Name))
			for k := range cs.Counters {
				check("counter", k, content.IsDNS1123Label(k))
			}
		}
		for _, d := range devices(slices) {
			check("device", d.Name, content.IsDNS1123Label(d.Name))
			for k, a := range d.Attributes {
				check("attribute", string(k), content.IsCIdentifier(string(k)))
				if len(k) > resourcev1.DeviceMaxIDLength {
					problems = append(problems, "attribute name too long: "+string(k))
				}
				if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
					problems = append(problems, "attribute value too long: "+*a.StringValue)
				}
			}
			for k := range d.Capacity {
				check("capacity", string(k), content.IsCIdentifier(string(k)))
			}
		}
	}
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
}

func TestPublishIsDeterministic(t *testing.T) {
	gpus := nodeGPUs("h200", 9)
	want := publish(t, gpus, OrderPreferred)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5; i++ {
		shuffled := append([]mig.GPUInfo(nil), gpus...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := publish(t, shuffled, OrderPreferred); !reflect.DeepEqual(got, want) {
			t.Fatal("same GPUs in another order published differently")
		}
	}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		order   Order
		profile string
		want    []string // the devices of profile, in published order
	}{
		// Best fit's own order on an empty GPU: small slices from the
		// top, keeping slots 0-3 whole for a 4g or 3g as long as it can.
		{OrderPreferred, "1g.18gb", []string{"at6", "at4", "at5", "at0", "at1", "at2", "at3"}},
		{OrderPreferred, "1g.35gb", []string{"at6", "at4", "at0", "at2"}},
		{OrderPreferred, "2g.35gb", []string{"at4", "at0", "at2"}},
		{OrderPreferred, "3g.71gb", []string{"at4", "at0"}},
		{OrderPreferred, "1g.18gb+me", []string{"at6", "at0", "at1", "at2", "at3", "at4", "at5"}},
		{OrderAscending, "1g.18gb", []string{"at0", "at1", "at2", "at3", "at4", "at5", "at6"}},
		{OrderAscending, "3g.71gb", []string{"at0", "at4"}},
	}
	for _, tt := range tests {
		t.Run(tt.order.String()+" "+tt.profile, func(t *testing.T) {
			var want []string
			for g := 0; g < 2; g++ { // GPU by GPU
				for _, at := range tt.want {
					want = append(want, fmt.Sprintf("gpu%d-%s-%s", g, label(tt.profile), at))
				}
			}
			var got []string
			for _, d := range devices(publish(t, nodeGPUs("h200", 2), tt.order)) {
				if *d.Attributes[AttrProfile].StringValue == tt.profile {
					got = append(got, d.Name)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("order %v\nwant  %v", got, want)
			}
		})
	}
	// Profiles smallest first: the first device of each profile.
	var first []string
	seen := map[string]bool{}
	for _, d := range devices(publish(t, nodeGPUs("h200", 1), OrderPreferred)) {
		if p := *d.Attributes[AttrProfile].StringValue; !seen[p] {
			seen[p] = true
			first = append(first, p)
		}
	}
	if want := "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb"; strings.Join(first, " ") != want {
		t.Errorf("profile order %v, want %s", first, want)
	}
}

func TestPublishChoosesGPUs(t *testing.T) {
	gpus := nodeGPUs("h200", 4)
	gpus[1].MIGEnabled = false
	gpus[2].MIGPending = true
	var seen []int
	for _, d := range devices(publish(t, gpus, OrderPreferred)) {
		p, _ := PartitionOf(d)
		if len(seen) == 0 || seen[len(seen)-1] != p.GPU {
			seen = append(seen, p.GPU)
		}
	}
	if fmt.Sprint(seen) != "[0 3 0 3 0 3 0 3 0 3 0 3 0 3]" {
		t.Errorf("GPUs published per profile: %v, want 0 and 3 only", seen)
	}
	if s := publish(t, gpus[1:3], OrderPreferred); s != nil {
		t.Errorf("no GPU in MIG mode published %d slices", len(s))
	}
	bad := []struct {
		gpus []mig.GPUInfo
		o    Order
		want string
	}{
		{[]mig.GPUInfo{gpus[0], gpus[0]}, OrderPreferred, "gpu index 0: listed twice"},
		{[]mig.GPUInfo{{Index: 0, Model: "h200", MIGEnabled: true}}, OrderPreferred, "gpu 0: uuid: must not be empty"},
		{[]mig.GPUInfo{{Index: 0, UUID: "GPU-x", Model: "t4", MIGEnabled: true}}, OrderPreferred, `gpu 0: gpu model "t4": unknown`},
		{[]mig.GPUInfo{{Index: -1, UUID: "GPU-x", Model: "h200", MIGEnabled: true}}, OrderPreferred, "gpu index -1"},
		{gpus, Order(7), "order 7"},
	}
	for _, tt := range bad {
		if _, err := Publish(tt.gpus, Options{Order: tt.o}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Publish: %v, want %q", err, tt.want)
		}
	}
}

func TestPartitionOf(t *testing.T) {
	d := devices(publish(t, nodeGPUs("h200", 1), OrderPreferred))[0]
	p, err := PartitionOf(d)
	if err != nil || p != (Partition{GPU: 0, GPUUUID: "GPU-00000000-0000-0000-0000-000000000000", Model: "h200", Profile: "1g.18gb", Start: 6, Size: 1, Compute: 1}) {
		t.Fatalf("%+v, %v", p, err)
	}
	seven := int64(7)
	other := "3g.71gb"
	tests := []struct {
		name string
		edit func(d *resourcev1.Device)
		want string
	}{
		{"no profile", func(d *resourcev1.Device) { delete(d.Attributes, AttrProfile) }, "profile: missing"},
		{"start off the geometry", func(d *resourcev1.Device) { d.Attributes[AttrStart] = resourcev1.DeviceAttribute{IntValue: &seven} }, "1g.18gb at 7 size 1"},
		{"name and attributes disagree", func(d *resourcev1.Device) { d.Name = "gpu0-1g-18gb-at0" }, "attributes name device gpu0-1g-18gb-at6"},
		{"other profile", func(d *resourcev1.Device) {
			d.Attributes[AttrProfile] = resourcev1.DeviceAttribute{StringValue: &other}
		}, "3g.71gb at 6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := devices(publish(t, nodeGPUs("h200", 1), OrderPreferred))[0]
			tt.edit(&c)
			if _, err := PartitionOf(c); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want %q", err, tt.want)
			}
		})
	}
}

func TestDeviceClassAndSelector(t *testing.T) {
	c := DeviceClass()
	if c.Name != DeviceClassName || c.Kind != "DeviceClass" || c.APIVersion != "resource.k8s.io/v1" ||
		len(c.Spec.Selectors) != 1 || c.Spec.Selectors[0].CEL.Expression != `device.driver == "mig.bulkhead.dev"` {
		t.Errorf("%+v", c)
	}
	if got := ProfileSelector("3g.71gb"); got != `device.attributes["mig.bulkhead.dev"].profile == "3g.71gb"` {
		t.Error(got)
	}
}
