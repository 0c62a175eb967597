package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// dsPod is a running pod on the dual-stack node.
type dsPod struct {
	name, tenant, id, ctr string
	v4, v6                netip.Addr
	netns                 string
}

// TestDualStackFenceThroughCRI runs the traffic matrix over IPv4 and IPv6
// between gVisor pods started through CRI on a dual-stack bridge (RoCEv2
// too: within a tenant whose tier grants RDMA to both pods it passes, across
// tenants that both hold the grant it drops, without the grant it drops), then
// replays issue 13's layer-2 attacks from a pod's network namespace (as a
// sandbox with raw sockets, or a compromised one, would write them): a
// router advertisement must not change another pod's routes, and an ARP
// claim of another pod's address or MAC must not move its traffic.
func TestDualStackFenceThroughCRI(t *testing.T) {
	pn := startPipelineNodeWith(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	server := "exec netprobe serve tcp:8080 udp:9090 udp:4791"
	run := func(name, ns string, annotations map[string]string) dsPod {
		cfg := podConfig(pn.Node, name, ns, annotations)
		id, err := runPod(ctx, pn.Node, cfg)
		if err != nil {
			t.Fatalf("pod %s/%s: %v", ns, name, err)
		}
		c, err := startContainer(ctx, pn.Node, id, cfg, "main", server)
		if err != nil {
			t.Fatal(err)
		}
		p := dsPod{name: name, tenant: ns, id: id, ctr: c}
		st, err := pn.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
		if err != nil {
			t.Fatal(err)
		}
		ips := []string{st.Status.GetNetwork().GetIp()}
		for _, a := range st.Status.GetNetwork().GetAdditionalIps() {
			ips = append(ips, a.GetIp())
		}
		for _, s := range ips {
			if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
				p.v4 = a
			} else if err == nil && a.Is6() {
				p.v6 = a
			}
		}
		if !p.v4.IsValid() || !p.v6.IsValid() {
			t.Fatalf("pod %s: CRI reports addresses %v, want one IPv4 and one IPv6", name, ips)
		}
		p.netns = sandboxNetNS(t, st.GetInfo())
		return p
	}
	// agents (untrusted) may not ask for RDMA; research (standard) and
	// platform (trusted) pods ask for it and their tiers grant it.
	withRDMA := map[string]string{policy.AnnotationRDMA: "true"}
	a1, a2 := run("a1", "agents", nil), run("a2", "agents", nil)
	r1, r2 := run("r1", "research", withRDMA), run("r2", "research", withRDMA)
	p1 := run("p1", "platform", withRDMA)
	fence := pn.fence(t)
	eps, err := fence.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{r1.id: true, r2.id: true, p1.id: true}
	for _, e := range eps {
		if !e.IPv4.IsValid() || !e.IPv6.IsValid() || !e.LinkLocal.IsValid() || len(e.MAC) != 6 {
			t.Errorf("endpoint %.12s registered without both families and its link layer: %+v", e.SandboxID, e)
		}
		if e.AllowRDMA != granted[e.SandboxID] {
			t.Errorf("endpoint %.12s registered with AllowRDMA %v, want %v", e.SandboxID, e.AllowRDMA, granted[e.SandboxID])
		}
	}
	drops := func(tenant string) map[netpol.Reason]uint64 {
		st, err := fence.Stats(tenant)
		if err != nil {
			t.Fatal(err)
		}
		return st.Drops
	}
	probe := func(from, to dsPod, mode string, v6 bool) bool {
		addr := to.v4
		if v6 {
			addr = to.v6
		}
		target := addr.String()
		switch mode {
		case "tcp":
			target = netip.AddrPortFrom(addr, 8080).String()
		case "udp":
			target = netip.AddrPortFrom(addr, 9090).String()
		case "roce":
			mode, target = "udp", netip.AddrPortFrom(addr, 4791).String()
		case "icmp":
			if v6 {
				mode = "icmp6"
			}
		}
		_, err := execSync(ctx, pn.Node, from.ctr, "netprobe", mode, target)
		return err == nil
	}
	time.Sleep(300 * time.Millisecond) // servers listening

	family := map[bool]string{false: "IPv4", true: "IPv6"}
	for _, v6 := range []bool{false, true} {
		t.Run(family[v6], func(t *testing.T) {
			for _, mode := range []string{"tcp", "udp", "icmp"} {
				for _, pair := range [][2]dsPod{{a1, a2}, {a2, a1}, {r1, r2}, {r2, r1}} {
					if !probe(pair[0], pair[1], mode, v6) {
						t.Errorf("same tenant %s %s -> %s failed", mode, pair[0].name, pair[1].name)
					}
				}
			}
			before := drops("agents")[netpol.ReasonTenant] + drops("research")[netpol.ReasonTenant]
			for _, mode := range []string{"tcp", "udp", "icmp", "roce"} {
				for _, pair := range [][2]dsPod{{a1, r1}, {r1, a1}, {a2, r2}, {r2, a2}} {
					if probe(pair[0], pair[1], mode, v6) {
						t.Errorf("cross tenant %s %s -> %s passed", mode, pair[0].name, pair[1].name)
					}
				}
			}
			if after := drops("agents")[netpol.ReasonTenant] + drops("research")[netpol.ReasonTenant]; after <= before {
				t.Errorf("tenant drops did not grow (%d -> %d)", before, after)
			}
			rdma := drops("agents")[netpol.ReasonRDMA]
			if probe(a1, a2, "roce", v6) {
				t.Error("RoCEv2 between untrusted pods passed")
			}
			if after := drops("agents")[netpol.ReasonRDMA]; after <= rdma {
				t.Errorf("agents rdma drops did not grow (%d -> %d)", rdma, after)
			}
			// RoCEv2 where both ends hold the grant: within the tenant it
			// passes both ways; to another tenant's granted pod it drops.
			for _, pair := range [][2]dsPod{{r1, r2}, {r2, r1}} {
				if !probe(pair[0], pair[1], "roce", v6) {
					t.Errorf("RoCEv2 %s -> %s (research, both granted) failed", pair[0].name, pair[1].name)
				}
			}
			before = drops("research")[netpol.ReasonTenant] + drops("platform")[netpol.ReasonTenant]
			for _, pair := range [][2]dsPod{{r1, p1}, {p1, r1}} {
				if probe(pair[0], pair[1], "roce", v6) {
					t.Errorf("RoCEv2 %s -> %s (research <-> platform, both granted) passed", pair[0].name, pair[1].name)
				}
			}
			if after := drops("research")[netpol.ReasonTenant] + drops("platform")[netpol.ReasonTenant]; after < before+2 {
				t.Errorf("research and platform tenant drops grew by %d, want at least 2", after-before)
			}
		})
	}

	// What the fence recorded for each pod: its MAC and link-local address
	// (runsc moves the pod's addresses into the sandbox, so the namespace
	// may no longer show them).
	byID := map[string]netpol.EndpointInfo{}
	for _, e := range eps {
		byID[e.SandboxID] = e
	}
	l2 := func(p dsPod) (net.HardwareAddr, netip.Addr) {
		e, ok := byID[p.id]
		if !ok {
			t.Fatalf("pod %s is not registered in the fence", p.name)
		}
		return net.HardwareAddr(e.MAC), e.LinkLocal
	}

	// The link-local address the fence holds is the one the sandbox uses:
	// runsc may have moved it out of the namespace before registration, and
	// Register then derives it from the MAC.
	t.Run("sandbox link-local is the registered one", func(t *testing.T) {
		for _, p := range []dsPod{a1, a2, r1, r2} {
			_, ll := l2(p)
			out, err := execSync(ctx, pn.Node, p.ctr, "ip", "-6", "addr")
			if err != nil {
				t.Skipf("ip -6 addr in %s: %v", p.name, err)
			}
			if !strings.Contains(out, "fe80:") {
				t.Logf("%s's sandbox shows no link-local address:\n%s", p.name, out)
				continue
			}
			if !strings.Contains(out, ll.String()+"/") {
				t.Errorf("%s: the fence holds link-local %s, the sandbox has:\n%s", p.name, ll, out)
			}
		}
	})

	t.Run("router advertisement from a pod", func(t *testing.T) {
		mac, ll := l2(a1)
		evil := netip.MustParsePrefix("fd66::/64")
		before := drops("agents")[netpol.ReasonND]
		sendFrame(t, a1.netns, routerAdvert(mac, ll, evil))
		time.Sleep(500 * time.Millisecond)
		if routeVia(t, r1.netns, ll) {
			t.Errorf("r1's namespace (research) has a route via a1 (agents) %s", ll)
		}
		// The sandbox's own stack, as the workload sees it.
		for _, cmd := range [][]string{{"ip", "-6", "route"}, {"ip", "-6", "addr"}} {
			out, err := execSync(ctx, pn.Node, r1.ctr, cmd...)
			if err != nil {
				t.Logf("%v in r1: %v", cmd, err)
				continue
			}
			if strings.Contains(out, ll.String()) || strings.Contains(out, "fd66:") {
				t.Errorf("r1 (research) took a1's router advertisement: %v:\n%s", cmd, out)
			}
		}
		if after := drops("agents")[netpol.ReasonND]; after <= before {
			t.Errorf("agents nd drops did not grow (%d -> %d)", before, after)
		}
	})

	t.Run("arp claims", func(t *testing.T) {
		mac, _ := l2(a1)
		rmac, _ := l2(r1)
		before := drops("agents")[netpol.ReasonSpoof]
		// a1 announces r1's IPv4 address as its own, then probes with r1's MAC.
		sendFrame(t, a1.netns, arpFrame(mac, mac, r1.v4, r1.v4))
		sendFrame(t, a1.netns, arpFrame(rmac, rmac, netip.IPv4Unspecified(), r2.v4))
		for _, mode := range []string{"tcp", "udp"} {
			for _, v6 := range []bool{false, true} {
				if !probe(r2, r1, mode, v6) {
					t.Errorf("%s %s r2 -> r1 (same tenant) lost after a1's ARP claims", family[v6], mode)
				}
			}
		}
		if after := drops("agents")[netpol.ReasonSpoof]; after < before+2 {
			t.Errorf("agents spoof drops grew by %d, want at least 2", after-before)
		}
	})
	t.Logf("drop counters: research %v, agents %v, platform %v", drops("research"), drops("agents"), drops("platform"))

	for _, p := range []dsPod{a1, a2, r1, r2, p1} {
		if err := removePod(ctx, pn.Node, p.id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}

// sandboxNetNS finds the sandbox's network namespace path in containerd's
// verbose status (the OCI spec it ran the sandbox with).
func sandboxNetNS(t *testing.T, info map[string]string) string {
	t.Helper()
	var v struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(info["info"]), &v); err != nil {
		t.Fatalf("sandbox status info: %v", err)
	}
	for _, ns := range v.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path
		}
	}
	t.Fatal("sandbox status names no network namespace")
	return ""
}

// inNetNS runs fn on a thread in the network namespace at path.
func inNetNS(t *testing.T, path string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread dies with the goroutine
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		fn()
	}()
	<-done
}

// routeVia reports whether the namespace's kernel holds an IPv6 route via gw.
func routeVia(t *testing.T, netnsPath string, gw netip.Addr) bool {
	t.Helper()
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	routes, err := h.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if ip, ok := netip.AddrFromSlice(r.Gw); ok && ip == gw {
			return true
		}
	}
	return false
}

// sendFrame writes one Ethernet frame on eth0 of the namespace at netnsPath.
func sendFrame(t *testing.T, netnsPath string, frame []byte) {
	t.Helper()
	inNetNS(t, netnsPath, func() {
		proto := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(proto))
		if err != nil {
			t.Error(err)
			return
		}
		defer unix.Close(fd)
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Error(err)
			return
		}
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}); err != nil {
			t.Error(err)
		}
	})
}

// arpFrame is a broadcast ARP request from Ethernet source src whose
// sender is (sha, spa), asking for tpa.
func arpFrame(src, sha net.HardwareAddr, spa, tpa netip.Addr) []byte {
	f := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src...)
	f = append(f, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1)
	f = append(f, sha...)
	s, d := spa.As4(), tpa.As4()
	f = append(f, s[:]...)
	f = append(f, make([]byte, 6)...)
	return append(f, d[:]...)
}

// routerAdvert is an RA from (mac, src) to all nodes announcing prefix for
// SLAAC with a default-router lifetime, checksummed as a kernel requires.
func routerAdvert(mac net.HardwareAddr, src netip.Addr, prefix netip.Prefix) []byte {
	body := []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
	pi := []byte{3, 4, byte(prefix.Bits()), 0xc0}
	pi = binary.BigEndian.AppendUint32(pi, 86400)
	pi = binary.BigEndian.AppendUint32(pi, 14400)
	pi = append(pi, 0, 0, 0, 0)
	a := prefix.Addr().As16()
	body = append(append(body, pi...), a[:]...)
	body = append(append(body, 1, 1), mac...)
	s, d := src.As16(), netip.MustParseAddr("ff02::1").As16()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, 0, 0, 0, 0, 0, 58)
	binary.BigEndian.PutUint16(pseudo[32:], uint16(len(body)))
	binary.BigEndian.PutUint16(body[2:], icmpChecksum(append(pseudo, body...)))
	h := make([]byte, 40)
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(body)))
	h[6], h[7] = 58, 255
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	f := append([]byte{0x33, 0x33, 0, 0, 0, 1}, mac...)
	f = append(f, 0x86, 0xdd)
	return append(append(f, h...), body...)
}

func icmpChecksum(b []byte) uint16 {
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
