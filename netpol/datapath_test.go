package netpol

import (
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// requireBPF skips unless the test can load BPF programs and maps.
func requireBPF(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_NET_ADMIN) to load the fence programs")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Skipf("cannot lift the memlock rlimit for BPF maps: %v", err)
	}
}

// Test fixture: the endpoint under test sits on the loopback interface,
// which BPF_PROG_TEST_RUN hands to the program as skb->ifindex.
const (
	loIfindex  = 1
	tenantA    = 1
	tenantB    = 2
	tierStd    = 1
	tierOther  = 2
	podV4      = "10.0.0.1"
	podV6      = "fd00::1"
	sameRDMAv4 = "10.0.0.2" // tenant A, RDMA granted
	sameV4     = "10.0.0.3" // tenant A, no RDMA grant
	otherV4    = "10.0.1.5" // tenant B
	remoteB4   = "10.9.3.4" // tenant B, remote range
	sameRDMAv6 = "fd00::2"
	otherV6    = "fd00::5"
	dnsV4      = "10.96.0.10"
	dnsV6      = "fd00:96::a"
	apiV4      = "192.0.2.10" // shared service outside the cluster CIDRs
	apiV6      = "2001:db8:ff::10"
	unownedV4  = "10.0.2.9" // in cluster, no tenant
	unownedV6  = "fd00::99"
	allowedV4  = "203.0.113.7"
	outsideV4  = "198.51.100.1"
	allowedV6  = "2001:db8:1::7"
	outsideV6  = "2001:db8:2::7"
)

func loadFixture(t testing.TB) *datapath {
	t.Helper()
	requireBPF(t)
	d, _, err := loadDatapath("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	owners := []struct {
		prefix string
		o      owner
	}{
		{sameRDMAv4 + "/32", owner{Tenant: tenantA, Flags: flagRDMA, Ifindex: 100}},
		{sameV4 + "/32", owner{Tenant: tenantA, Ifindex: 101}},
		{otherV4 + "/32", owner{Tenant: tenantB, Flags: flagRDMA, Ifindex: 102}},
		{"10.9.0.0/16", owner{Tenant: tenantB, Flags: flagRemote | flagRDMA}},
		{sameRDMAv6 + "/128", owner{Tenant: tenantA, Flags: flagRDMA, Ifindex: 100}},
		{otherV6 + "/128", owner{Tenant: tenantB, Flags: flagRDMA, Ifindex: 102}},
		{sameLL + "/128", owner{Tenant: tenantA, Ifindex: 100}},
		{otherLL + "/128", owner{Tenant: tenantB, Ifindex: 102}},
	}
	for _, o := range owners {
		if err := d.putOwner(netip.MustParsePrefix(o.prefix), o.o); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.replaceCluster([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}); err != nil {
		t.Fatal(err)
	}
	svc := []netip.Prefix{netip.MustParsePrefix(dnsV4 + "/32"), netip.MustParsePrefix(dnsV6 + "/128"),
		netip.MustParsePrefix(apiV4 + "/32"), netip.MustParsePrefix(apiV6 + "/128")}
	if err := scopedReplace(d.serviceV4, d.serviceV6, tierStd, svc); err != nil {
		t.Fatal(err)
	}
	return d
}

// podEndpoint is the endpoint under test with the given policy.
func podEndpoint(mod func(*Endpoint)) Endpoint {
	e := Endpoint{
		SandboxID: "sandbox-a", Ifindex: loIfindex, Tenant: "a", Tier: "standard",
		IPv4: netip.MustParseAddr(podV4), IPv6: netip.MustParseAddr(podV6),
	}
	fixtureL2(&e)
	if mod != nil {
		mod(&e)
	}
	return e
}

func rdma(e *Endpoint)   { e.AllowRDMA = true }
func noMeta(e *Endpoint) { e.DenyMetadata, e.MetadataCIDRs = true, testMetadataCIDRs() }
func onlyV6(e *Endpoint) { e.IPv4 = netip.Addr{} }
func onlyV4(e *Endpoint) { e.IPv6 = netip.Addr{} }
func restrict(e *Endpoint) {
	e.EgressCIDRs = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:1::/48")}
}

type verdictCase struct {
	name   string
	dir    Direction
	ep     func(*Endpoint)
	frame  []byte
	reason Reason // meaningful when drop
	drop   bool
	// short: the kernel's test runner may refuse the frame (EINVAL) because
	// it is shorter than an L3 header; TestFenceVeth sends such
	// frames through a real veth instead.
	short bool
}

func verdictCases() []verdictCase {
	pass := func(name string, dir Direction, ep func(*Endpoint), frame []byte) verdictCase {
		return verdictCase{name: name, dir: dir, ep: ep, frame: frame}
	}
	drop := func(name string, dir Direction, ep func(*Endpoint), frame []byte, r Reason) verdictCase {
		return verdictCase{name: name, dir: dir, ep: ep, frame: frame, drop: true, reason: r}
	}
	short := func(c verdictCase) verdictCase { c.short = true; return c }
	roce := udp(49152, roceV2Port)
	return []verdictCase{
		// IPv4 tenancy.
		pass("v4 same tenant tcp", FromPod, nil, ipv4(podV4, sameV4, 6, tcp(40000, 80), v4opts{})),
		pass("v4 same tenant udp to pod", ToPod, nil, ipv4(sameV4, podV4, 17, udp(53, 40000), v4opts{})),
		pass("v4 same tenant icmp", FromPod, nil, ipv4(podV4, sameRDMAv4, 1, icmpEcho(), v4opts{})),
		drop("v4 other tenant tcp", FromPod, nil, ipv4(podV4, otherV4, 6, tcp(40000, 80), v4opts{}), ReasonTenant),
		drop("v4 other tenant icmp to pod", ToPod, nil, ipv4(otherV4, podV4, 1, icmpEcho(), v4opts{}), ReasonTenant),
		drop("v4 remote tenant range", FromPod, nil, ipv4(podV4, remoteB4, 17, udp(1, 2), v4opts{}), ReasonTenant),
		drop("v4 other tenant non-first fragment", FromPod, nil, ipv4(podV4, otherV4, 17, []byte{1, 2, 3, 4}, v4opts{fragOff: 10}), ReasonTenant),
		pass("v4 ip options", FromPod, nil, ipv4(podV4, sameV4, 6, tcp(1, 2), v4opts{ihl: 7})),
		// Anti-spoof.
		drop("v4 spoofed source", FromPod, nil, ipv4(sameV4, otherV4, 6, tcp(1, 2), v4opts{}), ReasonSpoof),
		drop("v4 spoofed same-tenant source", FromPod, nil, ipv4(sameV4, sameRDMAv4, 6, tcp(1, 2), v4opts{}), ReasonSpoof),
		drop("v4 from v6-only pod", FromPod, onlyV6, ipv4(podV4, sameV4, 6, tcp(1, 2), v4opts{}), ReasonSpoof),
		drop("v6 spoofed source", FromPod, nil, ipv6(sameRDMAv6, otherV6, 6, tcp(1, 2)), ReasonSpoof),
		drop("v6 from v4-only pod", FromPod, onlyV4, ipv6(podV6, sameRDMAv6, 6, tcp(1, 2)), ReasonSpoof),
		drop("v6 link-local source, not ND", FromPod, nil, ipv6("fe80::1", "fe80::2", 17, udp(1, 2)), ReasonSpoof),
		// IPv6 tenancy, with and without extension headers.
		pass("v6 same tenant", FromPod, nil, ipv6(podV6, sameRDMAv6, 6, tcp(1, 2))),
		drop("v6 other tenant", FromPod, nil, ipv6(podV6, otherV6, 6, tcp(1, 2)), ReasonTenant),
		drop("v6 other tenant to pod", ToPod, nil, ipv6(otherV6, podV6, 58, icmp6(128, "")), ReasonTenant),
		drop("v6 other tenant behind ext headers", FromPod, nil, ipv6(podV6, otherV6, 17, udp(1, 2), ext{kind: 0}, ext{kind: 60}), ReasonTenant),
		drop("v6 ext header chain too long", FromPod, nil, ipv6(podV6, sameRDMAv6, 17, udp(1, 2), ext{kind: 0}, ext{kind: 60}, ext{kind: 43}, ext{kind: 60}, ext{kind: 60}), ReasonMalformed),
		drop("v6 link-local peer to pod", ToPod, nil, ipv6("fe80::5", podV6, 17, udp(1, 2)), ReasonCluster),
		// RoCEv2.
		drop("rocev2 same tenant without grant", FromPod, nil, ipv4(podV4, sameRDMAv4, 17, roce, v4opts{}), ReasonRDMA),
		pass("rocev2 same tenant both granted", FromPod, rdma, ipv4(podV4, sameRDMAv4, 17, roce, v4opts{})),
		drop("rocev2 same tenant peer not granted", FromPod, rdma, ipv4(podV4, sameV4, 17, roce, v4opts{}), ReasonRDMA),
		drop("rocev2 other tenant granted", FromPod, rdma, ipv4(podV4, otherV4, 17, roce, v4opts{}), ReasonTenant),
		drop("rocev2 to unowned address", FromPod, rdma, ipv4(podV4, outsideV4, 17, roce, v4opts{}), ReasonRDMA),
		drop("rocev2 v6 to pod other tenant", ToPod, rdma, ipv6(otherV6, podV6, 17, roce), ReasonTenant),
		pass("rocev2 v6 same tenant both granted", ToPod, rdma, ipv6(sameRDMAv6, podV6, 17, roce)),
		drop("rocev2 v6 behind fragment header", FromPod, nil, ipv6(podV6, sameRDMAv6, 17, roce, ext{kind: 44}), ReasonRDMA),
		pass("udp 4791 as source port only", FromPod, nil, ipv4(podV4, sameRDMAv4, 17, udp(roceV2Port, 5000), v4opts{})),
		// Metadata.
		drop("metadata v4 denied", FromPod, noMeta, ipv4(podV4, "169.254.169.254", 6, tcp(1, 80), v4opts{}), ReasonMetadata),
		drop("metadata v6 denied", FromPod, noMeta, ipv6(podV6, "fd00:ec2::254", 6, tcp(1, 80)), ReasonMetadata),
		drop("metadata v4 reply denied", ToPod, noMeta, ipv4("169.254.169.254", podV4, 6, tcp(80, 1), v4opts{}), ReasonMetadata),
		pass("metadata v4 allowed by tier", FromPod, nil, ipv4(podV4, "169.254.169.254", 6, tcp(1, 80), v4opts{})),
		// Shared services, unowned cluster addresses, egress.
		pass("dns v4 shared service", FromPod, restrict, ipv4(podV4, dnsV4, 17, udp(1, 53), v4opts{})),
		pass("dns v6 shared service", ToPod, restrict, ipv6(dnsV6, podV6, 17, udp(53, 1))),
		pass("shared service outside the cluster v4, restricted", FromPod, restrict, ipv4(podV4, apiV4, 6, tcp(1, 443), v4opts{})),
		pass("shared service outside the cluster v6, restricted", ToPod, restrict, ipv6(apiV6, podV6, 6, tcp(443, 1))),
		pass("shared service outside the cluster v4", FromPod, nil, ipv4(podV4, apiV4, 6, tcp(1, 443), v4opts{})),
		drop("unowned cluster v4", FromPod, nil, ipv4(podV4, unownedV4, 6, tcp(1, 2), v4opts{}), ReasonCluster),
		drop("unowned cluster v6", FromPod, nil, ipv6(podV6, unownedV6, 6, tcp(1, 2)), ReasonCluster),
		pass("egress unrestricted", FromPod, nil, ipv4(podV4, outsideV4, 6, tcp(1, 443), v4opts{})),
		pass("egress allow-listed v4", FromPod, restrict, ipv4(podV4, allowedV4, 6, tcp(1, 443), v4opts{})),
		drop("egress not allow-listed v4", FromPod, restrict, ipv4(podV4, outsideV4, 6, tcp(1, 443), v4opts{}), ReasonEgress),
		pass("egress allow-listed v6 reply", ToPod, restrict, ipv6(allowedV6, podV6, 6, tcp(443, 1))),
		drop("egress not allow-listed v6", FromPod, restrict, ipv6(podV6, outsideV6, 6, tcp(1, 443)), ReasonEgress),
		drop("inbound from outside, restricted", ToPod, restrict, ipv4(outsideV4, podV4, 6, tcp(1, 22), v4opts{}), ReasonEgress),
		// ARP and neighbour discovery.
		pass("arp request", FromPod, nil, arp(podV4, sameV4)),
		pass("arp probe", FromPod, nil, arp("0.0.0.0", podV4)),
		drop("arp spoofed sender", FromPod, nil, arp(otherV4, sameV4), ReasonSpoof),
		pass("arp to pod from same tenant", ToPod, nil, arp(sameV4, podV4)),
		pass("arp to pod from the node", ToPod, nil, arp("10.0.0.254", podV4)),
		pass("nd neighbour solicitation link-local", FromPod, nil, nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2")),
		// Link-layer address options from the pod carry its own MAC.
		pass("nd solicitation with the pod's source link-layer option", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), lla(1, podMAC))),
		pass("nd advertisement with the pod's target link-layer option", FromPod, nil, ndOpts(nd6(podV6, "fe80::2", 136, podV6), lla(2, podMAC))),
		pass("nd router solicitation with the pod's source link-layer option", FromPod, nil, ndOpts(nd6(podLL, "ff02::2", 133, ""), lla(1, podMAC))),
		pass("nd solicitation with a nonce and the pod's link-layer option", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), ndOpt(14, 1, 8), lla(1, podMAC))),
		pass("nd solicitation with bytes past its payload", FromPod, nil, trailer(ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), lla(1, podMAC)), 6)),
		pass("nd advertisement to same tenant with the pod's link-layer option", FromPod, nil, ndOpts(nd6(podV6, sameRDMAv6, 136, podV6), lla(2, podMAC))),
		drop("nd solicitation with another pod's source link-layer option", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), lla(1, otherMAC)), ReasonND),
		drop("nd advertisement with another pod's target link-layer option", FromPod, nil, ndOpts(nd6(podV6, "fe80::2", 136, podV6), lla(2, otherMAC)), ReasonND),
		drop("nd advertisement to same tenant with another pod's link-layer option", FromPod, nil, ndOpts(nd6(podV6, sameRDMAv6, 136, podV6), lla(2, otherMAC)), ReasonND),
		drop("nd router solicitation with another pod's link-layer option", FromPod, nil, ndOpts(nd6(podLL, "ff02::2", 133, ""), lla(1, otherMAC)), ReasonND),
		drop("nd dad with another pod's link-layer option", FromPod, nil, ndOpts(nd6("::", "ff02::1:ff00:1", 135, podV6), lla(1, otherMAC)), ReasonND),
		drop("nd link-layer option after a nonce carries another MAC", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), ndOpt(14, 1, 8), lla(1, otherMAC)), ReasonND),
		drop("nd second link-layer option carries another MAC", FromPod, nil, ndOpts(nd6(podV6, "fe80::2", 136, podV6), lla(2, podMAC), lla(2, otherMAC)), ReasonND),
		drop("nd option of zero length", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), ndOpt(14, 0, 8), lla(1, otherMAC)), ReasonND),
		drop("nd link-layer option of two units", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), append(append([]byte{1, 2}, otherMAC...), make([]byte, 8)...)), ReasonND),
		drop("nd option past the message end", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"), ndOpt(14, 2, 8)), ReasonND),
		drop("nd more options than the walk's bound", FromPod, nil, ndOpts(nd6(podLL, "ff02::1:ff00:2", 135, "fd00::2"),
			ndOpt(14, 1, 8), ndOpt(14, 1, 8), ndOpt(14, 1, 8), ndOpt(14, 1, 8), ndOpt(14, 1, 8), ndOpt(14, 1, 8), lla(1, otherMAC)), ReasonND),
		pass("nd dad from unspecified", FromPod, nil, nd6("::", "ff02::1:ff00:1", 135, podV6)),
		pass("nd advertisement own address", FromPod, nil, nd6(podV6, "fe80::2", 136, podV6)),
		pass("nd advertisement own link-local to all nodes", FromPod, nil, nd6(podLL, "ff02::1", 136, podLL)),
		pass("nd router solicitation", FromPod, nil, nd6(podLL, "ff02::2", 133, "")),
		pass("nd unicast solicitation same tenant", FromPod, nil, nd6(podV6, sameRDMAv6, 135, sameRDMAv6)),
		drop("nd advertisement claims other pod", FromPod, nil, nd6(podV6, "fe80::2", 136, otherV6), ReasonSpoof),
		drop("nd from spoofed global source", FromPod, nil, nd6(otherV6, "ff02::1", 135, podV6), ReasonSpoof),
		pass("nd router advertisement to pod", ToPod, nil, nd6(routerLL, "ff02::1", 134, "")),
		pass("nd redirect to pod from router", ToPod, nil, nd6(routerLL, podLL, 137, sameRDMAv6)),
		pass("nd solicitation to pod from same tenant", ToPod, nil, nd6(sameLL, "ff02::1:ff00:1", 135, podV6)),
		pass("nd solicitation to pod from the node", ToPod, nil, nd6(routerLL, podV6, 135, podV6)),
		pass("nd advertisement to pod from the node", ToPod, nil, nd6(nodeV6, podLL, 136, nodeV6)),
		pass("mld report", FromPod, nil, hopLimit(1, ipv6(podLL, "ff02::16", 58, icmp6(143, ""), ext{kind: 0}))),
		pass("mld query to pod from router", ToPod, nil, hopLimit(1, ipv6(routerLL, "ff02::1", 58, icmp6(130, ""), ext{kind: 0}))),
		// Issue 13: layer 2 and neighbour discovery attacks.
		drop("nd solicitation to other tenant carries data", FromPod, nil, nd6(podV6, otherV6, 135, otherV6), ReasonTenant),
		drop("nd advertisement to other tenant carries data", FromPod, nil, nd6(podV6, otherV6, 136, podV6), ReasonTenant),
		drop("nd solicitation to pod from other tenant", ToPod, nil, nd6(otherV6, "ff02::1:ff00:1", 135, podV6), ReasonTenant),
		drop("nd advertisement to pod from other tenant link-local", ToPod, nil, nd6(otherLL, podLL, 136, otherLL), ReasonTenant),
		drop("nd solicitation to pod for another address", ToPod, nil, nd6(sameLL, "ff02::1:ff00:5", 135, otherV6), ReasonND),
		drop("nd dad to pod claims its address", ToPod, nil, nd6("::", "ff02::1:ff00:1", 135, podV6), ReasonND),
		drop("nd router advertisement from pod", FromPod, nil, nd6(podLL, "ff02::1", 134, ""), ReasonND),
		drop("nd redirect from pod", FromPod, nil, nd6(podLL, "fe80::2", 137, sameRDMAv6), ReasonND),
		drop("nd router advertisement to pod from other pod", ToPod, nil, nd6(otherLL, "ff02::1", 134, ""), ReasonND),
		drop("nd router advertisement to pod from same tenant", ToPod, nil, nd6(sameLL, "ff02::1", 134, ""), ReasonND),
		drop("nd redirect to pod from other pod", ToPod, nil, nd6(sameLL, podLL, 137, otherV6), ReasonND),
		drop("nd router solicitation to pod", ToPod, nil, nd6(sameLL, "ff02::2", 133, ""), ReasonND),
		drop("nd solicitation to metadata", FromPod, noMeta, nd6(podV6, "fd00:ec2::254", 135, "fd00:ec2::254"), ReasonMetadata),
		drop("nd solicitation to unowned cluster address", FromPod, nil, nd6(podV6, unownedV6, 135, unownedV6), ReasonCluster),
		drop("nd solicitation past egress allow-list", FromPod, restrict, nd6(podV6, outsideV6, 135, outsideV6), ReasonEgress),
		drop("nd advertisement claims a link-local not the pod's", FromPod, nil, nd6(podLL, "ff02::1", 136, otherLL), ReasonSpoof),
		drop("nd solicitation from a link-local not the pod's", FromPod, nil, nd6(otherLL, "ff02::1:ff00:2", 135, sameRDMAv6), ReasonSpoof),
		drop("nd hop limit below 255", FromPod, nil, hopLimit(64, nd6(podLL, "ff02::1:ff00:2", 135, sameRDMAv6)), ReasonND),
		drop("nd hop limit below 255 to pod", ToPod, nil, hopLimit(254, nd6(routerLL, "ff02::1", 134, "")), ReasonND),
		drop("nd to a group that is not neighbour discovery", FromPod, nil, nd6(podLL, "ff05::1", 135, sameRDMAv6), ReasonND),
		drop("mld report to pod", ToPod, nil, hopLimit(1, ipv6(sameLL, "ff02::16", 58, icmp6(143, ""), ext{kind: 0})), ReasonND),
		drop("mld query from pod", FromPod, nil, hopLimit(1, ipv6(podLL, "ff02::1", 58, icmp6(130, ""), ext{kind: 0})), ReasonND),
		drop("mld from a link-local not the pod's", FromPod, nil, hopLimit(1, ipv6(otherLL, "ff02::16", 58, icmp6(143, ""), ext{kind: 0})), ReasonSpoof),
		drop("mld to a unicast address", FromPod, nil, hopLimit(1, ipv6(podLL, otherLL, 58, icmp6(143, ""), ext{kind: 0})), ReasonND),
		drop("frame from another pod's MAC", FromPod, nil, fromMAC(otherMAC, ipv4(podV4, sameV4, 6, tcp(1, 2), v4opts{})), ReasonSpoof),
		drop("arp probe from another pod's MAC", FromPod, nil, fromMAC(otherMAC, arpFrom(otherMAC, "0.0.0.0", otherV4)), ReasonSpoof),
		drop("arp with another pod's sender MAC", FromPod, nil, arpFrom(otherMAC, "0.0.0.0", otherV4), ReasonSpoof),
		drop("nd from another pod's MAC", FromPod, nil, fromMAC(otherMAC, nd6("::", "ff02::1:ff00:5", 135, otherV6)), ReasonSpoof),
		drop("arp to pod from other tenant", ToPod, nil, arp(otherV4, podV4), ReasonTenant),
		drop("arp to pod for another address", ToPod, nil, arp(sameV4, otherV4), ReasonDst),
		drop("v4 to pod for another address", ToPod, nil, ipv4(sameV4, otherV4, 6, tcp(1, 2), v4opts{}), ReasonDst),
		drop("v6 to pod for another address", ToPod, nil, ipv6(sameRDMAv6, otherV6, 6, tcp(1, 2)), ReasonDst),
		drop("v4 to a v6-only pod", ToPod, onlyV6, ipv4(sameV4, podV4, 6, tcp(1, 2), v4opts{}), ReasonDst),
		pass("v4 broadcast to pod", ToPod, nil, ipv4(sameV4, "255.255.255.255", 17, udp(1, 2), v4opts{})),
		pass("v4 multicast to pod", ToPod, nil, ipv4(sameV4, "224.0.0.251", 17, udp(5353, 5353), v4opts{})),
		pass("v6 to pod's link-local address", ToPod, nil, ipv6(sameRDMAv6, podLL, 6, tcp(1, 2))),
		pass("v6 multicast to pod", ToPod, nil, ipv6(sameRDMAv6, "ff02::fb", 17, udp(5353, 5353))),
		// Other ethertypes and truncated frames.
		drop("vlan tagged frame", FromPod, nil, ether(0x8100, make([]byte, 46)), ReasonEthertype),
		drop("unknown ethertype to pod", ToPod, nil, ether(0x88b5, make([]byte, 46)), ReasonEthertype),
		short(drop("truncated ipv4 header", FromPod, nil, ether(ethTypeIPv4, []byte{0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6}), ReasonMalformed)),
		short(drop("ethernet header only", ToPod, nil, ether(ethTypeIPv4, nil), ReasonMalformed)),
		short(drop("truncated ipv6 header", FromPod, nil, ipv6(podV6, sameRDMAv6, 6, nil)[:ethHdrLen+30], ReasonMalformed)),
		drop("truncated ipv6 extension header", FromPod, nil, ipv6(podV6, sameRDMAv6, 6, nil, ext{kind: 0})[:ethHdrLen+ipv6HdrLen+4], ReasonMalformed),
		drop("truncated neighbour advertisement", FromPod, nil, nd6(podV6, "fe80::2", 136, podV6)[:ethHdrLen+ipv6HdrLen+12], ReasonMalformed),
		drop("arp of another hardware size", FromPod, nil, func() []byte { f := arp(podV4, sameV4); f[ethHdrLen+4] = 8; return f }(), ReasonMalformed),
		drop("truncated udp header", FromPod, nil, ipv4(podV4, sameRDMAv4, 17, []byte{0x12}, v4opts{}), ReasonMalformed),
		drop("truncated arp", FromPod, nil, arp(podV4, sameV4)[:ethHdrLen+20], ReasonMalformed),
		drop("ipv4 wrong version", FromPod, nil, ipv4(podV4, sameV4, 6, tcp(1, 2), v4opts{version: 6}), ReasonMalformed),
		drop("ipv4 header length too small", FromPod, nil, ipv4(podV4, sameV4, 6, tcp(1, 2), v4opts{ihl: 4}), ReasonMalformed),
		drop("udp header missing", FromPod, nil, ipv4(podV4, sameV4, 17, nil, v4opts{}), ReasonMalformed),
		drop("ip options past the end", FromPod, nil, ipv4(podV4, sameV4, 6, nil, v4opts{ihl: 15})[:ethHdrLen+24], ReasonMalformed),
	}
}

func TestVerdicts(t *testing.T) {
	d := loadFixture(t)
	tenants := map[string]uint32{"a": tenantA}
	for _, tc := range verdictCases() {
		t.Run(tc.name, func(t *testing.T) { checkVerdict(t, d, tenants, tc) })
	}
}

// checkVerdict installs the case's endpoint on the fixture d, runs its
// frame through BPF_PROG_TEST_RUN and checks the verdict and that exactly
// the right counter grew.
func checkVerdict(t *testing.T, d *datapath, tenants map[string]uint32, tc verdictCase) {
	t.Helper()
	e := podEndpoint(tc.ep)
	if err := e.validate(); err != nil {
		t.Fatal(err)
	}
	if err := d.install(newRecord(&e, loIfindex, "lo", tenants[e.Tenant], tierStd)); err != nil {
		t.Fatal(err)
	}
	before, err := d.dropCounts(tenantA)
	if err != nil {
		t.Fatal(err)
	}
	ret, err := d.program(tc.dir).Run(&ebpf.RunOptions{Data: tc.frame})
	if tc.short && errors.Is(err, unix.EINVAL) {
		t.Skipf("the kernel's BPF_PROG_TEST_RUN refuses a %d-byte frame; TestFenceVeth/spoofed_and_truncated_frames covers it", len(tc.frame))
	}
	if err != nil {
		t.Fatal(err)
	}
	after, err := d.dropCounts(tenantA)
	if err != nil {
		t.Fatal(err)
	}
	want := uint32(verdictNext & 0xffffffff)
	if tc.drop {
		want = verdictDrop
	}
	if ret != want {
		t.Fatalf("%s: verdict %d, want %d (counters %v)", tc.dir, int32(ret), int32(want), diff(before, after))
	}
	for _, r := range Reasons() {
		got := after[r] - before[r]
		var wantN uint64
		if tc.drop && r == tc.reason {
			wantN = 1
		}
		if got != wantN {
			t.Errorf("counter %s grew by %d, want %d", r, got, wantN)
		}
	}
}

func diff(before, after map[Reason]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for r, n := range after {
		if n != before[r] {
			out[r.String()] = n - before[r]
		}
	}
	return out
}

// An interface Bulkhead does not manage is untouched: with no endpoint entry
// even a spoofed, cross-tenant frame goes on to the next program.
func TestUnmanagedInterfacePasses(t *testing.T) {
	d := loadFixture(t)
	frames := map[string][]byte{
		"spoofed cross-tenant": ipv4(otherV4, sameV4, 6, tcp(1, 2), v4opts{}),
		"rocev2":               ipv4(podV4, otherV4, 17, udp(1, roceV2Port), v4opts{}),
		"truncated":            ipv4(podV4, sameV4, 17, nil, v4opts{}),
		"unknown ethertype":    ether(0x88b5, make([]byte, 46)),
	}
	for name, frame := range frames {
		for _, dir := range []Direction{FromPod, ToPod} {
			t.Run(name+"/"+dir.String(), func(t *testing.T) {
				ret, err := d.program(dir).Run(&ebpf.RunOptions{Data: frame})
				if err != nil {
					t.Fatal(err)
				}
				if int32(ret) != verdictNext {
					t.Fatalf("verdict %d on an unmanaged interface, want TCX_NEXT", int32(ret))
				}
			})
		}
	}
}

// After remove, nothing of the endpoint is left in the maps.
func TestInstallRemoveLeavesNothing(t *testing.T) {
	d := loadFixture(t)
	e := podEndpoint(restrict)
	r := newRecord(&e, loIfindex, "lo", tenantA, tierStd)
	if err := d.install(r); err != nil {
		t.Fatal(err)
	}
	if err := d.remove(loIfindex, r.value); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := d.endpoint(loIfindex); err != nil || ok {
		t.Fatalf("endpoint entry still present (err %v)", err)
	}
	for _, a := range []string{podV4 + "/32", podV6 + "/128"} {
		if _, ok, err := d.ownerOf(netip.MustParsePrefix(a)); err != nil || ok {
			t.Errorf("owner of %s still present (err %v)", a, err)
		}
	}
	left, err := scopedList(d.egressV4, d.egressV6, loIfindex)
	if err != nil || len(left) != 0 {
		t.Errorf("egress entries left: %v (err %v)", left, err)
	}
	// An address re-assigned to another interface survives the old one's removal.
	if err := d.putOwner(netip.MustParsePrefix(podV4+"/32"), owner{Tenant: tenantB, Ifindex: 7}); err != nil {
		t.Fatal(err)
	}
	if err := d.remove(loIfindex, r.value); err != nil {
		t.Fatal(err)
	}
	if o, ok, _ := d.ownerOf(netip.MustParsePrefix(podV4 + "/32")); !ok || o.Ifindex != 7 {
		t.Errorf("re-assigned address lost: %+v %v", o, ok)
	}
}

func TestReasonString(t *testing.T) {
	for _, tc := range []struct {
		r    Reason
		want string
	}{{ReasonMalformed, "malformed"}, {ReasonCluster, "cluster"}, {ReasonND, "nd"}, {ReasonDst, "dst"}, {Reason(42), "reason(42)"}} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("%d: %q, want %q", tc.r, got, tc.want)
		}
	}
}

// The programs assemble without the kernel: every jump and map reference
// resolves and no label is defined twice. Runs unprivileged.
func TestProgramsAssemble(t *testing.T) {
	maps := mapSpecs(false)
	for name, spec := range programSpecs() {
		t.Run(name, func(t *testing.T) {
			syms, err := spec.Instructions.SymbolOffsets()
			if err != nil {
				t.Fatal(err)
			}
			for ref := range spec.Instructions.ReferenceOffsets() {
				if _, ok := syms[ref]; ok {
					continue
				}
				if _, ok := maps[ref]; ok {
					continue
				}
				t.Errorf("unresolved reference %q", ref)
			}
			if n := len(spec.Instructions); n > 4096 {
				t.Errorf("%d instructions: over the unprivileged limit", n)
			}
		})
	}
}

// Single addresses live in the exact-match owner hashes, ranges in the
// tenant tries; owners lists both, and deleteOwner also clears a single
// address that a fence pinned before the hashes existed kept in a trie.
func TestOwnerHashAndTrie(t *testing.T) {
	d := loadFixture(t)
	for _, tc := range []struct {
		prefix string
		hash   bool
	}{
		{"10.0.7.1/32", true},
		{"10.7.0.0/16", false},
		{"fd00::71/128", true},
		{"fe80::71/128", true},
		{"fd07::/64", false},
	} {
		t.Run(tc.prefix, func(t *testing.T) {
			p := netip.MustParsePrefix(tc.prefix)
			o := owner{Tenant: tenantB, Ifindex: 9}
			if err := d.putOwner(p, o); err != nil {
				t.Fatal(err)
			}
			var got owner
			var err error
			switch {
			case p.Addr().Is4() && tc.hash:
				err = d.ownerV4.Lookup(p.Addr().As4(), &got)
			case tc.hash:
				err = d.ownerV6.Lookup(p.Addr().As16(), &got)
			case p.Addr().Is4():
				err = d.tenantV4.Lookup(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}, &got)
			default:
				err = d.tenantV6.Lookup(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}, &got)
			}
			if err != nil || got != o {
				t.Fatalf("stored %+v (err %v), want %+v in the hash=%v map", got, err, o, tc.hash)
			}
			all, err := d.owners()
			if err != nil || all[p] != o {
				t.Fatalf("owners()[%s] = %+v (err %v)", p, all[p], err)
			}
			if err := d.deleteOwner(p); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := d.ownerOf(p); err != nil || ok {
				t.Fatalf("still owned after delete (err %v)", err)
			}
			if !tc.hash {
				return
			}
			// A pre-hash fence's entry: the address in the trie.
			if p.Addr().Is4() {
				err = d.tenantV4.Update(lpmKeyV4{32, p.Addr().As4()}, o, ebpf.UpdateAny)
			} else {
				err = d.tenantV6.Update(lpmKeyV6{128, p.Addr().As16()}, o, ebpf.UpdateAny)
			}
			if err != nil {
				t.Fatal(err)
			}
			if all, _ := d.owners(); all[p] != o {
				t.Fatalf("owners() misses the trie's %s", p)
			}
			if err := d.deleteOwner(p); err != nil {
				t.Fatal(err)
			}
			if all, _ := d.owners(); all[p] == o {
				t.Fatalf("the trie's %s survived deleteOwner", p)
			}
		})
	}
}
