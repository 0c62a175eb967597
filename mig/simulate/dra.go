package simulate

import (
	"errors"
	"fmt"
	"math"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// Names of the scheduler's first fit over the devices Bulkhead publishes.
const (
	// DRAFirstFit is first fit over the devices in Bulkhead's published
	// order (dra.OrderPreferred).
	DRAFirstFit = "dra-first-fit"
	// DRAFirstFitAscending is first fit over the naive order
	// (dra.OrderAscending): profiles, GPUs and starts ascending.
	DRAFirstFitAscending = "dra-first-fit-ascending"
)

// ErrIsolationUnsupported means a trace holds tenant-isolated or exclusive
// requests, which published devices cannot express: the scheduler does not
// see who holds a slice.
var ErrIsolationUnsupported = errors.New("isolation is not expressible in published devices")

// draDevice is one published device as the scheduler's allocator uses it.
type draDevice struct {
	name    string
	part    dra.Partition
	consume []draUse
}

type draUse struct {
	set, counter string
	n            int64
}

// draNode is a node's published devices and what the scheduler has
// allocated from them: the counters the scheduler tracks, nothing else.
type draNode struct {
	devices   []draDevice
	byProfile map[string][]int            // device indices in published order
	avail     map[string]map[string]int64 // counter set -> counter -> available
	inUse     []bool
}

func newDRANode(model string, gpus int, o dra.Order) (*draNode, error) {
	infos := make([]mig.GPUInfo, gpus)
	for i := range infos {
		infos[i] = mig.GPUInfo{Index: i, UUID: fmt.Sprintf("GPU-sim-%d", i), Model: model, MIGEnabled: true}
	}
	slices, err := dra.Publish(infos, dra.Options{Order: o})
	if err != nil {
		return nil, err
	}
	n := &draNode{byProfile: map[string][]int{}, avail: map[string]map[string]int64{}}
	for _, s := range slices {
		for _, cs := range s.SharedCounters {
			n.avail[cs.Name] = map[string]int64{}
			for name, c := range cs.Counters {
				n.avail[cs.Name][name] = c.Value.Value()
			}
		}
		for _, d := range s.Devices {
			part, err := dra.PartitionOf(d)
			if err != nil {
				return nil, err
			}
			dev := draDevice{name: d.Name, part: part}
			for _, cc := range d.ConsumesCounters {
				for name, c := range cc.Counters {
					dev.consume = append(dev.consume, draUse{cc.CounterSet, name, c.Value.Value()})
				}
			}
			n.byProfile[part.Profile] = append(n.byProfile[part.Profile], len(n.devices))
			n.devices = append(n.devices, dev)
		}
	}
	n.inUse = make([]bool, len(n.devices))
	return n, nil
}

// allocate takes the first device for profile, in published order, that
// is not in use and whose counters are all available, as the scheduler's
// allocator does for a claim that selects one profile; -1 if none.
func (n *draNode) allocate(profile string) int {
	for _, i := range n.byProfile[profile] {
		if n.inUse[i] || !n.fits(i) {
			continue
		}
		n.inUse[i] = true
		for _, u := range n.devices[i].consume {
			n.avail[u.set][u.counter] -= u.n
		}
		return i
	}
	return -1
}

func (n *draNode) fits(i int) bool {
	for _, u := range n.devices[i].consume {
		left, ok := n.avail[u.set][u.counter]
		if !ok || left < u.n {
			return false
		}
	}
	return true
}

func (n *draNode) release(i int) {
	n.inUse[i] = false
	for _, u := range n.devices[i].consume {
		n.avail[u.set][u.counter] += u.n
	}
}

// RunDRA replays events as the Kubernetes scheduler allocates claims over
// the devices dra.Publish lists for the node in order o: each arrival is a
// claim for its profile and gets the first free device in published order.
// Every allocation is checked against the hardware's rules (mig.Occupancy):
// a device the counters allow and the hardware refuses is an error, never a
// figure. Traces with isolated requests fail with ErrIsolationUnsupported.
func RunDRA(events []Event, model string, gpus int, o dra.Order) (Result, error) {
	m, err := mig.Model(model)
	if err != nil {
		return Result{}, err
	}
	node, err := newDRANode(model, gpus, o)
	if err != nil {
		return Result{}, err
	}
	r := Result{Strategy: DRAFirstFit}
	if o == dra.OrderAscending {
		r.Strategy = DRAFirstFitAscending
	}
	occ := make([]mig.Occupancy, gpus)
	accepted := map[string]int{}
	used, fragSum, fragN := 0, 0.0, 0
	var integral, last float64
	for i, e := range events {
		integral += float64(used) * (e.Time - last)
		last = e.Time
		if e.Kind == Depart {
			if d, ok := accepted[e.ID]; ok {
				dev := &node.devices[d]
				prof, _ := m.Profile(dev.part.Profile)
				occ[dev.part.GPU].Remove(prof, dev.part.Start)
				node.release(d)
				used -= prof.Compute
				delete(accepted, e.ID)
			}
			continue
		}
		if e.Isolation != mig.IsolationShared {
			return Result{}, fmt.Errorf("event %d (%s): %w", i+1, e.ID, ErrIsolationUnsupported)
		}
		prof, err := m.Profile(e.Profile)
		if err != nil {
			return Result{}, fmt.Errorf("event %d (%s): %w", i+1, e.ID, err)
		}
		r.Arrivals++
		r.arrive(e.Profile)
		r.requested += prof.Compute
		f, k := occupancyFragmentation(m, occ)
		fragSum += f
		fragN += k
		d := node.allocate(prof.Name)
		if d < 0 {
			continue
		}
		dev := &node.devices[d]
		if !occ[dev.part.GPU].Fits(prof, dev.part.Start) {
			return Result{}, fmt.Errorf("event %d (%s): counters allowed device %s, the hardware would refuse it", i+1, e.ID, dev.name)
		}
		occ[dev.part.GPU].Add(prof, dev.part.Start)
		r.Accepted++
		r.accept(e.Profile)
		r.served += prof.Compute
		accepted[e.ID] = d
		used += prof.Compute
	}
	r.finish(integral, last, gpus)
	r.Fragmentation = math.NaN()
	if fragN > 0 {
		r.Fragmentation = fragSum / float64(fragN)
	}
	return r, nil
}

// occupancyFragmentation is fragmentation (see Result) over occupancies.
func occupancyFragmentation(m *mig.GPUModel, occ []mig.Occupancy) (float64, int) {
	sum, n := 0.0, 0
	for _, o := range occ {
		free := mig.ComputeSlices - o.Compute()
		if free <= 0 {
			continue
		}
		largest := 0
		for i := range m.Profiles {
			if p := &m.Profiles[i]; p.Compute > largest && o.Room(p) > 0 {
				largest = p.Compute
			}
		}
		sum += 1 - float64(largest)/float64(free)
		n++
	}
	return sum, n
}

// DRAOrders are the published orders Compare replays the scheduler's first
// fit over, Bulkhead's first.
var DRAOrders = []dra.Order{dra.OrderPreferred, dra.OrderAscending}

func hasIsolation(events []Event) bool {
	for _, e := range events {
		if e.Kind == Arrive && e.Isolation != mig.IsolationShared {
			return true
		}
	}
	return false
}
