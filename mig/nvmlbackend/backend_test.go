package nvmlbackend

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
)

func mockDevice(t *testing.T, node *mocknode.Node, i int) nvml.Device {
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

// The backend creates, lists and destroys instances on the hardware-true
// mock of every model, and refuses what the hardware refuses.
func TestBackendOnMock(t *testing.T) {
	for _, model := range mig.Models() {
		t.Run(model, func(t *testing.T) {
			node, err := mocknode.New(model, 2, mocknode.Options{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(node.Interface(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			m := node.Model()
			gpus, _ := b.GPUs()
			if len(gpus) != 2 || gpus[1].Model != model || !gpus[1].MIGEnabled || gpus[1].Minor != 1 {
				t.Fatalf("gpus %+v", gpus)
			}
			three, four, seven := m.Profiles[4].Name, m.Profiles[5].Name, m.Profiles[6].Name
			a, err := b.Create(1, four, 0)
			if err != nil {
				t.Fatal(err)
			}
			c, err := b.Create(1, three, 4)
			if err != nil {
				t.Fatal(err)
			}
			if a.GI == c.GI || a.UUID == "" || a.UUID == c.UUID || a.ParentMinor != 1 || a.Size != 4 || c.Start != 4 {
				t.Fatalf("instances %+v %+v", a, c)
			}
			_, err = b.Create(1, seven, 0)
			if !errors.Is(err, mig.ErrInsufficientResources) || !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
				t.Fatalf("overlap: %v", err)
			}
			insts, err := b.Instances()
			if err != nil || len(insts) != 2 || insts[0] != a && insts[1] != a {
				t.Fatalf("instances %+v, %v (created %+v %+v)", insts, err, a, c)
			}
			if err := b.Destroy(1, a.GI, a.CI); err != nil {
				t.Fatal(err)
			}
			if err := b.Destroy(1, a.GI, a.CI); err != nil {
				t.Fatalf("second destroy: %v", err)
			}
			if insts, _ := b.Instances(); len(insts) != 1 || insts[0].UUID != c.UUID {
				t.Fatalf("after destroy %+v", insts)
			}
			if _, err := b.Create(0, "9g.1gb", 0); err == nil || !strings.Contains(err.Error(), "not a "+model+" profile") {
				t.Fatalf("bad profile: %v", err)
			}
			if _, err := b.Create(5, four, 0); err == nil || !strings.Contains(err.Error(), "gpu 5: not on this node") {
				t.Fatalf("bad gpu: %v", err)
			}
		})
	}
}

// go-nvml's own mock reports 3g placements of size 3: the backend refuses it
// instead of placing slices the hardware would reject.
func TestBackendRefusesStockMock(t *testing.T) {
	srv := dgxh200.New()
	for _, d := range srv.Devices {
		d.(*server.Device).MigMode = nvml.DEVICE_MIG_ENABLE
	}
	_, err := New(srv, Options{})
	if !errors.Is(err, ErrGeometryMismatch) {
		t.Fatalf("error %v, want ErrGeometryMismatch", err)
	}
}

// MIG mode is read, never toggled unless Options.EnableMIG says so.
func TestBackendMIGModeIsNeverToggledImplicitly(t *testing.T) {
	node, _ := mocknode.New("h100", 1, mocknode.Options{MIGDisabled: true})
	b, err := New(node.Interface(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if gpus, _ := b.GPUs(); gpus[0].MIGEnabled {
		t.Fatal("MIG reported enabled")
	}
	if g := b.AllocatorGPUs(); len(g) != 1 || !g[0].NoMIG {
		t.Fatalf("MIG-disabled GPU offered for slices: %+v", g)
	}
	if _, err := b.Create(0, "1g.10gb", 0); !errors.Is(err, mig.ErrMIGDisabled) {
		t.Fatalf("create: %v", err)
	}
	if mode, _, _ := mockDevice(t, node, 0).GetMigMode(); mode != nvml.DEVICE_MIG_DISABLE {
		t.Fatal("backend toggled MIG mode")
	}
	b, err = New(node.Interface(), Options{EnableMIG: true})
	if err != nil {
		t.Fatal(err)
	}
	if gpus, _ := b.GPUs(); !gpus[0].MIGEnabled {
		t.Fatal("EnableMIG did not enable MIG")
	}
}

// Strict MIG mode: a GPU whose pending MIG mode differs from its current
// one (changed, waiting for a reset) takes no placement, and every refusal
// names the GPU and both modes. The other GPUs are unaffected.
func TestBackendRefusesGPUWithPendingMIGMode(t *testing.T) {
	tests := []struct {
		name            string
		from, to        int
		wantCur, wantTo string
	}{
		{"enabled, pending disabled", nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_DISABLE, "enabled", "disabled"},
		{"disabled, pending enabled", nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE, "disabled", "enabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node, err := mocknode.New("h200", 2, mocknode.Options{ResetRequired: true, MIGDisabled: tt.from == nvml.DEVICE_MIG_DISABLE})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				// GPU 0 is set back to where it was: nothing pending there.
				d := mockDevice(t, node, i)
				if ret, _ := d.SetMigMode(tt.to); ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
				if i == 0 {
					if ret, _ := d.SetMigMode(tt.from); ret != nvml.SUCCESS {
						t.Fatal(ret)
					}
				}
			}
			b, err := New(node.Interface(), Options{})
			if err != nil {
				t.Fatalf("one GPU waiting for a reset must not take the node down: %v", err)
			}
			gpus, _ := b.GPUs()
			if gpus[0].MIGPending || !gpus[1].MIGPending || gpus[1].MIGEnabled != (tt.from == nvml.DEVICE_MIG_ENABLE) {
				t.Fatalf("gpus %+v", gpus)
			}
			want := []string{"gpu 1", "MIG mode is " + tt.wantCur + ", pending " + tt.wantTo, "nvidia-smi -i 1 -r"}
			_, err = b.Create(1, "1g.18gb", 0)
			for _, w := range want {
				if !errors.Is(err, mig.ErrMIGModePending) || !strings.Contains(err.Error(), w) {
					t.Fatalf("create on the pending GPU: %v, want ErrMIGModePending naming %q", err, w)
				}
			}
			ag := b.AllocatorGPUs()
			if ag[0].Unavailable != "" || !strings.Contains(ag[1].Unavailable, want[1]) {
				t.Fatalf("allocator GPUs %+v", ag)
			}
			alloc, err := mig.NewAllocator(ag, nil, mig.WithStrictMIGMode())
			if err != nil {
				t.Fatal(err)
			}
			_, err = alloc.Allocate(mig.Request{Owner: "p", Tenant: "t", WholeGPU: tt.from == nvml.DEVICE_MIG_DISABLE, Profile: map[bool]string{true: "", false: "7g.141gb"}[tt.from == nvml.DEVICE_MIG_DISABLE]})
			if err != nil {
				t.Fatalf("GPU 0 is usable: %v", err)
			}
			_, err = alloc.Allocate(mig.Request{Owner: "q", Tenant: "t", Profile: "1g.18gb"})
			if !errors.Is(err, mig.ErrInsufficientResources) || !strings.Contains(err.Error(), "gpu1: "+mig.ErrMIGModePending.Error()) {
				t.Fatalf("allocation refusal %v, want it to name gpu1's pending mode", err)
			}
			if err := node.Reset(1); err != nil {
				t.Fatal(err)
			}
			if b, err = New(node.Interface(), Options{}); err != nil {
				t.Fatal(err)
			}
			if gpus, _ := b.GPUs(); gpus[1].MIGPending || gpus[1].MIGEnabled != (tt.to == nvml.DEVICE_MIG_ENABLE) {
				t.Fatalf("after the reset: %+v", gpus[1])
			}
		})
	}
}

// EnableMIG on a GPU that cannot reset itself leaves the change pending:
// the GPU is refused until the reset, not used in either mode.
func TestBackendEnableMIGWaitsForReset(t *testing.T) {
	node, _ := mocknode.New("h100", 1, mocknode.Options{MIGDisabled: true, ResetRequired: true})
	b, err := New(node.Interface(), Options{EnableMIG: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(0, "1g.10gb", 0); !errors.Is(err, mig.ErrMIGModePending) || !strings.Contains(err.Error(), "MIG mode is disabled, pending enabled") {
		t.Fatalf("create before the reset: %v", err)
	}
	if err := node.Reset(0); err != nil {
		t.Fatal(err)
	}
	if b, err = New(node.Interface(), Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Create(0, "1g.10gb", 0); err != nil {
		t.Fatalf("create after the reset: %v", err)
	}
}
