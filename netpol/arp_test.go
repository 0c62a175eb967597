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

// Issue 24, hole 7: an ARP probe (sender 0.0.0.0) passed from any pod to
// any pod it targeted, of any length. ARP frames are bounded to the message
// (42 bytes, or up to 60 padded with zeros), request or reply only, and the
// sender hardware address of an ARP message delivered to a pod must not be
// another tenant's pod's.

var (
	sameMAC = []byte{0x02, 0, 0, 0, 0, 0x03} // tenant A's other pod
	nodeMAC = []byte{0x02, 0, 0, 0, 0, 0xfe} // the node's bridge: no pod's
)

// arpOp is an ARP message of op (1 request, 2 reply) from sha/spa to
// tha/tpa, sent from Ethernet address sha.
func arpOp(op uint16, sha []byte, spa string, tha []byte, tpa string) []byte {
	b := []byte{0, 1, 8, 0, 6, 4}
	b = binary.BigEndian.AppendUint16(b, op)
	b = append(b, sha...)
	s := netip.MustParseAddr(spa).As4()
	b = append(b, s[:]...)
	b = append(b, tha...)
	t := netip.MustParseAddr(tpa).As4()
	b = append(b, t[:]...)
	return fromMAC(sha, ether(ethTypeARP, b))
}

// padded appends n copies of fill to frame.
func padded(frame []byte, n int, fill byte) []byte {
	return append(append([]byte{}, frame...), bytes.Repeat([]byte{fill}, n)...)
}

func arpCases() []verdictCase {
	pass := func(name string, dir Direction, frame []byte) verdictCase {
		return verdictCase{name: name, dir: dir, frame: frame}
	}
	drop := func(name string, dir Direction, frame []byte, r Reason) verdictCase {
		return verdictCase{name: name, dir: dir, frame: frame, drop: true, reason: r}
	}
	zero := make([]byte, 6)
	probe := arp("0.0.0.0", otherV4)
	secret := []byte("issue-24-hole-7: a tenant's data in an ARP probe")
	return []verdictCase{
		// From the pod: the message, padded with zeros to at most 60 bytes.
		pass("probe of 42 bytes", FromPod, probe),
		pass("probe padded to 60 with zeros", FromPod, padded(probe, ethFrameMin-len(probe), 0)),
		pass("request padded to 56 with zeros", FromPod, padded(arp(podV4, sameV4), 14, 0)),
		pass("reply from the pod", FromPod, arpOp(2, podMAC, podV4, sameMAC, sameV4)),
		drop("probe carrying data", FromPod, append(append([]byte{}, probe...), secret...), ReasonMalformed),
		drop("probe padded with data", FromPod, padded(probe, ethFrameMin-len(probe), 'x'), ReasonMalformed),
		drop("probe with one data byte in its padding", FromPod, append(padded(probe, 10, 0), 'x'), ReasonMalformed),
		drop("probe of 61 bytes", FromPod, padded(probe, ethFrameMin+1-len(probe), 0), ReasonMalformed),
		drop("probe of 1500 bytes", FromPod, padded(probe, 1500-len(probe), 0), ReasonMalformed),
		drop("reply carrying data", FromPod, append(arpOp(2, podMAC, podV4, sameMAC, sameV4), secret...), ReasonMalformed),
		drop("opcode other than request or reply", FromPod, arpOp(3, podMAC, podV4, zero, sameV4), ReasonMalformed),
		drop("opcode zero", FromPod, arpOp(0, podMAC, "0.0.0.0", zero, otherV4), ReasonMalformed),
		drop("probe with another pod's sender MAC", FromPod, fromMAC(podMAC, arpFrom(sameMAC, "0.0.0.0", sameV4)), ReasonSpoof),
		// To the pod: never from another tenant's pod, probes included.
		drop("probe from another tenant's pod", ToPod, fromMAC(otherMAC, arpFrom(otherMAC, "0.0.0.0", podV4)), ReasonTenant),
		drop("probe from another tenant's pod, secret in the target MAC", ToPod, arpOp(1, otherMAC, "0.0.0.0", []byte("secret"), podV4), ReasonTenant),
		drop("reply from another tenant's pod, sender no one's", ToPod, arpOp(2, otherMAC, unownedV4, podMAC, podV4), ReasonTenant),
		drop("request from another tenant's pod", ToPod, arpOp(1, otherMAC, otherV4, zero, podV4), ReasonTenant),
		drop("probe carrying data to the pod", ToPod, append(arpOp(1, sameMAC, "0.0.0.0", zero, podV4), secret...), ReasonMalformed),
		drop("probe padded with data to the pod", ToPod, padded(arpOp(1, nodeMAC, "0.0.0.0", zero, podV4), 18, 0xff), ReasonMalformed),
		drop("probe for another address", ToPod, arpOp(1, sameMAC, "0.0.0.0", zero, sameV4), ReasonDst),
		pass("probe from the same tenant", ToPod, arpOp(1, sameMAC, "0.0.0.0", zero, podV4)),
		pass("request from the same tenant", ToPod, arpOp(1, sameMAC, sameV4, zero, podV4)),
		pass("reply from the same tenant", ToPod, arpOp(2, sameMAC, sameV4, podMAC, podV4)),
		pass("request from the node", ToPod, arpOp(1, nodeMAC, "10.0.0.254", zero, podV4)),
		pass("probe from the node", ToPod, arpOp(1, nodeMAC, "0.0.0.0", zero, podV4)),
		pass("reply from the node padded to 60 with zeros", ToPod, padded(arpOp(2, nodeMAC, "10.0.0.254", podMAC, podV4), 18, 0)),
	}
}

// TestARPVerdicts runs the ARP cases through BPF_PROG_TEST_RUN, with the
// pod's neighbours' MACs registered as a real Register would.
func TestARPVerdicts(t *testing.T) {
	d := loadFixture(t)
	none := func(uint32) bool { return false }
	for _, o := range []struct {
		mac []byte
		o   owner
	}{
		{sameMAC, owner{Tenant: tenantA, Ifindex: 101}},
		{otherMAC, owner{Tenant: tenantB, Ifindex: 102}},
	} {
		if err := d.putMACOwner([6]byte(o.mac), o.o, none); err != nil {
			t.Fatal(err)
		}
	}
	tenants := map[string]uint32{"a": tenantA}
	for _, tc := range arpCases() {
		t.Run(tc.name, func(t *testing.T) { checkVerdict(t, d, tenants, tc) })
	}
}

// TestMACOwner: Register records the pod's MAC as its tenant's, refuses a
// MAC another live pod has, and Unregister and GC leave no MAC behind.
func TestMACOwner(t *testing.T) {
	d := loadFixture(t)
	e := podEndpoint(nil)
	r := newRecord(&e, loIfindex, "lo", tenantA, tierStd)
	if err := d.install(r); err != nil {
		t.Fatal(err)
	}
	var o owner
	if err := d.ownerMAC.Lookup(macKey([6]byte(podMAC)), &o); err != nil || o.Tenant != tenantA || o.Ifindex != loIfindex {
		t.Fatalf("owner of the pod's MAC: %+v (err %v), want tenant %d on ifindex %d", o, err, tenantA, loIfindex)
	}
	// Another interface with the same MAC, the first still live: refused.
	dup := newRecord(&e, 7, "veth7", tenantB, tierStd)
	if err := d.install(dup); err == nil {
		t.Fatal("a second endpoint with a live endpoint's MAC was installed")
	}
	if err := d.ownerMAC.Lookup(macKey([6]byte(podMAC)), &o); err != nil || o.Tenant != tenantA {
		t.Fatalf("the refused endpoint took the MAC: %+v (err %v)", o, err)
	}
	if err := d.remove(loIfindex, r.value); err != nil {
		t.Fatal(err)
	}
	if err := d.ownerMAC.Lookup(macKey([6]byte(podMAC)), &o); err == nil {
		t.Fatalf("MAC still owned after remove: %+v", o)
	}
	// A MAC whose endpoint is gone: swept.
	if err := d.putMACOwner([6]byte(otherMAC), owner{Tenant: tenantB, Ifindex: 99}, func(uint32) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if err := d.sweepMACOwners(map[uint32]endpointValue{}); err != nil {
		t.Fatal(err)
	}
	if err := d.ownerMAC.Lookup(macKey([6]byte(otherMAC)), &o); err == nil {
		t.Fatalf("orphan MAC survived the sweep: %+v", o)
	}
}

// TestARPVeth replays hole 7 over real veths on a bridge: a pod that
// writes raw frames sends ARP probes to another tenant's pod, with data
// after the message and in the target hardware address. None may arrive;
// the same tenant's pod gets a plain probe but not one carrying data; and
// the kernel's own ARP, between pods and with the node, still resolves.
func TestARPVeth(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, a2, b1 := n.addPod("a1", 1), n.addPod("a2", 2), n.addPod("b1", 3)
	m := n.open(ctx, nil)
	defer m.Close()
	tenants := map[*testPod]string{a1: "tenant-a", a2: "tenant-a", b1: "tenant-b"}
	for p, tenant := range tenants {
		if err := m.Register(ctx, n.endpoint(p, tenant, nil)); err != nil {
			t.Fatal(err)
		}
	}
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	// probeFrame is what a pod writing raw frames sends: a broadcast ARP
	// probe for to's address from its own MAC, tha in the target hardware
	// address, data after the message.
	probeFrame := func(from, to *testPod, tha []byte, data []byte) []byte {
		f := arpOp(1, from.mac, "0.0.0.0", tha, to.v4.String())
		copy(f[0:6], bcast)
		return append(f, data...)
	}

	t.Run("probes to another tenant", func(t *testing.T) {
		n.enter()
		before := n.drops(m, "tenant-b")
		for _, tc := range []struct {
			name      string
			tha, data []byte
		}{
			{"data after the message", make([]byte, 6), []byte("issue-24-after-the-message")},
			{"data in the target MAC", []byte("i24tha"), nil},
		} {
			secret := tc.data
			if secret == nil {
				secret = tc.tha
			}
			capture := n.capture(b1)
			n.sendRaw(a1, probeFrame(a1, b1, tc.tha, tc.data))
			got := received(capture, secret, silenceWait)
			unix.Close(capture)
			if got {
				t.Errorf("%s: b1 (tenant B) received a1's (tenant A) probe", tc.name)
			}
		}
		after := n.drops(m, "tenant-b")
		if after[ReasonTenant] < before[ReasonTenant]+1 {
			t.Errorf("tenant-b tenant drops %d -> %d: want the plain probe counted", before[ReasonTenant], after[ReasonTenant])
		}
	})

	t.Run("probes within a tenant", func(t *testing.T) {
		n.enter()
		capture := n.capture(a2)
		defer unix.Close(capture)
		n.sendRaw(a1, probeFrame(a1, a2, []byte("i24ten"), nil))
		if !received(capture, []byte("i24ten"), replyWait) {
			t.Error("a2 did not receive a plain probe from a1 (same tenant): the frame or the fence is wrong")
		}
		before := n.drops(m, "tenant-a")[ReasonMalformed]
		n.sendRaw(a1, probeFrame(a1, a2, make([]byte, 6), []byte("issue-24-bulk")))
		if received(capture, []byte("issue-24-bulk"), silenceWait) {
			t.Error("a2 received a probe carrying data after the message")
		}
		if got := n.drops(m, "tenant-a")[ReasonMalformed]; got <= before {
			t.Errorf("tenant-a malformed drops did not grow: %d -> %d", before, got)
		}
	})

	t.Run("the kernel's arp resolves", func(t *testing.T) {
		n.enter()
		capture := n.capture(a2)
		defer unix.Close(capture)
		flushNeigh(t, a1)
		flushNeigh(t, a2)
		if !n.reach(a1, a2, probeTCP, replyWait) {
			t.Fatal("tcp a1 -> a2 (same tenant) failed after flushing the neighbour tables")
		}
		sizes := arpSizes(capture)
		if len(sizes) == 0 {
			t.Fatal("no ARP frame seen on a2: the test did not exercise ARP")
		}
		for _, s := range sizes {
			if s < ethHdrLen+arpLen || s > ethFrameMin {
				t.Errorf("the kernel sent a %d-byte ARP frame, outside the fence's bound", s)
			}
		}
		t.Logf("ARP frames the kernel sent over the veth: %v bytes", sizes)
		if n.reach(a1, b1, probeTCP, silenceWait) {
			t.Error("tcp a1 -> b1 (other tenant) got through")
		}
	})

	t.Run("the node resolves a pod", func(t *testing.T) {
		n.enter()
		gw := netip.MustParsePrefix("10.213.0.254/24")
		if err := netlink.AddrAdd(n.bridge, &netlink.Addr{IPNet: &net.IPNet{IP: gw.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		// Any packet makes the node ask for b1's MAC; the answer is what
		// counts (the packet itself is the fence's to judge).
		c, err := net.Dial("udp", netip.AddrPortFrom(b1.v4, echoPort).String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var mac net.HardwareAddr
		for deadline := time.Now().Add(replyWait); mac == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, _ = c.Write([]byte("who-has"))
			mac = neighMAC(t, n.bridge.Attrs().Index, b1.v4)
		}
		if !bytes.Equal(mac, b1.mac) {
			t.Errorf("the node resolved b1 %s to %v, want %s", b1.v4, mac, b1.mac)
		}
	})
}

// flushNeigh empties the pod's IPv4 neighbour table.
func flushNeigh(t *testing.T, p *testPod) {
	t.Helper()
	h, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.NeighList(p.podIf, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ns {
		if err := h.NeighDel(&e); err != nil {
			t.Fatal(err)
		}
	}
}

// neighMAC returns the MAC the node's neighbour table holds for addr on
// ifindex, or nil.
func neighMAC(t *testing.T, ifindex int, addr netip.Addr) net.HardwareAddr {
	t.Helper()
	ns, err := netlink.NeighList(ifindex, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ns {
		if ip, ok := netip.AddrFromSlice(e.IP.To4()); ok && ip == addr && e.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) != 0 {
			return e.HardwareAddr
		}
	}
	return nil
}

// arpSizes returns the sizes of the ARP frames waiting on fd.
func arpSizes(fd int) []int {
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	var out []int
	buf := make([]byte, 2048)
	for {
		k, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
		if err != nil {
			return out
		}
		if k >= ethHdrLen && binary.BigEndian.Uint16(buf[12:]) == ethTypeARP {
			out = append(out, k)
		}
	}
}

// testMetadataCIDRs is the policy's default list of credential endpoints
// (network.default_metadata_cidrs in rego/network.rego), as the decision
// hands it to the fence.
func testMetadataCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"169.254.169.254/32", "169.254.170.2/32", "169.254.170.23/32", "100.100.100.200/32",
		"168.63.129.16/32", "fd00:ec2::254/128", "fd00:ec2::23/128",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}
