package mig_test

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

// Reconcile tells GC which instances no placement holds (destroy them) and
// which placements have no complete instance.
func TestReconcile(t *testing.T) {
	node, _ := mocknode.New("h100", 2, mocknode.Options{})
	b, err := nvmlbackend.New(node.Interface(), nvmlbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := b.Create(0, "3g.40gb", 4)
	orphan, _ := b.Create(1, "1g.10gb", 6)
	// A GPU instance whose compute instance was never made (crash between).
	lib := node.Interface()
	d, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	info, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 2}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ledger := []mig.Placement{
		{GPU: 0, Profile: "3g.40gb", Start: 4, Tenant: "t", Owner: "a"},
		{GPU: 0, Profile: "2g.20gb", Start: 0, Tenant: "t", Owner: "b"},
		{GPU: 1, Profile: "1g.10gb", Start: 0, Tenant: "t", Owner: "c"},
	}
	insts, _ := b.Instances()
	orphans, missing := mig.Reconcile(insts, ledger)
	if len(orphans) != 2 || len(missing) != 2 {
		t.Fatalf("orphans %+v\nmissing %+v", orphans, missing)
	}
	for _, o := range orphans {
		if o == kept {
			t.Fatal("a held instance was reported orphaned")
		}
		if err := b.Destroy(o.GPU, o.GI, o.CI); err != nil {
			t.Fatalf("destroy %+v: %v", o, err)
		}
	}
	if missing[0].Owner != "b" || missing[1].Owner != "c" {
		t.Fatalf("missing %+v", missing)
	}
	if insts, _ := b.Instances(); len(insts) != 1 || insts[0] != kept {
		t.Fatalf("after GC %+v (orphan was %+v)", insts, orphan)
	}
}
