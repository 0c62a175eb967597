package netpol

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// TestFenceVeth drives real traffic between pods on a bridge: same tenant
// passes, other tenants and RoCEv2 do not, the counters say why, the fence
// survives its Manager, and unregistering or GC leaves nothing behind.
func TestFenceVeth(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, a2, b1 := n.addPod("a1", 1), n.addPod("a2", 2), n.addPod("b1", 3)

	m := n.open(ctx, nil)
	for _, e := range []Endpoint{n.endpoint(a1, "tenant-a", nil), n.endpoint(a2, "tenant-a", nil), n.endpoint(b1, "tenant-b", nil)} {
		if err := m.Register(ctx, e); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("same tenant", func(t *testing.T) {
		n.enter()
		for _, kind := range []probe{probeTCP, probeUDP, probeICMP, probeTCP6, probeUDP6, probeICMP6} {
			if !n.reach(a1, a2, kind, replyWait) {
				t.Errorf("%s a1 -> a2 (same tenant) failed", kind)
			}
		}
	})

	t.Run("other tenant", func(t *testing.T) {
		n.enter()
		before := n.drops(m, "tenant-a")
		for _, kind := range allProbes {
			if n.reach(a1, b1, kind, silenceWait) {
				t.Errorf("%s a1 -> b1 (other tenant) got through", kind)
			}
			if n.reach(b1, a2, kind, silenceWait) {
				t.Errorf("%s b1 -> a2 (other tenant) got through", kind)
			}
		}
		after := n.drops(m, "tenant-a")
		if after[ReasonTenant] <= before[ReasonTenant] {
			t.Errorf("tenant-a cross-tenant drops did not grow: %d -> %d", before[ReasonTenant], after[ReasonTenant])
		}
		if b := n.drops(m, "tenant-b"); b[ReasonTenant] == 0 {
			t.Errorf("tenant-b shows no cross-tenant drops: %v", b)
		}
	})

	t.Run("rdma needs both grants", func(t *testing.T) {
		n.enter()
		before := n.drops(m, "tenant-a")
		if n.reach(a1, a2, probeRoCE, silenceWait) {
			t.Error("RoCEv2 a1 -> a2 without grants got through")
		}
		if got := n.drops(m, "tenant-a")[ReasonRDMA]; got <= before[ReasonRDMA] {
			t.Errorf("rdma drops did not grow: %d", got)
		}
		for _, p := range []*testPod{a1, a2} {
			if err := m.Register(ctx, n.endpoint(p, "tenant-a", func(e *Endpoint) { e.AllowRDMA = true })); err != nil {
				t.Fatal(err)
			}
		}
		for _, kind := range []probe{probeRoCE, probeRoCE6} {
			if !n.reach(a1, a2, kind, replyWait) {
				t.Errorf("%s a1 -> a2 with both grants failed", kind)
			}
		}
		if n.reach(a1, b1, probeRoCE, silenceWait) {
			t.Error("RoCEv2 a1 -> b1 got through")
		}
	})

	t.Run("spoofed and truncated frames", func(t *testing.T) {
		n.enter()
		before := n.drops(m, "tenant-a")
		frames := [][]byte{
			ipv4(a2.v4.String(), b1.v4.String(), 17, udp(1, 2), v4opts{}), // spoof
			ether(ethTypeIPv4, nil), // header only
			ether(ethTypeIPv4, []byte{0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6}), // short IPv4
			ipv6(a1.v6.String(), a2.v6.String(), 6, nil)[:ethHdrLen+30],   // short IPv6
			ether(0x8100, make([]byte, 46)),                               // VLAN
		}
		for _, f := range frames {
			n.sendRaw(a1, fromMAC(a1.mac, f))
		}
		after := n.drops(m, "tenant-a")
		for r, want := range map[Reason]uint64{ReasonSpoof: 1, ReasonMalformed: 3, ReasonEthertype: 1} {
			if got := after[r] - before[r]; got < want {
				t.Errorf("%s drops grew by %d, want at least %d", r, got, want)
			}
		}
	})

	t.Run("survives its manager", func(t *testing.T) {
		n.enter()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if n.reach(a1, b1, probeTCP, silenceWait) {
			t.Error("fence gone after Manager.Close")
		}
		m = n.open(ctx, nil)
		eps, err := m.Endpoints()
		if err != nil {
			t.Fatal(err)
		}
		if len(eps) != 3 {
			t.Fatalf("reopened manager sees %d endpoints, want 3", len(eps))
		}
		for _, e := range eps {
			if e.Attach != "tcx" || !strings.HasPrefix(e.Tenant, "tenant-") || e.Tier != "standard" {
				t.Errorf("endpoint read back wrong: %+v", e)
			}
		}
		if !n.reach(a1, a2, probeTCP, replyWait) {
			t.Error("same tenant broken after reopen")
		}
	})

	t.Run("unregister leaves the interface untouched", func(t *testing.T) {
		n.enter()
		if err := m.Unregister(ctx, "sandbox-b1"); err != nil {
			t.Fatal(err)
		}
		if err := m.Unregister(ctx, "sandbox-b1"); err != nil {
			t.Fatalf("second unregister: %v", err)
		}
		hostIdx := mustLink(t, b1.hostIf).Attrs().Index
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: hostIdx, Attach: at})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Programs) != 0 {
				t.Errorf("%s still has %d programs after unregister", at, len(res.Programs))
			}
		}
		if _, ok, _ := m.dp.ownerOf(netip.PrefixFrom(b1.v4, 32)); ok {
			t.Error("b1's address still owned")
		}
		// b1 is no longer a tenant's: a1 may not reach an unowned cluster address.
		before := n.drops(m, "tenant-a")[ReasonCluster]
		if n.reach(a1, b1, probeTCP, silenceWait) {
			t.Error("a1 reached an unowned in-cluster address")
		}
		if n.drops(m, "tenant-a")[ReasonCluster] <= before {
			t.Error("cluster drops did not grow")
		}
	})

	t.Run("gc removes a vanished interface", func(t *testing.T) {
		n.enter()
		if err := netlink.LinkDel(mustLink(t, a2.hostIf)); err != nil {
			t.Fatal(err)
		}
		removed, err := m.GC(ctx, func(id string) bool { return true })
		if err != nil {
			t.Fatal(err)
		}
		if len(removed) != 1 || removed[0].SandboxID != "sandbox-a2" {
			t.Fatalf("GC removed %+v, want sandbox-a2", removed)
		}
		removed, err = m.GC(ctx, func(id string) bool { return id != "sandbox-a1" })
		if err != nil {
			t.Fatal(err)
		}
		if len(removed) != 1 || removed[0].SandboxID != "sandbox-a1" {
			t.Fatalf("GC removed %+v, want the dead sandbox-a1", removed)
		}
		assertEmpty(t, m, n.pinDir)
	})
	n.enter()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFenceClsactFallback runs the same programs as clsact/cls_bpf filters,
// the path taken where TCX is missing.
func TestFenceClsactFallback(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, a2, b1 := n.addPod("a1", 1), n.addPod("a2", 2), n.addPod("b1", 3)
	m := n.open(ctx, func(o *Options) { o.ForceClsact = true })
	defer m.Close()
	for _, e := range []Endpoint{n.endpoint(a1, "tenant-a", nil), n.endpoint(a2, "tenant-a", nil), n.endpoint(b1, "tenant-b", nil)} {
		if err := m.Register(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, kind := range []probe{probeTCP, probeUDP, probeICMP, probeTCP6} {
		if !n.reach(a1, a2, kind, replyWait) {
			t.Errorf("%s a1 -> a2 (same tenant) failed", kind)
		}
		if n.reach(a1, b1, kind, silenceWait) {
			t.Errorf("%s a1 -> b1 (other tenant) got through", kind)
		}
	}
	eps, err := m.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		if e.Attach != "clsact" {
			t.Errorf("%s attached by %s, want clsact", e.SandboxID, e.Attach)
		}
	}
	for _, p := range []*testPod{a1, a2, b1} {
		if err := m.Unregister(ctx, "sandbox-"+p.name); err != nil {
			t.Fatal(err)
		}
		l := mustLink(t, p.hostIf)
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(l, parent)
			if err != nil {
				t.Fatal(err)
			}
			if len(fs) != 0 {
				t.Errorf("%s: %d filters left after unregister", p.hostIf, len(fs))
			}
		}
	}
	if !n.reach(a1, b1, probeTCP, replyWait) {
		t.Error("unmanaged pods cannot talk after unregister")
	}
	assertEmpty(t, m, n.pinDir)
}

// TestConcurrentManagers registers endpoints from several Managers at once,
// as several shims do: every endpoint lands and each tenant gets one id.
func TestConcurrentManagers(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	const managers, perManager = 4, 6
	var ifs []int
	for i := range managers * perManager {
		d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d" + string(rune('a'+i))}, PeerName: "p" + string(rune('a'+i))}
		if err := netlink.LinkAdd(d); err != nil {
			t.Fatal(err)
		}
		ifs = append(ifs, mustLink(t, d.Name).Attrs().Index)
	}
	var wg sync.WaitGroup
	errs := make(chan error, managers*perManager)
	for g := range managers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.enter()
			m, err := Open(ctx, Options{PinDir: n.pinDir, LockPath: n.lock})
			if err != nil {
				errs <- err
				return
			}
			defer m.Close()
			for i := range perManager {
				k := g*perManager + i
				e := Endpoint{
					SandboxID: "sb-" + string(rune('a'+k)), Ifindex: ifs[k],
					Tenant: []string{"red", "green", "blue"}[k%3], Tier: "untrusted",
					IPv4: netip.AddrFrom4([4]byte{10, 214, 0, byte(k + 1)}),
				}
				if err := m.Register(ctx, e); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	m := n.open(ctx, nil)
	defer m.Close()
	eps, err := m.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != managers*perManager {
		t.Fatalf("%d endpoints registered, want %d", len(eps), managers*perManager)
	}
	ids := map[string]map[uint32]bool{}
	for _, e := range eps {
		v, _, err := m.dp.endpoint(uint32(e.Ifindex))
		if err != nil {
			t.Fatal(err)
		}
		if ids[e.Tenant] == nil {
			ids[e.Tenant] = map[uint32]bool{}
		}
		ids[e.Tenant][v.Tenant] = true
	}
	for tenant, set := range ids {
		if len(set) != 1 {
			t.Errorf("tenant %s got %d ids", tenant, len(set))
		}
	}
	for _, e := range eps {
		if err := m.Unregister(ctx, e.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	assertEmpty(t, m, n.pinDir)
}

func TestOpenRejectsBadOptions(t *testing.T) {
	tmp := t.TempDir()
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"relative pin dir", Options{PinDir: "bpf"}, "PinDir"},
		{"relative lock", Options{PinDir: "/sys/fs/bpf/x", LockPath: "lock"}, "LockPath"},
		{"not bpffs", Options{PinDir: filepath.Join(tmp, "pins"), LockPath: filepath.Join(tmp, "l")}, "not on a bpf filesystem"},
		{"bad cluster cidr", Options{PinDir: "/sys/fs/bpf/x", Cluster: &ClusterConfig{ClusterCIDRs: []netip.Prefix{{}}}}, "ClusterCIDRs[0]"},
		{"empty tier", Options{PinDir: "/sys/fs/bpf/x", Cluster: &ClusterConfig{SharedServices: map[string][]netip.Prefix{"": nil}}}, "SharedServices tier"},
		{"remote tenant without name", Options{PinDir: "/sys/fs/bpf/x", Cluster: &ClusterConfig{RemoteTenants: []TenantRange{{Prefix: netip.MustParsePrefix("10.0.0.0/8")}}}}, "RemoteTenants[0].Tenant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open: %v, want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(tmp, "pins")); err == nil {
		t.Error("Open created a pin directory off bpffs")
	}
}

func TestEndpointValidation(t *testing.T) {
	ok := func(mod func(*Endpoint)) Endpoint {
		e := Endpoint{SandboxID: "s", Ifindex: 3, Tenant: "t", Tier: "standard", IPv4: netip.MustParseAddr("10.1.2.3")}
		if mod != nil {
			mod(&e)
		}
		return e
	}
	for _, tc := range []struct {
		name string
		e    Endpoint
		want string // "" = valid
	}{
		{"valid", ok(nil), ""},
		{"valid by name, v6 only", ok(func(e *Endpoint) {
			e.Ifindex, e.HostVeth, e.IPv4, e.IPv6 = 0, "veth1", netip.Addr{}, netip.MustParseAddr("fd00::3")
		}), ""},
		{"no sandbox", ok(func(e *Endpoint) { e.SandboxID = "" }), "SandboxID is required"},
		{"long sandbox", ok(func(e *Endpoint) { e.SandboxID = strings.Repeat("x", 65) }), "at most 64 bytes"},
		{"no interface", ok(func(e *Endpoint) { e.Ifindex = 0 }), "Ifindex or HostVeth"},
		{"negative ifindex", ok(func(e *Endpoint) { e.Ifindex = -1 }), "must not be negative"},
		{"long veth name", ok(func(e *Endpoint) { e.Ifindex, e.HostVeth = 0, "veth0123456789abcdef" }), "HostVeth"},
		{"no address", ok(func(e *Endpoint) { e.IPv4 = netip.Addr{} }), "IPv4 or IPv6 is required"},
		{"v6 in IPv4", ok(func(e *Endpoint) { e.IPv4 = netip.MustParseAddr("fd00::1") }), "not an IPv4 address"},
		{"v4 in IPv6", ok(func(e *Endpoint) { e.IPv6 = netip.MustParseAddr("10.0.0.1") }), "not an IPv6 address"},
		{"link-local", ok(func(e *Endpoint) { e.IPv6 = netip.MustParseAddr("fe80::1") }), "non-link-local"},
		{"no tenant", ok(func(e *Endpoint) { e.Tenant = "" }), "Tenant"},
		{"long tier", ok(func(e *Endpoint) { e.Tier = strings.Repeat("t", 65) }), "Tier"},
		{"bad egress", ok(func(e *Endpoint) { e.EgressCIDRs = []netip.Prefix{{}} }), "EgressCIDRs[0]"},
		{"valid link layer", ok(fixtureL2), ""},
		{"short MAC", ok(func(e *Endpoint) { e.MAC = HardwareAddr{2, 0, 0} }), "MAC"},
		{"multicast MAC", ok(func(e *Endpoint) { e.MAC = HardwareAddr{0x33, 0x33, 0, 0, 0, 1} }), "unicast Ethernet"},
		{"zero MAC", ok(func(e *Endpoint) { e.MAC = make(HardwareAddr, 6) }), "unicast Ethernet"},
		{"global LinkLocal", ok(func(e *Endpoint) { e.LinkLocal = netip.MustParseAddr("fd00::1") }), "LinkLocal fd00::1 is not"},
		{"v4 RouterLinkLocal", ok(func(e *Endpoint) { e.RouterLinkLocal = netip.MustParseAddr("10.0.0.1") }), "RouterLinkLocal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.e.validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Shims share one pinned pair of programs; a pinned program from another
// build is replaced, never reused.
func TestOpenReusesPinnedPrograms(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	id := func(p *ebpf.Program) ebpf.ProgramID {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	m1 := n.open(ctx, nil)
	defer m1.Close()
	m2 := n.open(ctx, nil)
	defer m2.Close()
	for _, dir := range []Direction{FromPod, ToPod} {
		if a, b := id(m1.dp.program(dir)), id(m2.dp.program(dir)); a != b {
			t.Errorf("%s: managers load programs %d and %d, want one shared", dir, a, b)
		}
	}
	// Replace the pin with a foreign program of the right type.
	foreign, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Close()
	path := filepath.Join(n.pinDir, programName(FromPod))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := foreign.Pin(path); err != nil {
		t.Fatal(err)
	}
	m3 := n.open(ctx, nil)
	defer m3.Close()
	if id(m3.dp.fromPod) == id(foreign) {
		t.Fatal("a foreign pinned program was reused")
	}
	pinned, err := ebpf.LoadPinnedProgram(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if id(pinned) != id(m3.dp.fromPod) {
		t.Error("the foreign pin was not replaced")
	}
}

func TestRegisterRejects(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	p := n.addPod("r1", 1)
	m := n.open(ctx, nil)
	defer m.Close()
	good := n.endpoint(p, "tenant-a", nil)
	for _, tc := range []struct {
		name string
		mod  func(*Endpoint)
		want string
	}{
		{"missing interface index", func(e *Endpoint) { e.Ifindex = 99999 }, "interface index 99999"},
		{"missing interface name", func(e *Endpoint) { e.Ifindex, e.HostVeth = 0, "nosuchveth" }, "interface nosuchveth"},
		{"name and index disagree", func(e *Endpoint) { e.HostVeth = "lo" }, "not HostVeth lo"},
		{"invalid endpoint", func(e *Endpoint) { e.Tenant = "" }, "Tenant"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.enter()
			e := good
			tc.mod(&e)
			err := m.Register(ctx, e)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Register: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	assertEmpty(t, m, n.pinDir)
	if _, err := m.Stats("never-seen"); !errors.Is(err, ErrUnknownTenant) {
		t.Errorf("Stats of an unknown tenant: %v, want ErrUnknownTenant", err)
	}
	if err := m.Register(ctx, good); err != nil {
		t.Fatal(err)
	}
	if err := m.UnregisterInterface(ctx, good.Ifindex); err != nil {
		t.Fatal(err)
	}
	assertEmpty(t, m, n.pinDir)
}

// Open with a Cluster replaces the node-wide configuration; without one it
// leaves it alone.
func TestOpenConfigures(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	pfx := netip.MustParsePrefix
	first := &ClusterConfig{
		ClusterCIDRs:   []netip.Prefix{pfx("10.0.0.0/8"), pfx("fd00::/8")},
		SharedServices: map[string][]netip.Prefix{"standard": {pfx("10.96.0.10/32")}, "untrusted": {pfx("10.96.0.10/32"), pfx("fd00:96::a/128")}},
		RemoteTenants:  []TenantRange{{Tenant: "red", Prefix: pfx("10.50.0.0/16"), AllowRDMA: true}, {Tenant: "blue", Prefix: pfx("10.51.0.0/16")}},
	}
	second := &ClusterConfig{
		ClusterCIDRs:   []netip.Prefix{pfx("10.0.0.0/8")},
		SharedServices: map[string][]netip.Prefix{"untrusted": {pfx("10.96.0.53/32")}},
		RemoteTenants:  []TenantRange{{Tenant: "red", Prefix: pfx("10.52.0.0/16")}},
	}
	type snapshot struct {
		remote   map[netip.Prefix]bool
		services map[string][]netip.Prefix
	}
	read := func(m *Manager) snapshot {
		s := snapshot{remote: map[netip.Prefix]bool{}, services: map[string][]netip.Prefix{}}
		owners, err := m.dp.owners()
		if err != nil {
			t.Fatal(err)
		}
		for p, o := range owners {
			if o.Flags&flagRemote != 0 {
				s.remote[p] = o.Flags&flagRDMA != 0
			}
		}
		for _, tier := range []string{"standard", "untrusted"} {
			id, err := lookupID(m.dp.tierIDs, tier)
			if err != nil {
				t.Fatal(err)
			}
			ps, err := scopedList(m.dp.serviceV4, m.dp.serviceV6, id)
			if err != nil {
				t.Fatal(err)
			}
			s.services[tier] = ps
		}
		return s
	}
	m := n.open(ctx, func(o *Options) { o.Cluster = first })
	got := read(m)
	m.Close()
	if len(got.remote) != 2 || !got.remote[pfx("10.50.0.0/16")] || got.remote[pfx("10.51.0.0/16")] {
		t.Errorf("first remote ranges: %v", got.remote)
	}
	if len(got.services["standard"]) != 1 || len(got.services["untrusted"]) != 2 {
		t.Errorf("first shared services: %v", got.services)
	}
	m = n.open(ctx, func(o *Options) { o.Cluster = nil })
	if again := read(m); len(again.remote) != 2 {
		t.Errorf("Open without Cluster changed the configuration: %v", again.remote)
	}
	m.Close()
	m = n.open(ctx, func(o *Options) { o.Cluster = second })
	defer m.Close()
	got = read(m)
	if _, ok := got.remote[pfx("10.52.0.0/16")]; !ok || len(got.remote) != 1 {
		t.Errorf("second remote ranges: %v, want only 10.52.0.0/16", got.remote)
	}
	if len(got.services["standard"]) != 0 || len(got.services["untrusted"]) != 1 || got.services["untrusted"][0] != pfx("10.96.0.53/32") {
		t.Errorf("second shared services: %v", got.services)
	}
}
