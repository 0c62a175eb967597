package netpol

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestLayer2Veth replays, over real veth pairs on a bridge, the layer-2
// and neighbour-discovery attacks of issue 13: a pod that can write raw
// frames must not become another tenant's router, carry data to another
// tenant inside neighbour discovery, or take over another pod's MAC.
func TestLayer2Veth(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, a2, b1, b2 := n.addPod("a1", 1), n.addPod("a2", 2), n.addPod("b1", 3), n.addPod("b2", 4)
	m := n.open(ctx, nil)
	defer m.Close()
	bridgeLL := bridgeLinkLocal(t, n)
	for _, p := range []*testPod{a1, a2, b1, b2} {
		podLinkLocal(t, p) // registered once the kernel has formed it
	}
	tenants := map[*testPod]string{a1: "tenant-a", a2: "tenant-a", b1: "tenant-b", b2: "tenant-b"}
	for p, tenant := range tenants {
		if err := m.Register(ctx, n.endpoint(p, tenant, nil)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("router advertisement from a pod", func(t *testing.T) {
		n.enter()
		evil := netip.MustParsePrefix("fd66::/64")
		before := n.drops(m, "tenant-a")[ReasonND]
		n.sendRaw(a1, routerAdvert(a1.mac, podLinkLocal(t, a1), evil))
		time.Sleep(silenceWait)
		if gw, ok := defaultRouteVia(t, b1, podLinkLocal(t, a1)); ok {
			t.Errorf("b1 (tenant B) installed a default route via a1 (tenant A): %s", gw)
		}
		if a, ok := addressIn(t, b1, evil); ok {
			t.Errorf("b1 (tenant B) formed address %s in a1's prefix %s", a, evil)
		}
		if got := n.drops(m, "tenant-a")[ReasonND]; got <= before {
			t.Errorf("tenant-a nd drops did not grow: %d -> %d", before, got)
		}
		// The node's router is heard: the same message from the bridge's
		// link-local address installs the route, so the frame itself is valid.
		good := netip.MustParsePrefix("fd67::/64")
		n.sendRawOn(n.bridge.Attrs().Index, routerAdvert(n.bridge.Attrs().HardwareAddr, bridgeLL, good))
		var ok bool
		for deadline := time.Now().Add(replyWait); !ok && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, ok = defaultRouteVia(t, b1, bridgeLL)
		}
		if !ok {
			t.Errorf("b1 ignored the router advertisement of the node's bridge %s", bridgeLL)
		}
	})

	t.Run("data inside neighbour discovery", func(t *testing.T) {
		n.enter()
		for _, tc := range []struct {
			name     string
			from, to *testPod
			kind     byte
			delivers bool
		}{
			{"solicitation a1 to b1", a1, b1, 135, false},
			{"advertisement a1 to b1", a1, b1, 136, false},
			{"solicitation b1 to a1", b1, a1, 135, false},
			{"advertisement b1 to a2", b1, a2, 136, false},
			{"solicitation a1 to a2 (same tenant)", a1, a2, 135, true},
		} {
			for _, dst := range []struct {
				name string
				addr func(*testPod) netip.Addr
			}{{"global", func(p *testPod) netip.Addr { return p.v6 }}, {"link-local", func(p *testPod) netip.Addr { return podLinkLocal(t, p) }}} {
				t.Run(tc.name+" to "+dst.name, func(t *testing.T) {
					n.enter()
					secret := []byte("issue-13-" + tc.name + dst.name)
					src := tc.from.v6
					if dst.name == "link-local" {
						src = podLinkLocal(t, tc.from)
					}
					target := src // an advertisement claims the sender's own address
					if tc.kind == 135 {
						target = dst.addr(tc.to)
					}
					capture := n.capture(tc.to)
					defer unix.Close(capture)
					n.sendRaw(tc.from, ndWithData(tc.from.mac, tc.to.mac, src, dst.addr(tc.to), tc.kind, target, secret))
					wait := silenceWait
					if tc.delivers {
						wait = replyWait // returns as soon as it arrives
					}
					if got := received(capture, secret, wait); got != tc.delivers {
						t.Errorf("%s: delivered %v, want %v", tc.name, got, tc.delivers)
					}
				})
			}
		}
	})

	t.Run("arp probe with another pod's MAC", func(t *testing.T) {
		n.enter()
		if !n.reach(b2, b1, probeTCP, replyWait) {
			t.Fatal("b2 -> b1 (same tenant) failed before the probe")
		}
		time.Sleep(silenceWait) // let the connection's last segments pass
		if port := n.bridgePortOf(b1.mac); port != b1.hostIf {
			t.Fatalf("the bridge holds b1's MAC on %q, want %s", port, b1.hostIf)
		}
		before := n.drops(m, "tenant-a")[ReasonSpoof]
		// a1 claims b1's MAC: were it let through, the bridge would deliver
		// b1's traffic to a1's port until b1 next sends.
		probe := fromMAC(b1.mac, arpFrom(b1.mac, "0.0.0.0", "10.213.0.250"))
		copy(probe[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		n.sendRaw(a1, probe)
		if port := n.bridgePortOf(b1.mac); port == a1.hostIf {
			t.Errorf("the bridge now delivers b1's MAC %s to a1's port %s", b1.mac, port)
		}
		if !n.reach(b2, b1, probeTCP, replyWait) {
			t.Error("b2 -> b1 lost after a1 sent an ARP probe with b1's MAC")
		}
		if got := n.drops(m, "tenant-a")[ReasonSpoof]; got <= before {
			t.Errorf("tenant-a spoof drops did not grow: %d -> %d", before, got)
		}
	})

	t.Run("traffic still flows", func(t *testing.T) {
		n.enter()
		for _, kind := range []probe{probeTCP, probeICMP, probeTCP6, probeUDP6, probeICMP6} {
			if !n.reach(a1, a2, kind, replyWait) {
				t.Errorf("%s a1 -> a2 (same tenant) failed", kind)
			}
			if n.reach(a1, b1, kind, silenceWait) {
				t.Errorf("%s a1 -> b1 (other tenant) got through", kind)
			}
		}
	})
}

// bridgePortOf returns the bridge port its forwarding database holds mac
// on, or "" when it holds none.
func (n *testNet) bridgePortOf(mac net.HardwareAddr) string {
	fdb, err := netlink.NeighList(n.bridge.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		n.t.Fatal(err)
	}
	all, err := netlink.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		n.t.Fatal(err)
	}
	for _, e := range append(fdb, all...) {
		if bytes.Equal(e.HardwareAddr, mac) && e.MasterIndex == n.bridge.Attrs().Index {
			l, err := netlink.LinkByIndex(e.LinkIndex)
			if err != nil {
				n.t.Fatal(err)
			}
			return l.Attrs().Name
		}
	}
	return ""
}

// sendRawOn writes one frame on interface ifindex of the node's namespace.
func (n *testNet) sendRawOn(ifindex int, frame []byte) {
	proto := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
	if err != nil {
		n.t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}); err != nil {
		n.t.Fatal(err)
	}
}

// capture opens an AF_PACKET socket on the pod's eth0: every frame the pod
// receives from now on.
func (n *testNet) capture(p *testPod) int {
	var fd int
	n.inPod(p, func() {
		proto := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_ALL))
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto)); err != nil {
			n.t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: p.podIf}); err != nil {
			n.t.Fatal(err)
		}
	})
	return fd
}

// received reports whether a frame containing secret arrives on fd within wait.
func received(fd int, secret []byte, wait time.Duration) bool {
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		k, _, err := unix.Recvfrom(fd, buf, 0)
		if err == nil && bytes.Contains(buf[:k], secret) {
			return true
		}
	}
	return false
}

// routerAdvert is an RA from (mac, src) to all nodes, router lifetime 1800 s,
// announcing prefix for SLAAC, with a valid ICMPv6 checksum.
func routerAdvert(mac net.HardwareAddr, src netip.Addr, prefix netip.Prefix) []byte {
	body := []byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0} // hop limit, flags, lifetime, reachable, retrans
	pi := []byte{3, 4, byte(prefix.Bits()), 0xc0}             // prefix information: on-link, autonomous
	pi = binary.BigEndian.AppendUint32(pi, 86400)
	pi = binary.BigEndian.AppendUint32(pi, 14400)
	pi = append(pi, 0, 0, 0, 0)
	a := prefix.Addr().As16()
	pi = append(pi, a[:]...)
	body = append(body, pi...)
	body = append(append(body, 1, 1), mac...) // source link-layer address
	return icmp6Frame(mac, net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, src, netip.MustParseAddr("ff02::1"), 134, body)
}

// ndWithData is a neighbour solicitation or advertisement for target that
// carries secret in an option a receiver's kernel ignores.
func ndWithData(from, to net.HardwareAddr, src, dst netip.Addr, kind byte, target netip.Addr, secret []byte) []byte {
	body := []byte{0, 0, 0, 0}
	if kind == 136 {
		body[0] = 0x40 // solicited
	}
	t := target.As16()
	body = append(body, t[:]...)
	opt := append([]byte{200, byte((len(secret) + 2 + 7) / 8)}, secret...)
	opt = append(opt, make([]byte, int(opt[1])*8-len(opt))...)
	return icmp6Frame(from, to, src, dst, kind, append(body, opt...))
}

// icmp6Frame builds an Ethernet/IPv6/ICMPv6 frame with hop limit 255 and
// the ICMPv6 checksum the receiving kernel verifies.
func icmp6Frame(from, to net.HardwareAddr, src, dst netip.Addr, kind byte, body []byte) []byte {
	msg := append([]byte{kind, 0, 0, 0}, body...)
	s, d := src.As16(), dst.As16()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, 0, 0, 0, 0, 0, protoICMPv6)
	binary.BigEndian.PutUint16(pseudo[32:], uint16(len(msg)))
	binary.BigEndian.PutUint16(msg[2:], checksum(append(pseudo, msg...)))
	h := make([]byte, ipv6HdrLen)
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(msg)))
	h[6], h[7] = protoICMPv6, 255
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	f := append(append([]byte{}, to...), from...)
	f = binary.BigEndian.AppendUint16(f, ethTypeIPv6)
	return append(append(f, h...), msg...)
}

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// defaultRouteVia reports whether the pod has an IPv6 default route via gw.
func defaultRouteVia(t *testing.T, p *testPod, gw netip.Addr) (netip.Addr, bool) {
	t.Helper()
	h, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.To16() != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if ip, ok := netip.AddrFromSlice(r.Gw); ok && ip == gw {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// addressIn reports whether the pod has an address in prefix.
func addressIn(t *testing.T, p *testPod, prefix netip.Prefix) (netip.Addr, bool) {
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
	as, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && prefix.Contains(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
