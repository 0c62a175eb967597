package netpol

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// remoteFixture is a Manager on a private bpffs with the endpoint under
// test (podEndpoint, tenant "a") installed on the loopback interface, as
// the verdict tests install theirs, so frames can be judged with
// BPF_PROG_TEST_RUN against what SetRemote and friends wrote.
type remoteFixture struct {
	t  *testing.T
	m  *Manager
	id uint32 // the endpoint's tenant id
}

const (
	remoteSame4 = "10.7.0.5" // a pod of another node, in the cluster CIDRs
	remoteSame6 = "fd00:7::5"
)

func newRemoteFixture(t *testing.T, tier string) *remoteFixture {
	t.Helper()
	n := newTestNet(t)
	ctx := context.Background()
	m := n.open(ctx, func(o *Options) {
		o.Cluster.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	})
	t.Cleanup(func() { m.Close() })
	f := &remoteFixture{t: t, m: m}
	e := podEndpoint(func(e *Endpoint) { e.Tier = tier })
	err := m.locked(ctx, func() error {
		var err error
		if f.id, err = allocateID(m.dp.tenantIDs, e.Tenant, maxTenantID); err != nil {
			return err
		}
		tierID, err := allocateID(m.dp.tierIDs, e.Tier, 255)
		if err != nil {
			return err
		}
		return m.dp.install(newRecord(&e, loIfindex, "lo", f.id, tierID))
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// frames are the packets a pod exchanges with the remote address, both
// ways, one family each.
func remoteFrames() map[string][]byte {
	return map[string][]byte{
		"v4 from pod": ipv4(podV4, remoteSame4, 6, tcp(40000, 80), v4opts{}),
		"v4 to pod":   ipv4(remoteSame4, podV4, 17, udp(53, 40000), v4opts{}),
		"v6 from pod": ipv6(podV6, remoteSame6, 6, tcp(40000, 80)),
		"v6 to pod":   ipv6(remoteSame6, podV6, 17, udp(53, 40000)),
	}
}

// expect runs every remote frame and checks its verdict: pass when
// drop is false, else a drop counted under reason.
func (f *remoteFixture) expect(step string, drop bool, reason Reason) {
	f.t.Helper()
	f.expectFrames(step, remoteFrames(), drop, reason)
}

// expectFrames runs frames, named "... from pod" or "... to pod", and
// checks their verdicts as expect does.
func (f *remoteFixture) expectFrames(step string, frames map[string][]byte, drop bool, reason Reason) {
	f.t.Helper()
	for name, frame := range frames {
		dir := FromPod
		if strings.HasSuffix(name, "to pod") {
			dir = ToPod
		}
		before, err := f.m.dp.dropCounts(f.id)
		if err != nil {
			f.t.Fatal(err)
		}
		ret, err := f.m.dp.program(dir).Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			f.t.Fatal(err)
		}
		after, err := f.m.dp.dropCounts(f.id)
		if err != nil {
			f.t.Fatal(err)
		}
		want := uint32(verdictNext & 0xffffffff)
		if drop {
			want = verdictDrop
		}
		if ret != want {
			f.t.Errorf("%s: %s: verdict %d, want %d (counters %v)", step, name, int32(ret), int32(want), diff(before, after))
			continue
		}
		if drop && after[reason]-before[reason] != 1 {
			f.t.Errorf("%s: %s: dropped, but not for %s (counters %v)", step, name, reason, diff(before, after))
		}
	}
}

func (f *remoteFixture) remotes() []RemotePod {
	f.t.Helper()
	got, err := f.m.RemotePods()
	if err != nil {
		f.t.Fatal(err)
	}
	return got
}

// A pod of another node follows its entry: unknown (rule 14, cluster)
// until it is set, its tenant's verdict (rule 11) while it is, unknown
// again once deleted, and the new tenant's verdict when the address is
// reused.
func TestRemotePodVerdicts(t *testing.T) {
	for _, tier := range []string{"standard", "untrusted"} {
		t.Run(tier, func(t *testing.T) {
			f := newRemoteFixture(t, tier)
			ctx := context.Background()
			a4, a6 := netip.MustParseAddr(remoteSame4), netip.MustParseAddr(remoteSame6)

			f.expect("unknown", true, ReasonCluster)

			same := []RemotePod{{Addr: a4, Tenant: "a"}, {Addr: a6, Tenant: "a"}}
			if err := f.m.SetRemote(ctx, same); err != nil {
				t.Fatal(err)
			}
			f.expect("same tenant", false, 0)
			if got := f.remotes(); !slices.Equal(got, same) {
				t.Errorf("RemotePods = %+v, want %+v", got, same)
			}

			other := []RemotePod{{Addr: a4, Tenant: "b"}, {Addr: a6, Tenant: "b"}}
			if err := f.m.SetRemote(ctx, other); err != nil {
				t.Fatal(err)
			}
			f.expect("other tenant", true, ReasonTenant)

			if err := f.m.SetRemote(ctx, nil); err != nil {
				t.Fatal(err)
			}
			f.expect("after SetRemote(nil)", true, ReasonCluster)
			if got := f.remotes(); len(got) != 0 {
				t.Errorf("RemotePods after SetRemote(nil) = %+v", got)
			}

			// One pod at a time: the address is reused by a pod of
			// tenant b, then by one of tenant a.
			for _, p := range other {
				if err := f.m.UpsertRemote(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			f.expect("upsert other tenant", true, ReasonTenant)
			for _, p := range same {
				if err := f.m.UpsertRemote(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			f.expect("reused by same tenant", false, 0)
			for _, a := range []netip.Addr{a4, a6} {
				if err := f.m.DeleteRemote(ctx, a); err != nil {
					t.Fatal(err)
				}
			}
			f.expect("deleted", true, ReasonCluster)
			if err := f.m.DeleteRemote(ctx, a4); err != nil {
				t.Errorf("deleting an address with no entry: %v", err)
			}
		})
	}
}

// Remote pods are the agent's: a new ClusterConfig, GC and the shims'
// registrations leave them alone, SetRemote removes only its own, and a
// pod of this node or a single-address configured range wins over them.
func TestRemotePodsBeside(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	addr := netip.MustParseAddr
	cfg := func(o *Options) {
		o.Cluster.ClusterCIDRs = []netip.Prefix{pfx("10.0.0.0/8")}
		o.Cluster.RemoteTenants = []TenantRange{{Tenant: "red", Prefix: pfx("10.50.0.0/16")}, {Tenant: "red", Prefix: pfx("10.51.0.9/32")}}
	}
	m := n.open(ctx, cfg)
	defer m.Close()
	pods := []RemotePod{{Addr: addr("10.7.0.5"), Tenant: "blue", AllowRDMA: true}, {Addr: addr("fd00:7::5"), Tenant: "blue"}}
	if err := m.SetRemote(ctx, pods); err != nil {
		t.Fatal(err)
	}

	// Refused whole: an address with two tenants, an invalid pod.
	for _, bad := range [][]RemotePod{
		{{Addr: addr("10.7.0.6"), Tenant: "blue"}, {Addr: addr("10.7.0.6"), Tenant: "red"}},
		{{Addr: addr("10.7.0.7"), Tenant: "blue"}, {Addr: addr("fe80::7"), Tenant: "blue"}},
	} {
		if err := m.SetRemote(ctx, bad); err == nil {
			t.Errorf("SetRemote(%+v) succeeded", bad)
		}
	}

	again := n.open(ctx, cfg) // a shim or agent restart reconfiguring the node
	again.Close()
	if _, err := m.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	got, err := m.RemotePods()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, pods) {
		t.Errorf("after Open with a ClusterConfig and GC: RemotePods = %+v, want %+v", got, pods)
	}
	owners, err := m.dp.owners()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := owners[pfx("10.50.0.0/16")]; !ok {
		t.Error("SetRemote removed a configured remote range")
	}

	// A configured single address is not a remote pod's to take.
	err = m.SetRemote(ctx, append(slices.Clone(pods), RemotePod{Addr: addr("10.51.0.9"), Tenant: "blue"}))
	if !errors.Is(err, ErrAddressHeld) || !strings.Contains(err.Error(), "10.51.0.9") {
		t.Errorf("SetRemote over a configured address: %v, want ErrAddressHeld naming it", err)
	}
	if got, _ := m.RemotePods(); !slices.Equal(got, pods) {
		t.Errorf("after a refused address the others must be applied: %+v", got)
	}
	if o, ok, err := m.dp.ownerOf(pfx("10.51.0.9/32")); err != nil || !ok || o.Flags&flagRemotePod != 0 {
		t.Errorf("configured 10.51.0.9: %+v %v %v, want the configured range's entry", o, ok, err)
	}

	// A pod of this node registered on a remote pod's address wins.
	p := n.addPod("local", 1)
	local := n.endpoint(p, "green", nil)
	if err := m.UpsertRemote(ctx, RemotePod{Addr: local.IPv4, Tenant: "blue"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(ctx, local); err != nil {
		t.Fatal(err)
	}
	if err := m.UpsertRemote(ctx, RemotePod{Addr: local.IPv4, Tenant: "blue"}); !errors.Is(err, ErrAddressHeld) {
		t.Errorf("UpsertRemote over a pod of this node: %v, want ErrAddressHeld", err)
	}
	if err := m.DeleteRemote(ctx, local.IPv4); err != nil {
		t.Fatal(err)
	}
	o, ok, err := m.dp.ownerOf(netip.PrefixFrom(local.IPv4, 32))
	green, _ := lookupID(m.dp.tenantIDs, "green")
	if err != nil || !ok || o.Tenant != green || o.Flags&flagRemote != 0 {
		t.Errorf("the local pod's address after DeleteRemote: %+v %v %v, want green's local entry", o, ok, err)
	}
	if err := m.Unregister(ctx, local.SandboxID); err != nil {
		t.Fatal(err)
	}
}

func TestRemotePodValidate(t *testing.T) {
	addr := netip.MustParseAddr
	for _, tc := range []struct {
		pod  RemotePod
		want string
	}{
		{RemotePod{Tenant: "a"}, "not a valid address"},
		{RemotePod{Addr: addr("::ffff:10.0.0.1"), Tenant: "a"}, "IPv4-mapped"},
		{RemotePod{Addr: addr("fe80::1"), Tenant: "a"}, "non-link-local"},
		{RemotePod{Addr: addr("224.0.0.1"), Tenant: "a"}, "unicast"},
		{RemotePod{Addr: addr("0.0.0.0"), Tenant: "a"}, "unicast"},
		{RemotePod{Addr: addr("10.0.0.1"), Tenant: ""}, "Tenant"},
		{RemotePod{Addr: addr("10.0.0.1"), Tenant: "a\x00"}, "Tenant"},
		{RemotePod{Addr: addr("10.0.0.1"), Tenant: "Upper"}, "Tenant"},
	} {
		err := tc.pod.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error containing %q", tc.pod, err, tc.want)
		}
	}
	if err := (RemotePod{Addr: addr("fd00::5"), Tenant: "a"}).validate(); err != nil {
		t.Errorf("a valid remote pod: %v", err)
	}
}
