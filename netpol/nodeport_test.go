package netpol

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestNodePortAcrossTenants judges issue 24's suspicion that NodePort and
// LoadBalancer traffic, masqueraded to a node address, lets two tenants
// talk. A real node in namespaces: pod a (tenant X) connects to a NodePort
// on the node's address; iptables DNATs it to pod b (tenant Y) and SNATs it
// to a node address, as kube-proxy does. The fence at b's veth sees only
// that node address as the source: it cannot tell tenant X from an outside
// client or the kubelet. On c746b90 a node address outside cluster_cidrs
// was "outside the cluster" and passed for a tier of any egress (the
// suspicion held). Now this node's own addresses are in the cluster
// whatever cluster_cidrs say, owned by no tenant: they pass only as a
// shared service of the receiving pod's tier ("host ingress"). Another
// node's address is in the cluster when cluster_cidrs hold the node network.
func TestNodePortAcrossTenants(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables not installed: cannot build the NodePort")
	}
	a, b := n.addPod("npa", 1), n.addPod("npb", 3)
	const (
		nodeIP   = "192.0.2.10" // the node's address: outside the pod network
		gateway  = "10.213.0.254"
		nodePort = "30007"
	)
	node := netip.MustParsePrefix(nodeIP + "/32")
	gw := netip.MustParsePrefix(gateway + "/32")
	pods := netip.MustParsePrefix("10.213.0.0/16")
	nodeNet := netip.MustParsePrefix("192.0.2.0/24")

	// The node: the bridge is the pods' gateway, the node address is local
	// (on lo: the kernel here has no dummy links), and it forwards.
	addAddr(t, n.bridge, netip.MustParsePrefix(gateway+"/24"))
	addAddr(t, mustLink(t, "lo"), node)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*testPod{a, b} {
		h, err := netlink.NewHandleAt(p.ns)
		if err != nil {
			t.Fatal(err)
		}
		err = h.RouteAdd(&netlink.Route{LinkIndex: p.podIf, Gw: net.ParseIP(gateway)})
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	// kube-proxy's NodePort: DNAT to the endpoint, then masquerade.
	iptables(t, "-t", "nat", "-A", "PREROUTING", "-d", nodeIP, "-p", "tcp", "--dport", nodePort,
		"-j", "DNAT", "--to-destination", b.v4.String()+":7")

	m := n.open(ctx, nil)
	defer m.Close()
	if err := m.Register(ctx, n.endpoint(a, "tenant-x", func(e *Endpoint) { e.Tier = "standard" })); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(ctx, n.endpoint(b, "tenant-y", func(e *Endpoint) { e.Tier = "untrusted" })); err != nil {
		t.Fatal(err)
	}

	otherNode := "192.0.2.20"                                   // another node's address: not this node's
	viaNode := map[string][]netip.Prefix{"standard": {nodeNet}} // a's tier may call NodePorts
	for _, tc := range []struct {
		name    string
		snat    string // the masquerade source b sees
		cluster []netip.Prefix
		shared  map[string][]netip.Prefix
		reaches bool
	}{
		{
			// Fails on c746b90: this node's address was "outside the
			// cluster" unless cluster_cidrs held it.
			name: "this node's address, not in cluster_cidrs: in the cluster anyway", snat: nodeIP,
			cluster: []netip.Prefix{pods}, shared: viaNode,
		},
		{
			name: "another node's address, not in cluster_cidrs: seen as an outside client", snat: otherNode,
			cluster: []netip.Prefix{pods}, shared: viaNode, reaches: true,
		},
		{
			name: "another node's address, node network in cluster_cidrs", snat: otherNode,
			cluster: []netip.Prefix{pods, nodeNet}, shared: viaNode,
		},
		{
			name: "b's tier with host ingress", snat: nodeIP,
			cluster: []netip.Prefix{pods, nodeNet}, shared: map[string][]netip.Prefix{"standard": {nodeNet}, "untrusted": {node}},
			reaches: true,
		},
		{
			name: "masquerade to the bridge gateway, not a shared service of b's tier", snat: gateway,
			cluster: []netip.Prefix{pods}, shared: viaNode,
		},
		{
			name: "masquerade to the bridge gateway, listed for b's tier (kubelet probes)", snat: gateway,
			cluster: []netip.Prefix{pods}, shared: map[string][]netip.Prefix{"standard": {nodeNet}, "untrusted": {gw}},
			reaches: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.enter()
			iptables(t, "-t", "nat", "-F", "POSTROUTING")
			iptables(t, "-t", "nat", "-A", "POSTROUTING", "-d", b.v4.String(), "-p", "tcp", "--dport", "7",
				"-j", "SNAT", "--to-source", tc.snat)
			cfg := n.open(ctx, func(o *Options) { o.Cluster.ClusterCIDRs, o.Cluster.SharedServices = tc.cluster, tc.shared })
			cfg.Close()
			before := n.drops(m, "tenant-y")[ReasonCluster]
			var got bool
			wait := silenceWait
			if tc.reaches {
				wait = replyWait
			}
			n.inPod(a, func() {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(nodeIP, nodePort), wait)
				if err != nil {
					return
				}
				defer c.Close()
				got, _ = roundTrip(c, []byte("nodeport"), wait)
			})
			if got != tc.reaches {
				t.Errorf("a (tenant X) -> NodePort -> b (tenant Y), b seeing %s: reached %v, want %v", tc.snat, got, tc.reaches)
			}
			if after := n.drops(m, "tenant-y")[ReasonCluster]; !tc.reaches && after <= before {
				t.Errorf("tenant-y cluster drops did not grow (%d -> %d): b's fence did not drop the node's packets", before, after)
			}
		})
	}
}

func addAddr(t *testing.T, l netlink.Link, p netip.Prefix) {
	t.Helper()
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
}

// iptables runs iptables in the node's namespace: the calling goroutine's
// thread is in it and the child inherits it.
func iptables(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not supported") || strings.Contains(string(out), "Could not fetch rule set") {
			t.Skipf("iptables cannot NAT in a test namespace here: %s", out)
		}
		t.Fatalf("iptables %v: %v: %s", args, err, out)
	}
}
