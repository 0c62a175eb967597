package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

// The report names every profile with the driver's placements beside the
// published ones, and says plainly when they differ.
func TestPrintDiscovery(t *testing.T) {
	node, err := mocknode.New("h200", 1, mocknode.Options{MIGDisabled: true})
	if err != nil {
		t.Fatal(err)
	}
	found, err := nvmlbackend.Discover(node.Interface(), nvmlbackend.DiscoverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		breaks bool
		want   []string
	}{
		{"match", false, []string{"MIG mode disabled", "25 devices published once MIG mode is on", "3g.71gb", "{0,4}:4", "{0,2,4,6}:2", "published devices match"}},
		{"differs", true, []string{"DIFFERS: placements: driver {0}:4, published devices {0,4}:4", "published devices DIFFER"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := found[0]
			if tc.breaks {
				d.Profiles = append([]nvmlbackend.DiscoveredProfile(nil), d.Profiles...)
				for i := range d.Profiles {
					if d.Profiles[i].Slices == 3 {
						d.Profiles[i].Placements = d.Profiles[i].Placements[:1]
					}
				}
			}
			c, err := nvmlbackend.Compare(d)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			printDiscovery(&out, discoverReport{GPUs: []nvmlbackend.Discovery{d}, Comparisons: []nvmlbackend.Comparison{c}, Match: c.OK()})
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
