package netpol

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// Link-layer addresses of the endpoint under test and its neighbours.
const (
	podLL    = "fe80::1"  // the pod's own link-local address
	sameLL   = "fe80::2"  // tenant A's other pod
	otherLL  = "fe80::5"  // tenant B's pod
	routerLL = "fe80::ff" // the node's bridge
	nodeV6   = "fd00::fe" // the node's address on the bridge: no tenant's
)

// fixtureL2 gives the endpoint under test its MAC, link-local and router
// addresses.
func fixtureL2(e *Endpoint) {
	e.MAC = HardwareAddr(podMAC)
	e.LinkLocal = netip.MustParseAddr(podLL)
	e.RouterLinkLocal = netip.MustParseAddr(routerLL)
}

// Register reads the pod's MAC and link-local address from the pod's end of
// the veth (through the host's netnsid for the pod's namespace) and the
// router's link-local address from the bridge, and records them.
func TestRegisterReadsLinkAddrs(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	p := n.addPod("l1", 1)
	m := n.open(ctx, nil)
	defer m.Close()
	wantLL := podLinkLocal(t, p)
	if err := m.Register(ctx, n.endpoint(p, "tenant-a", nil)); err != nil {
		t.Fatal(err)
	}
	eps, err := m.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 {
		t.Fatalf("%d endpoints, want 1", len(eps))
	}
	e := eps[0]
	if !bytes.Equal(e.MAC, p.mac) {
		t.Errorf("MAC %s, want the pod's %s", e.MAC, p.mac)
	}
	if e.LinkLocal != wantLL {
		t.Errorf("LinkLocal %s, want the pod's %s", e.LinkLocal, wantLL)
	}
	if want := bridgeLinkLocal(t, n); e.RouterLinkLocal != want {
		t.Errorf("RouterLinkLocal %s, want the bridge's %s", e.RouterLinkLocal, want)
	}
	if o, ok, err := m.dp.ownerOf(netip.PrefixFrom(wantLL, 128)); err != nil || !ok || o.Ifindex != uint32(e.Ifindex) {
		t.Errorf("link-local %s not owned by the endpoint: %+v %v %v", wantLL, o, ok, err)
	}
	if err := m.Unregister(ctx, e.SandboxID); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, m, n.pinDir)
}

func TestEUI64LinkLocal(t *testing.T) {
	for _, tc := range []struct{ mac, want string }{
		{"02:00:00:00:00:01", "fe80::ff:fe00:1"},
		{"52:54:00:12:34:56", "fe80::5054:ff:fe12:3456"},
	} {
		mac, _ := net.ParseMAC(tc.mac)
		if got := eui64LinkLocal(mac); got != netip.MustParseAddr(tc.want) {
			t.Errorf("%s: %s, want %s", tc.mac, got, tc.want)
		}
	}
}

// podLinkLocal waits for the kernel to give the pod's eth0 its link-local
// address and returns it.
func podLinkLocal(t *testing.T, p *testPod) netip.Addr {
	t.Helper()
	h, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByIndex(p.podIf)
	if err != nil {
		t.Fatal(err)
	}
	return waitLinkLocal(t, func() ([]netlink.Addr, error) { return h.AddrList(l, netlink.FAMILY_V6) })
}

func bridgeLinkLocal(t *testing.T, n *testNet) netip.Addr {
	t.Helper()
	return waitLinkLocal(t, func() ([]netlink.Addr, error) { return netlink.AddrList(n.bridge, netlink.FAMILY_V6) })
}

func waitLinkLocal(t *testing.T, list func() ([]netlink.Addr, error)) netip.Addr {
	t.Helper()
	for range 100 {
		as, err := list()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
				return ip
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no IPv6 link-local address appeared")
	return netip.Addr{}
}

func TestHardwareAddrText(t *testing.T) {
	b, err := json.Marshal(struct{ MAC HardwareAddr }{HardwareAddr(podMAC)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"MAC":"02:00:00:00:00:01"}`; string(b) != want {
		t.Fatalf("JSON %s, want %s", b, want)
	}
	var back struct{ MAC HardwareAddr }
	if err := json.Unmarshal(b, &back); err != nil || !bytes.Equal(back.MAC, podMAC) {
		t.Fatalf("round trip: %v %v", back.MAC, err)
	}
}
