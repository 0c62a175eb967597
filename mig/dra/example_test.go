package dra_test

import (
	"fmt"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// A node with two H200s in MIG mode publishes one counter slice and its
// devices; a claim for a 3g.71gb selects on the profile attribute and the
// scheduler takes the first free device of that profile.
func ExamplePublish() {
	gpus := []mig.GPUInfo{
		{Index: 0, UUID: "GPU-0", Model: "h200", MIGEnabled: true},
		{Index: 1, UUID: "GPU-1", Model: "h200", MIGEnabled: true},
	}
	slices, err := dra.Publish(gpus, dra.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, spec := range dra.Specs("node-a", slices) {
		fmt.Printf("slice %d of pool %s: %d counter sets, %d devices\n", i, spec.Pool.Name, len(spec.SharedCounters), len(spec.Devices))
	}
	for _, d := range slices[1].Devices {
		if p, _ := dra.PartitionOf(d); p.Profile == "3g.71gb" {
			fmt.Println(d.Name, "consumes", len(d.ConsumesCounters[0].Counters), "counters of", d.ConsumesCounters[0].CounterSet)
		}
	}
	fmt.Println(dra.ProfileSelector("3g.71gb"))
	// Output:
	// slice 0 of pool node-a: 2 counter sets, 0 devices
	// slice 1 of pool node-a: 0 counter sets, 50 devices
	// gpu0-3g-71gb-at4 consumes 5 counters of gpu0
	// gpu0-3g-71gb-at0 consumes 5 counters of gpu0
	// gpu1-3g-71gb-at4 consumes 5 counters of gpu1
	// gpu1-3g-71gb-at0 consumes 5 counters of gpu1
	// device.attributes["mig.bulkhead.dev"].profile == "3g.71gb"
}
