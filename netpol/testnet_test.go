package netpol

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	xipv4 "golang.org/x/net/ipv4"
	xipv6 "golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// testNet is a throwaway node: a network namespace standing in for the
// host, a bridge in it, and pods in namespaces of their own, each joined to
// the bridge by a veth pair. Nothing of it touches the real host network.
// Every goroutine that works in it calls enter first.
type testNet struct {
	t      testing.TB
	host   netns.NsHandle
	bridge netlink.Link
	pods   map[string]*testPod
	pinDir string
	lock   string
}

type testPod struct {
	name    string
	ns      netns.NsHandle
	nsPath  string
	hostIf  string
	podIf   int // eth0's index inside the pod
	mac     net.HardwareAddr
	v4, v6  netip.Addr
	closers []func()
}

// Ports every pod serves: a one-shot TCP and UDP echo, UDP echo on the
// RoCEv2 port, a sink for throughput and a persistent echo for
// request/response.
const (
	echoPort = 7
	roceUDP  = roceV2Port
	sinkPort = 9
	rrPort   = 8
)

// serveSink reads rounds of an 8-byte length and that many bytes, and
// answers each round with one byte.
func serveSink(c net.Conn) {
	defer c.Close()
	hdr := make([]byte, 8)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint64(hdr))); err != nil {
			return
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return
		}
	}
}

// serveRR echoes every byte back at once.
func serveRR(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 1)
	for {
		if _, err := c.Read(buf); err != nil {
			return
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
	}
}

// Bounds on waiting for a reply: generous for replies that must come, short
// for replies that must not. Neither is asserted on.
const (
	replyWait   = 5 * time.Second
	silenceWait = 400 * time.Millisecond
)

func requireNetAdmin(t testing.TB) {
	t.Helper()
	requireBPF(t)
	if testing.Short() {
		t.Skip("network namespace traffic test: skipped in -short mode")
	}
}

// newTestNet builds the node; the calling goroutine stays in its host
// namespace for the rest of the test.
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	requireNetAdmin(t)
	runtime.LockOSThread() // never unlocked: the thread is discarded with the goroutine
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	host, err := netns.New()
	if err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	n := &testNet{t: t, host: host, pods: map[string]*testPod{}}
	t.Cleanup(func() {
		for _, p := range n.pods {
			for _, c := range p.closers {
				c()
			}
			p.ns.Close()
		}
		host.Close()
		_ = netns.Set(orig)
		orig.Close()
	})
	if err := netlink.LinkSetUp(mustLink(t, "lo")); err != nil {
		t.Fatal(err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	n.bridge = mustLink(t, "br0")
	if err := netlink.LinkSetUp(n.bridge); err != nil {
		t.Fatal(err)
	}

	// A private bpffs: this test's pins cannot collide with anyone's.
	dir := t.TempDir()
	bpffs := filepath.Join(dir, "bpffs")
	if err := MountBPFFS(bpffs); err != nil {
		t.Skipf("cannot mount a bpf filesystem: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	n.pinDir = filepath.Join(bpffs, "bulkhead")
	n.lock = filepath.Join(dir, "netpol.lock")
	return n
}

func mustLink(t testing.TB, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// enter puts the calling goroutine's thread in the node's host namespace.
func (n *testNet) enter() {
	runtime.LockOSThread()
	if err := netns.Set(n.host); err != nil {
		n.t.Fatal(err)
	}
}

// inPod runs fn with the thread in the pod's namespace: sockets fn creates
// live there.
func (n *testNet) inPod(p *testPod, fn func()) {
	if err := netns.Set(p.ns); err != nil {
		n.t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(n.host); err != nil {
			n.t.Fatal(err)
		}
	}()
	fn()
}

func (n *testNet) addPod(name string, octet byte) *testPod {
	t := n.t
	t.Helper()
	podNS, err := netns.New() // moves the thread; move it back below
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(n.host); err != nil {
		t.Fatal(err)
	}
	p := &testPod{
		name: name, ns: podNS, hostIf: "h" + name,
		nsPath: fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(podNS)),
		v4:     netip.AddrFrom4([4]byte{10, 213, 0, octet}),
		v6:     netip.AddrFrom16([16]byte{0xfd, 0x13, 15: octet}),
	}
	n.pods[name] = p
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.hostIf, MasterIndex: n.bridge.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(podNS),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(mustLink(t, p.hostIf)); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(podNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "eth0" {
			p.podIf = l.Attrs().Index
			p.mac = l.Attrs().HardwareAddr
			for _, a := range []netip.Prefix{netip.PrefixFrom(p.v4, 24), netip.PrefixFrom(p.v6, 64)} {
				addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
				if err := h.AddrAdd(l, addr); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	n.inPod(p, func() { p.closers = append(p.closers, serveEcho(t)...) })
	return p
}

// serveEcho starts TCP and UDP echo servers on every address of the
// current namespace: TCP on echoPort, UDP on echoPort and on the RoCEv2 port.
func serveEcho(t testing.TB) []func() {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", echoPort))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				k, _ := c.Read(buf)
				_, _ = c.Write(buf[:k])
			}()
		}
	}()
	closers := []func(){func() { ln.Close() }}
	for port, serve := range map[int]func(net.Conn){sinkPort: serveSink, rrPort: serveRR} {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go serve(c)
			}
		}()
		closers = append(closers, func() { l.Close() })
	}
	for _, port := range []int{echoPort, roceUDP} {
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 64)
			for {
				k, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:k], from)
			}
		}()
		closers = append(closers, func() { pc.Close() })
	}
	return closers
}

// probe is one kind of traffic between two pods.
type probe string

const (
	probeTCP   probe = "tcp"
	probeUDP   probe = "udp"
	probeICMP  probe = "icmp"
	probeRoCE  probe = "udp-4791"
	probeTCP6  probe = "tcp6"
	probeUDP6  probe = "udp6"
	probeICMP6 probe = "icmp6"
	probeRoCE6 probe = "udp6-4791"
)

var allProbes = []probe{probeTCP, probeUDP, probeICMP, probeRoCE, probeTCP6, probeUDP6, probeICMP6, probeRoCE6}

// reach reports whether from gets an answer from to over kind, waiting at
// most wait. Sockets are made in from's namespace.
func (n *testNet) reach(from, to *testPod, kind probe, wait time.Duration) bool {
	var ok bool
	var err error
	n.inPod(from, func() { ok, err = send(to, kind, wait) })
	if err != nil {
		n.t.Fatalf("%s %s -> %s: %v", kind, from.name, to.name, err)
	}
	return ok
}

func send(to *testPod, kind probe, wait time.Duration) (bool, error) {
	addr := to.v4
	switch kind {
	case probeTCP6, probeUDP6, probeICMP6, probeRoCE6:
		addr = to.v6
	}
	msg := []byte("bulkhead")
	switch kind {
	case probeTCP, probeTCP6:
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, echoPort).String(), wait)
		if err != nil {
			return false, nil
		}
		defer c.Close()
		return roundTrip(c, msg, wait)
	case probeUDP, probeUDP6, probeRoCE, probeRoCE6:
		port := uint16(echoPort)
		if kind == probeRoCE || kind == probeRoCE6 {
			port = roceUDP
		}
		c, err := net.Dial("udp", netip.AddrPortFrom(addr, port).String())
		if err != nil {
			return false, err
		}
		defer c.Close()
		return roundTrip(c, msg, wait)
	case probeICMP, probeICMP6:
		network, proto, echo := "ip4:icmp", 1, icmp.Type(xipv4.ICMPTypeEcho)
		if kind == probeICMP6 {
			network, proto, echo = "ip6:ipv6-icmp", 58, xipv6.ICMPTypeEchoRequest
		}
		c, err := icmp.ListenPacket(network, "")
		if err != nil {
			return false, err
		}
		defer c.Close()
		req, _ := (&icmp.Message{Type: echo, Body: &icmp.Echo{ID: 0x1b, Seq: 1, Data: msg}}).Marshal(nil)
		if _, err := c.WriteTo(req, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
			return false, err
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 256)
		for {
			k, _, err := c.ReadFrom(buf)
			if err != nil {
				return false, nil
			}
			m, err := icmp.ParseMessage(proto, buf[:k])
			if err == nil && (m.Type == xipv4.ICMPTypeEchoReply || m.Type == xipv6.ICMPTypeEchoReply) {
				return true, nil
			}
		}
	}
	return false, fmt.Errorf("unknown probe %q", kind)
}

func roundTrip(c net.Conn, msg []byte, wait time.Duration) (bool, error) {
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(msg); err != nil {
		return false, nil
	}
	buf := make([]byte, 64)
	k, err := c.Read(buf)
	return err == nil && string(buf[:k]) == string(msg), nil
}

// sendRaw writes one frame on the pod's eth0 through AF_PACKET.
func (n *testNet) sendRaw(p *testPod, frame []byte) {
	n.inPod(p, func() {
		proto := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			n.t.Fatal(err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: p.podIf, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
		if err := unix.Sendto(fd, frame, 0, sa); err != nil {
			n.t.Fatal(err)
		}
	})
}

func (n *testNet) open(ctx context.Context, mod func(*Options)) *Manager {
	n.t.Helper()
	opts := Options{
		PinDir:   n.pinDir,
		LockPath: n.lock,
		Cluster: &ClusterConfig{
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.213.0.0/16"), netip.MustParsePrefix("fd13::/16")},
		},
	}
	if mod != nil {
		mod(&opts)
	}
	m, err := Open(ctx, opts)
	if err != nil {
		n.t.Fatal(err)
	}
	return m
}

func (n *testNet) endpoint(p *testPod, tenant string, mod func(*Endpoint)) Endpoint {
	n.t.Helper()
	idx, name, err := HostVeth(p.nsPath, "")
	if err != nil {
		n.t.Fatal(err)
	}
	if name != p.hostIf {
		n.t.Fatalf("HostVeth(%s) = %s, want %s", p.name, name, p.hostIf)
	}
	e := Endpoint{SandboxID: "sandbox-" + p.name, Ifindex: idx, Tenant: tenant, Tier: "standard", IPv4: p.v4, IPv6: p.v6}
	if mod != nil {
		mod(&e)
	}
	return e
}

func (n *testNet) drops(m *Manager, tenant string) map[Reason]uint64 {
	n.t.Helper()
	s, err := m.Stats(tenant)
	if err != nil {
		n.t.Fatal(err)
	}
	return s.Drops
}

// assertEmpty checks that the maps and pins hold nothing of any local pod.
func assertEmpty(t *testing.T, m *Manager, pinDir string) {
	t.Helper()
	eps, err := m.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 0 {
		t.Errorf("endpoints left: %+v", eps)
	}
	owners, err := m.dp.owners()
	if err != nil {
		t.Fatal(err)
	}
	for p, o := range owners {
		if o.Flags&flagRemote == 0 {
			t.Errorf("address %s still owned by tenant %d on ifindex %d", p, o.Tenant, o.Ifindex)
		}
	}
	links, err := os.ReadDir(filepath.Join(pinDir, "links"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		t.Errorf("pinned link left: %s", l.Name())
	}
}
