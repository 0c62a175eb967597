package netpol

import (
	"strings"
	"testing"
)

func TestHostVeth(t *testing.T) {
	n := newTestNet(t)
	p := n.addPod("v1", 1)
	for _, tc := range []struct {
		name, path, podIf string
		want              string // error substring; "" = success
	}{
		{"pod eth0", p.nsPath, "", ""},
		{"explicit eth0", p.nsPath, "eth0", ""},
		{"empty path", "", "", "netns path is empty"},
		{"missing netns", "/nonexistent/netns", "", "open netns /nonexistent/netns"},
		{"missing interface", p.nsPath, "eth9", "eth9 in"},
		{"not a veth", p.nsPath, "lo", "not a veth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.enter()
			idx, name, err := HostVeth(tc.path, tc.podIf)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("HostVeth: %v, want an error containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if name != p.hostIf || idx != mustLink(t, p.hostIf).Attrs().Index {
				t.Fatalf("HostVeth = %d %s, want %s", idx, name, p.hostIf)
			}
		})
	}
}
