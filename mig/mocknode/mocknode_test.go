package mocknode

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

func mockDevice(t *testing.T, node *Node, i int) nvml.Device {
	t.Helper()
	lib := node.Interface()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return d
}

func profileInfo(t *testing.T, d nvml.Device, enum int) nvml.GpuInstanceProfileInfo {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(enum)
	if ret != nvml.SUCCESS {
		t.Fatalf("profile %d: %v", enum, ret)
	}
	return info
}

// The wrapped mock reports hardware profile IDs and placement sizes.
func TestMockReportsHardwareGeometry(t *testing.T) {
	// What real NVML reports, in the order of mig.GPUModel.Profiles (1g,
	// 1g+me, 1g double memory, 2g, 3g, 4g, 7g).
	hardware := []uint32{19, 20, 15, 14, 9, 5, 0}
	for _, model := range mig.Models() {
		node, err := New(model, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		d := mockDevice(t, node, 0)
		m := node.Model()
		for i, p := range m.Profiles {
			info := profileInfo(t, d, p.NVMLProfile)
			if info.Id != hardware[i] {
				t.Errorf("%s %s: id %d, want %d", model, p.Name, info.Id, hardware[i])
			}
			pls, ret := d.GetGpuInstancePossiblePlacements(&info)
			if ret != nvml.SUCCESS || len(pls) != len(p.Starts) {
				t.Fatalf("%s %s: placements %v %v", model, p.Name, pls, ret)
			}
			for j, pl := range pls {
				if int(pl.Start) != p.Starts[j] || int(pl.Size) != p.Slots {
					t.Errorf("%s %s: placement %v, want {%d}:%d", model, p.Name, pl, p.Starts[j], p.Slots)
				}
			}
		}
	}
}

// The wrapped mock refuses what hardware refuses.
func TestMockRefusesLikeHardware(t *testing.T) {
	type create struct {
		enum  int
		start uint32
		size  uint32 // 0: the profile's size
	}
	tests := []struct {
		name    string
		creates []create
		want    nvml.Return // of the last create; earlier ones must succeed
	}{
		{"overlap 3g on 4g", []create{{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, 0}, {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g into a 3g", []create{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 0}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE, 5, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"7g on a used GPU", []create{{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 6, 0}, {nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"second +me", []create{{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 0, 0}, {nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 3, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3g at start 2", []create{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 2, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g at slot 7", []create{{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 7, 0}}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3g with the mock's size 3", []create{{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 0, 3}}, nvml.ERROR_INVALID_ARGUMENT},
		{"7g with the mock's size 7", []create{{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7}}, nvml.ERROR_INVALID_ARGUMENT},
		{"4g+3g fills the GPU", []create{{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0, 0}, {nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4, 0}}, nvml.SUCCESS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, _ := New("h200", 1, Options{})
			d := mockDevice(t, node, 0)
			for i, c := range tt.creates {
				info := profileInfo(t, d, c.enum)
				size := c.size
				if size == 0 {
					pls, _ := d.GetGpuInstancePossiblePlacements(&info)
					size = pls[0].Size
				}
				_, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: c.start, Size: size})
				want := nvml.Return(nvml.SUCCESS)
				if i == len(tt.creates)-1 {
					want = tt.want
				}
				if ret != want {
					t.Fatalf("create %d: %v, want %v", i, ret, want)
				}
			}
		})
	}
}

func TestMockInstanceLifecycleRules(t *testing.T) {
	node, _ := New("a100-40gb", 1, Options{})
	d := mockDevice(t, node, 0)
	info := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	gi, ret := d.CreateGpuInstance(&info) // auto placement: first fit
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	giInfo, _ := gi.GetInfo()
	if giInfo.Placement != (nvml.GpuInstancePlacement{Start: 0, Size: 2}) || giInfo.ProfileId != 14 {
		t.Fatalf("gi info %+v", giInfo)
	}
	ciProfile, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("3-slice CI in a 2g: %v", ret)
	}
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciProfile); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("second full CI: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("destroy GI with CI: %v", ret)
	}
	if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Fatalf("disable MIG with instances: %v", ret)
	}
	mdev, ret := d.GetMigDeviceHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	uuid, _ := mdev.GetUUID()
	isMig, _ := mdev.IsMigDeviceHandle()
	parent, _ := mdev.GetDeviceHandleFromMigDeviceHandle()
	if !strings.HasPrefix(uuid, "MIG-") || !isMig || parent != d {
		t.Fatalf("mig device %q %v %v", uuid, isMig, parent)
	}
	if byUUID, ret := node.Interface().DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS {
		t.Fatalf("by uuid: %v", ret)
	} else if id, _ := byUUID.GetUUID(); id != uuid {
		t.Fatalf("by uuid got %s", id)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := d.GetGpuInstanceById(int(giInfo.Id)); ret != nvml.ERROR_NOT_FOUND {
		t.Fatalf("destroyed GI still found: %v", ret)
	}
}

// Two handles on one state file (as two shim processes would hold) see each
// other's instances, and concurrent creations never overlap.
func TestMockNodeSharedState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	var wg sync.WaitGroup
	results := make(chan error, 16)
	for w := 0; w < 2; w++ {
		node, err := Open(path, "h200", 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := nvmlbackend.New(node.Interface(), nvmlbackend.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for s := 0; s < 4; s++ {
			wg.Add(1)
			go func(start int) {
				defer wg.Done()
				_, err := b.Create(0, "1g.18gb", start)
				results <- err
			}(s)
		}
	}
	wg.Wait()
	close(results)
	ok, refused := 0, 0
	for err := range results {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, mig.ErrInsufficientResources):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if ok != 4 || refused != 4 {
		t.Fatalf("%d created, %d refused; want 4 and 4", ok, refused)
	}
	if _, err := Open(path, "h100", 1, Options{}); err == nil || !strings.Contains(err.Error(), "holds 1 x h200") {
		t.Fatalf("reopen as another model: %v", err)
	}
}

// A second process creates an instance; this one sees it and is refused
// an overlapping placement, as on a real node.
func TestMockNodeAcrossProcesses(t *testing.T) {
	if path := os.Getenv("BULKHEAD_MIG_HELPER_NODE"); path != "" {
		node, err := Open(path, "b200", 2, Options{})
		if err == nil {
			var b *nvmlbackend.Backend
			if b, err = nvmlbackend.New(node.Interface(), nvmlbackend.Options{}); err == nil {
				var inst mig.Instance
				if inst, err = b.Create(1, "3g.90gb", 4); err == nil {
					json.NewEncoder(os.Stdout).Encode(inst)
					return
				}
			}
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	path := filepath.Join(t.TempDir(), "node.json")
	node, err := Open(path, "b200", 2, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMockNodeAcrossProcesses$")
	cmd.Env = append(os.Environ(), "BULKHEAD_MIG_HELPER_NODE="+path)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	var child mig.Instance
	if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &child); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	b, err := nvmlbackend.New(node.Interface(), nvmlbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	insts, err := b.Instances()
	if err != nil || len(insts) != 1 || insts[0] != child {
		t.Fatalf("instances %+v %v, child made %+v", insts, err, child)
	}
	if _, err := b.Create(1, "1g.45gb", 6); !errors.Is(err, mig.ErrInsufficientResources) {
		t.Fatalf("overlapping create: %v", err)
	}
}

// Like hardware that cannot reset the GPU itself, a ResetRequired node
// reports a changed MIG mode as pending until Reset; otherwise the change
// applies at once. Neither happens while instances exist.
func TestMockMIGModeChangeWaitsForReset(t *testing.T) {
	tests := []struct {
		name           string
		resetRequired  bool
		wantActivation nvml.Return
		wantBefore     [2]int // current, pending before the reset
	}{
		{"idle bare metal", false, nvml.SUCCESS, [2]int{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE}},
		{"reset required", true, nvml.ERROR_RESET_REQUIRED, [2]int{nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_DISABLE}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, err := Open(filepath.Join(t.TempDir(), "node.json"), "h100", 1, Options{ResetRequired: tt.resetRequired})
			if err != nil {
				t.Fatal(err)
			}
			d := mockDevice(t, node, 0)
			info := profileInfo(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
			gi, ret := d.CreateGpuInstance(&info)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			if ret, _ := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
				t.Fatalf("mode change with an instance: %v, want ERROR_IN_USE", ret)
			}
			if err := node.Reset(0); err == nil {
				t.Fatal("reset with an instance succeeded")
			}
			if ret := gi.Destroy(); ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			ret, activation := d.SetMigMode(nvml.DEVICE_MIG_DISABLE)
			if ret != nvml.SUCCESS || activation != tt.wantActivation {
				t.Fatalf("SetMigMode: %v, activation %v; want SUCCESS, %v", ret, activation, tt.wantActivation)
			}
			if cur, pend, _ := d.GetMigMode(); [2]int{cur, pend} != tt.wantBefore {
				t.Fatalf("modes (current, pending) %d %d, want %v", cur, pend, tt.wantBefore)
			}
			// Another process sees the same modes through the state file.
			other, err := Open(node.path, "h100", 1, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if cur, pend, _ := mockDevice(t, other, 0).GetMigMode(); [2]int{cur, pend} != tt.wantBefore {
				t.Fatalf("other process reads %d %d, want %v", cur, pend, tt.wantBefore)
			}
			if err := node.Reset(0); err != nil {
				t.Fatal(err)
			}
			if cur, pend, _ := d.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_DISABLE {
				t.Fatalf("after reset: %d %d, want MIG disabled", cur, pend)
			}
		})
	}
}
