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
