package mig_test

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

// The shim's path for one pod: rebuild the allocator from the ledger, place
// the slice, create it through the backend, inject it into the OCI spec.
func Example() {
	// A simulated 2 x H200 node; on a GPU node this is nvml.New().
	node, _ := mocknode.New("h200", 2, mocknode.Options{})
	backend, _ := nvmlbackend.New(node.Interface(), nvmlbackend.Options{})
	defer backend.Close()

	// The ledger already holds one slice of another tenant.
	ledger := []mig.Placement{{GPU: 0, Profile: "4g.71gb", Start: 0, Tenant: "acme", Owner: "pod-a"}}
	alloc, _ := mig.NewAllocator(backend.AllocatorGPUs(), ledger)

	p, err := alloc.Allocate(mig.Request{Owner: "pod-b", Tenant: "globex", MinMemoryGB: 60})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("placed:", p)

	inst, _ := backend.Create(p.GPU, p.Profile, p.Start)
	minors := inject.MIGMinors{
		fmt.Sprintf("gpu%d/gi%d/access", inst.ParentMinor, inst.GI):               21,
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", inst.ParentMinor, inst.GI, inst.CI): 22,
	}
	spec := &specs.Spec{}
	majors := inject.Majors{Nvidia: 195, UVM: 234, Caps: 235}
	if err := inject.ApplySpecOpts(spec, inject.WithMIGDevice(majors, minors, inst)); err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range spec.Linux.Devices {
		fmt.Println(d.Path)
	}
	// Output:
	// placed: gpu0 3g.71gb start 4 size 4 (tenant globex, owner pod-b)
	// /dev/nvidiactl
	// /dev/nvidia-uvm
	// /dev/nvidia-uvm-tools
	// /dev/nvidia0
	// /dev/nvidia-caps/nvidia-cap21
	// /dev/nvidia-caps/nvidia-cap22
}

// A sandbox that cannot use a MIG slice gets the policy's fallback.
func ExampleSandboxGPUMode() {
	mode, err := mig.SandboxGPUMode("io.containerd.runsc.v1", mig.FallbackRefuse)
	fmt.Println(mode, err)
	mode, err = mig.SandboxGPUMode("io.containerd.runsc.v1", mig.FallbackWholeGPU)
	fmt.Println(mode, err)
	// Output:
	//  runtime "io.containerd.runsc.v1": MIG slices are not supported in this sandbox (it does not expose /dev/nvidia-caps/*); policy decision.gpu.mig_in_sandbox is "refuse"
	// whole-gpu <nil>
}
