package nvmlbackend

import (
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
)

// What the DRA driver publishes matches, device by device, what the
// hardware-true mock of every model reports, with MIG mode on or off.
func TestDiscoverMatchesPublication(t *testing.T) {
	for _, model := range mig.Models() {
		for _, off := range []bool{false, true} {
			name := model
			if off {
				name += "/mig-off"
			}
			t.Run(name, func(t *testing.T) {
				node, err := mocknode.New(model, 2, mocknode.Options{MIGDisabled: off})
				if err != nil {
					t.Fatal(err)
				}
				found, err := Discover(node.Interface(), DiscoverOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if len(found) != 2 || found[1].Model != model {
					t.Fatalf("discovered %+v", found)
				}
				wantMode := "enabled"
				if off {
					wantMode = "disabled"
				}
				if found[0].MIGMode != wantMode {
					t.Fatalf("MIG mode %q, want %q", found[0].MIGMode, wantMode)
				}
				for _, d := range found {
					c, err := Compare(d)
					if err != nil {
						t.Fatal(err)
					}
					if !c.OK() || len(c.Unpublished) > 0 {
						t.Fatalf("gpu %d: %+v", d.Index, c)
					}
					// 7 + 7 + 4 + 3 + 2 + 1 + 1 placements.
					if c.Devices != 25 || len(c.Profiles) != len(node.Model().Profiles) {
						t.Fatalf("gpu %d: %d devices, %d profiles", d.Index, c.Devices, len(c.Profiles))
					}
				}
			})
		}
	}
}

// A driver that disagrees in any way the scheduler would act on is caught,
// naming the profile and what differs.
func TestCompareFindsDifferences(t *testing.T) {
	node, err := mocknode.New("h200", 1, mocknode.Options{})
	if err != nil {
		t.Fatal(err)
	}
	found, err := Discover(node.Interface(), DiscoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := found[0]
	profile := func(d *Discovery, name string) *DiscoveredProfile {
		m, _ := mig.Model(d.Model)
		p, err := m.Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		for i := range d.Profiles {
			if d.Profiles[i].Enum == p.NVMLProfile {
				return &d.Profiles[i]
			}
		}
		t.Fatalf("no driver profile %s", name)
		return nil
	}
	for _, tc := range []struct {
		name        string
		change      func(d *Discovery)
		profile     string
		want        string
		unpublished int
	}{
		{"a placement the driver does not have", func(d *Discovery) {
			p := profile(d, "3g.71gb")
			p.Placements = p.Placements[:1]
		}, "3g.71gb", "placements: driver {0}:4, published devices {0,4}:4", 0},
		{"a placement of another size", func(d *Discovery) {
			p := profile(d, "2g.35gb")
			p.Placements[2].Size = 4
		}, "2g.35gb", "placements: driver {0:2,2:2,4:4}", 0},
		{"fewer instances", func(d *Discovery) { profile(d, "1g.18gb").Instances = 6 }, "1g.18gb",
			"allocatable together on an empty GPU: driver 6, published counters 7", 0},
		{"media engines", func(d *Discovery) { profile(d, "1g.18gb+me").Media = false }, "1g.18gb+me", "media engines (JPEG and OFA): driver false, geometry true", 0},
		// A real H200 (driver 580.159.04) reports JPEG and OFA for 7g.
		{"whole-GPU media engines", func(d *Discovery) { profile(d, "7g.141gb").Media = false }, "7g.141gb", "media engines (JPEG and OFA): driver false, geometry true", 0},
		{"compute slices", func(d *Discovery) { profile(d, "4g.71gb").Slices = 3 }, "4g.71gb", "compute slices: driver 3, published 4", 0},
		{"the driver's name", func(d *Discovery) { profile(d, "3g.71gb").Name = "MIG 3g.70gb" }, "3g.71gb", `name: driver "MIG 3g.70gb", published "3g.71gb"`, 0},
		{"placements refused", func(d *Discovery) { profile(d, "7g.141gb").PlacementError = "placements: nvml: ERROR_NO_PERMISSION" }, "7g.141gb", "ERROR_NO_PERMISSION", 0},
		{"a profile the driver lacks", func(d *Discovery) {
			p := profile(d, "1g.35gb")
			*p = d.Profiles[len(d.Profiles)-1]
			d.Profiles = d.Profiles[:len(d.Profiles)-1]
		}, "1g.35gb", "the driver does not offer this profile", 0},
		{"a profile Bulkhead lacks", func(d *Discovery) {
			d.Profiles = append(d.Profiles, DiscoveredProfile{Enum: 99, ID: 32, Name: "MIG 1g.18gb+gfx", Slices: 1, Instances: 7})
		}, "", "", 1},
		{"the driver's own names agree", func(d *Discovery) { profile(d, "3g.71gb").Name = "MIG 3g.71gb" }, "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := base
			d.Profiles = make([]DiscoveredProfile, len(base.Profiles))
			for i, p := range base.Profiles {
				p.Placements = append([]Span(nil), p.Placements...)
				d.Profiles[i] = p
			}
			tc.change(&d)
			c, err := Compare(d)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Unpublished) != tc.unpublished {
				t.Fatalf("unpublished %+v, want %d", c.Unpublished, tc.unpublished)
			}
			var got []string
			for _, pc := range c.Profiles {
				for _, p := range pc.Problems {
					got = append(got, pc.Profile+": "+p)
				}
			}
			if tc.want == "" {
				if !c.OK() {
					t.Fatalf("problems %q, want none", got)
				}
				return
			}
			for _, g := range got {
				if strings.HasPrefix(g, tc.profile+": ") && strings.Contains(g, tc.want) {
					return
				}
			}
			t.Fatalf("problems %q, want one for %s containing %q", got, tc.profile, tc.want)
		})
	}
}

// A GPU without a MIG geometry is refused with its name, not compared.
func TestCompareUnknownModel(t *testing.T) {
	_, err := Compare(Discovery{Index: 0, Name: "NVIDIA L4", ModelError: `gpu "NVIDIA L4": no MIG geometry for this model`})
	if err == nil || !strings.Contains(err.Error(), "NVIDIA L4") {
		t.Fatalf("err %v", err)
	}
}
