package runtime

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// podNetNS makes a network namespace for one test case, with build run on a
// netlink handle inside it, and returns its path. It needs root.
func podNetNS(t testing.TB, build func(h *netlink.Handle) error) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into it
	if err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := build(h); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns))
}

// addLink adds l in h's namespace, with addr (CIDR, optional), up when up.
func addLink(h *netlink.Handle, l netlink.Link, addr string, up bool) error {
	if err := h.LinkAdd(l); err != nil {
		return fmt.Errorf("add %s: %w", l.Attrs().Name, err)
	}
	link, err := h.LinkByName(l.Attrs().Name)
	if err != nil {
		return err
	}
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			return err
		}
		a.Flags = unix.IFA_F_NODAD
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, l.Attrs().Name, err)
		}
	}
	if up {
		return h.LinkSetUp(link)
	}
	return nil
}

// TestUnfencedInterfaces: every interface of a pod's namespace that could
// carry traffic, besides the loopback and eth0, is named with its type:
// a Multus-style macvlan or ipvlan, a second veth. Down interfaces without
// an address (the kernel's fallback tunnels) are not.
func TestUnfencedInterfaces(t *testing.T) {
	// veth and macvlan are the types this kernel has (no dummy, no ipvlan):
	// a veth whose peer stays down stands for any other interface.
	veth := func(name string) netlink.Link {
		return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-p"}
	}
	eth0 := func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		return addLink(h, veth("eth0"), "10.9.0.2/24", true)
	}
	with := func(l func(h *netlink.Handle) (netlink.Link, error), addr string, up bool) func(h *netlink.Handle) error {
		return func(h *netlink.Handle) error {
			if err := eth0(h); err != nil {
				return err
			}
			link, err := l(h)
			if err != nil {
				return err
			}
			return addLink(h, link, addr, up)
		}
	}
	plain := func(name string) func(h *netlink.Handle) (netlink.Link, error) {
		return func(*netlink.Handle) (netlink.Link, error) { return veth(name), nil }
	}
	macvlan := func(h *netlink.Handle) (netlink.Link, error) {
		parent, err := h.LinkByName("eth0")
		if err != nil {
			return nil, err
		}
		return &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "net1", ParentIndex: parent.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE}, nil
	}
	tests := []struct {
		name  string
		build func(h *netlink.Handle) error
		want  []string
	}{
		{name: "eth0 alone (its peer down)", build: eth0},
		{name: "macvlan (Multus)", build: with(macvlan, "192.168.50.2/24", true), want: []string{"net1 (macvlan)"}},
		{name: "second veth", build: with(plain("eth1"), "192.168.51.2/24", true), want: []string{"eth1 (veth)"}},
		{name: "up without an address", build: with(plain("net2"), "", true), want: []string{"net2 (veth)"}},
		{name: "down with an address", build: with(plain("net3"), "192.168.52.2/24", false), want: []string{"net3 (veth)"}},
		{name: "down, no address (like the kernel's fallback tunnels)", build: with(plain("tunl0"), "", false)},
		{name: "down, link-local only", build: with(plain("ll0"), "fe80::1/64", false)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := podNetNS(t, tt.build)
			got, err := unfencedInterfaces(path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("unfencedInterfaces = %q, want %q", got, tt.want)
			}
			// The refusal names each interface and the rule.
			err = checkInterfaces(&node.Sandbox{ID: "sb", Namespace: "agents", Name: "p", NetNS: path}, &node.Reservation{Tenant: "agents", Tier: "untrusted"})
			var refused *RefusedError
			switch {
			case tt.want == nil && err != nil:
				t.Errorf("checkInterfaces = %v, want nil", err)
			case tt.want != nil && !errors.As(err, &refused):
				t.Errorf("checkInterfaces = %v, want a refusal", err)
			case tt.want != nil && (!strings.Contains(err.Error(), "["+RuleUnfencedInterface+"] ") || !strings.Contains(err.Error(), tt.want[0])):
				t.Errorf("refusal %q lacks the rule or %q", err, tt.want[0])
			}
		})
	}
	if _, err := unfencedInterfaces("/nonexistent/netns"); err == nil || !strings.Contains(err.Error(), "/nonexistent/netns") {
		t.Errorf("missing netns: %v, want an error naming it", err)
	}
}

// BenchmarkUnfencedInterfaces is what the check adds to a fenced pod's
// start: one netlink dump of the pod's namespace (make bench-start shows it
// inside fence.netns).
func BenchmarkUnfencedInterfaces(b *testing.B) {
	path := podNetNS(b, func(h *netlink.Handle) error {
		return addLink(h, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "host0"}, "10.9.0.2/24", true)
	})
	for b.Loop() {
		if _, err := unfencedInterfaces(path); err != nil {
			b.Fatal(err)
		}
	}
}
