package netpol

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// Another node's addresses, outside the fixture's cluster CIDRs (10.0.0.0/8,
// fd00::/8), as they are when cluster_cidrs leave out the node network.
const (
	otherNode4 = "198.18.0.20"
	otherNode6 = "2001:db8:20::20"
)

// otherNodeFrames are the packets a pod exchanges with another node's
// addresses, both ways, one family each.
func otherNodeFrames() map[string][]byte {
	return map[string][]byte{
		"v4 from pod": ipv4(podV4, otherNode4, 6, tcp(40000, 10250), v4opts{}),
		"v4 to pod":   ipv4(otherNode4, podV4, 6, tcp(30007, 8080), v4opts{}),
		"v6 from pod": ipv6(podV6, otherNode6, 6, tcp(40000, 10250)),
		"v6 to pod":   ipv6(otherNode6, podV6, 17, udp(53, 40000)),
	}
}

// clusterWith is the fixture's ClusterConfig with extra cluster CIDRs and
// the tier "host-ingress" listing the other node's addresses as shared
// services.
func clusterWith(extra ...netip.Prefix) *ClusterConfig {
	return &ClusterConfig{
		ClusterCIDRs: append([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}, extra...),
		SharedServices: map[string][]netip.Prefix{
			"host-ingress": {netip.MustParsePrefix(otherNode4 + "/32"), netip.MustParsePrefix(otherNode6 + "/128")},
		},
	}
}

// reconfigure opens the fixture's fence again with c, as a restarted agent
// or shim does, and closes it.
func (f *remoteFixture) reconfigure(c *ClusterConfig) {
	f.t.Helper()
	m, err := Open(context.Background(), Options{PinDir: f.m.opts.PinDir, LockPath: f.m.opts.LockPath, Cluster: c})
	if err != nil {
		f.t.Fatal(err)
	}
	m.Close()
}

// Another node's address is outside the cluster (rule 15: pass) until the
// agent names it; then it is in the cluster and no tenant's (rule 14:
// cluster) unless the tier lists it as a shared service, through a new
// ClusterConfig, until the agent drops it.
func TestRemoteNodeVerdicts(t *testing.T) {
	for _, tc := range []struct {
		tier   string
		shared bool // the tier lists the node's addresses as shared services
	}{
		{tier: "standard"},
		{tier: "untrusted"},
		{tier: "host-ingress", shared: true},
	} {
		t.Run(tc.tier, func(t *testing.T) {
			f := newRemoteFixture(t, tc.tier)
			ctx := context.Background()
			f.reconfigure(clusterWith())
			nodes := []netip.Addr{netip.MustParseAddr(otherNode4), netip.MustParseAddr(otherNode6)}
			steps := []struct {
				name   string
				do     func() error
				inside bool // the addresses are in the cluster after the step
			}{
				{name: "before the agent names them: outside the cluster", do: func() error { return nil }},
				{name: "SetRemoteNodes", do: func() error { return f.m.SetRemoteNodes(ctx, nodes) }, inside: true},
				{name: "SetRemoteNodes again, unchanged", do: func() error { return f.m.SetRemoteNodes(ctx, nodes) }, inside: true},
				{
					name:   "a restarted agent opens the fence with a new ClusterConfig",
					do:     func() error { f.reconfigure(clusterWith(netip.MustParsePrefix("172.16.0.0/12"))); return nil },
					inside: true,
				},
				{name: "SetRemoteNodes(nil): outside again", do: func() error { return f.m.SetRemoteNodes(ctx, nil) }},
			}
			for _, s := range steps {
				if err := s.do(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				f.expectFrames(s.name, otherNodeFrames(), s.inside && !tc.shared, ReasonCluster)
				want := []netip.Addr(nil)
				if s.inside {
					want = nodes
				}
				got, err := f.m.RemoteNodes()
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: RemoteNodes = %v, want %v", s.name, got, want)
				}
			}
		})
	}
}

// The learned node addresses and the configured ranges are kept apart: a
// ClusterConfig leaves the learned ones, SetRemoteNodes leaves the
// configured ones, and an address both name stays until both drop it.
func TestRemoteNodesBeside(t *testing.T) {
	f := newRemoteFixture(t, "standard")
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	both := pfx("198.18.0.30/32") // configured, and the agent names it too
	inRange := netip.MustParseAddr("10.200.0.1")
	f.reconfigure(clusterWith(both))

	entries := func() map[netip.Prefix]uint8 {
		t.Helper()
		got, err := f.m.dp.clusterEntries()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	nodes := []netip.Addr{netip.MustParseAddr(otherNode4), netip.MustParseAddr(otherNode6), both.Addr(), inRange}
	if err := f.m.SetRemoteNodes(ctx, nodes); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p    netip.Prefix
		want uint8
	}{
		{pfx("10.0.0.0/8"), clusterConfigured},
		{pfx("fd00::/8"), clusterConfigured},
		{both, clusterConfigured | clusterNode},
		{pfx(otherNode4 + "/32"), clusterNode},
		{pfx(otherNode6 + "/128"), clusterNode},
		// Inside 10.0.0.0/8, but its own entry: a narrower ClusterConfig
		// must not let it out before the agent's next call.
		{pfx("10.200.0.1/32"), clusterNode},
	} {
		if got := entries()[tc.p]; got != tc.want {
			t.Errorf("after SetRemoteNodes: cluster entry %s = %#x, want %#x", tc.p, got, tc.want)
		}
	}

	// The configured ranges narrow: what the agent named stays in.
	f.reconfigure(&ClusterConfig{ClusterCIDRs: []netip.Prefix{pfx("fd00::/8")}})
	got := entries()
	for p, want := range map[netip.Prefix]uint8{
		pfx("10.0.0.0/8"): 0, both: clusterNode, pfx("10.200.0.1/32"): clusterNode, pfx("fd00::/8"): clusterConfigured,
	} {
		if got[p] != want {
			t.Errorf("after a narrower ClusterConfig: cluster entry %s = %#x, want %#x", p, got[p], want)
		}
	}
	r, err := OpenReadOnly(f.m.opts.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	slices.SortFunc(nodes, netip.Addr.Compare)
	if got, err := r.RemoteNodes(); err != nil || !slices.Equal(got, nodes) {
		t.Errorf("Reader.RemoteNodes = %v, %v, want %v", got, err, nodes)
	}

	// The agent lets go: the configured entries are untouched.
	f.reconfigure(clusterWith(both))
	if err := f.m.SetRemoteNodes(ctx, nil); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Prefix]uint8{pfx("10.0.0.0/8"): clusterConfigured, pfx("fd00::/8"): clusterConfigured, both: clusterConfigured}
	got = entries()
	for p, v := range want {
		if got[p] != v {
			t.Errorf("after SetRemoteNodes(nil): cluster entry %s = %#x, want %#x", p, got[p], v)
		}
	}
	for p, v := range got {
		if v&clusterNode != 0 {
			t.Errorf("after SetRemoteNodes(nil): %s still a node entry (%#x)", p, v)
		}
	}
	if got, err := r.RemoteNodes(); err != nil || len(got) != 0 {
		t.Errorf("Reader.RemoteNodes after SetRemoteNodes(nil) = %v, %v", got, err)
	}
}

func TestSetRemoteNodesRefuses(t *testing.T) {
	f := newRemoteFixture(t, "standard")
	ctx := context.Background()
	addr := netip.MustParseAddr
	good := addr(otherNode4)
	if err := f.m.SetRemoteNodes(ctx, []netip.Addr{good}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bad  netip.Addr
		want string
	}{
		{netip.Addr{}, "addrs[1]: not a valid address"},
		{addr("::ffff:198.18.0.21"), "::ffff:198.18.0.21: an IPv4-mapped"},
		{addr("fe80::1%eth0"), "fe80::1%eth0: an address with a zone"},
		{addr("fe80::1"), "fe80::1: must be a unicast address, not loopback or link-local"},
		{addr("169.254.0.1"), "169.254.0.1: must be"},
		{addr("127.0.0.1"), "127.0.0.1: must be"},
		{addr("::1"), "::1: must be"},
		{addr("0.0.0.0"), "0.0.0.0: must be"},
		{addr("::"), ":: must be"},
		{addr("224.0.0.1"), "224.0.0.1: must be"},
		{addr("ff02::1"), "ff02::1: must be"},
	} {
		err := f.m.SetRemoteNodes(ctx, []netip.Addr{addr(otherNode6), tc.bad})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetRemoteNodes with %v: %v, want an error containing %q", tc.bad, err, tc.want)
		}
	}
	// Refused whole: the earlier set is as it was.
	if got, err := f.m.RemoteNodes(); err != nil || !slices.Equal(got, []netip.Addr{good}) {
		t.Errorf("after refused calls RemoteNodes = %v, %v, want [%s]", got, err, good)
	}
}
