package nvmlbackend

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// On a GPU node the backend opens real NVML, checks the driver's MIG
// geometry against ours and lists instances. It creates nothing.
func TestRealNVMLReadOnly(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Skipf("real NVML unavailable (%v): needs an NVIDIA driver and GPU", ret)
	}
	n, ret := lib.DeviceGetCount()
	lib.Shutdown()
	if ret != nvml.SUCCESS || n == 0 {
		t.Skipf("no NVIDIA GPU (%d devices, %v)", n, ret)
	}
	b, err := New(lib, Options{})
	switch {
	case errors.Is(err, ErrGeometryMismatch):
		t.Fatalf("the driver disagrees with the hardware geometry: %v", err)
	case err != nil && strings.Contains(err.Error(), "no MIG geometry for this model"):
		t.Skipf("GPU without MIG: %v", err)
	case err != nil:
		t.Fatal(err)
	}
	defer b.Close()
	gpus, _ := b.GPUs()
	for _, g := range gpus {
		t.Logf("gpu %d %s (%s) minor %d MIG %v", g.Index, g.Name, g.Model, g.Minor, g.MIGEnabled)
	}
	insts, err := b.Instances()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range insts {
		t.Logf("instance %+v", i)
	}
}
