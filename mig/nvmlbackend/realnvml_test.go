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

// On a GPU node, what the DRA driver would publish for each real GPU matches
// the driver's own profiles and possible placements, device by device. NVML
// reports placements with MIG mode on or off, so this reads only: no mode
// change, no instance.
func TestRealNVMLPublicationMatches(t *testing.T) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Skipf("real NVML unavailable (%v): needs an NVIDIA driver and GPU", ret)
	}
	lib.Shutdown()
	found, err := Discover(lib, DiscoverOptions{ProfileNames: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Skip("no NVIDIA GPU")
	}
	for _, d := range found {
		t.Logf("gpu %d %s %s, %d MiB, MIG %s", d.Index, d.Name, d.UUID, d.MemoryMiB, d.MIGMode)
		for _, p := range d.Profiles {
			t.Logf("  driver profile enum %d id %d %q%s: %d slices x %d, %d MiB, media %v, placements %s %s",
				p.Enum, p.ID, p.Name, p.NameError, p.Slices, p.Instances, p.MemoryMiB, p.Media, FormatSpans(p.Placements), p.PlacementError)
		}
		if d.Model == "" {
			t.Logf("gpu %d: %s", d.Index, d.ModelError)
			continue
		}
		c, err := Compare(d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("gpu %d: %d published devices", d.Index, c.Devices)
		for _, pc := range c.Profiles {
			t.Logf("  %s: published %s, %d together, problems %q", pc.Profile, FormatSpans(pc.Published), pc.Together, pc.Problems)
		}
		for _, u := range c.Unpublished {
			t.Logf("  not published (not in Bulkhead's geometry): enum %d id %d %q", u.Enum, u.ID, u.Name)
		}
		if !c.OK() {
			t.Errorf("gpu %d (%s): the published devices differ from the driver's", d.Index, d.Name)
		}
	}
}
