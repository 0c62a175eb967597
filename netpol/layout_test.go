package netpol

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// attachedPrograms returns the ids of the two programs on p's host veth:
// its pinned TCX links' or, with clsact, its cls_bpf filters'.
func attachedPrograms(t *testing.T, pinDir string, p *testPod, clsact bool) []ebpf.ProgramID {
	t.Helper()
	l := mustLink(t, p.hostIf)
	var ids []ebpf.ProgramID
	for _, dir := range []Direction{FromPod, ToPod} {
		if clsact {
			fs, err := netlink.FilterList(l, clsactParent(dir))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					ids = append(ids, ebpf.ProgramID(bf.Id))
				}
			}
			continue
		}
		pl, err := link.LoadPinnedLink((&Manager{opts: Options{PinDir: pinDir}}).linkPin(l.Attrs().Index, dir), nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := pl.Info()
		pl.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, info.Program)
	}
	if len(ids) != 2 {
		t.Fatalf("%s: %d programs attached, want 2", p.name, len(ids))
	}
	return ids
}

// usesPinnedDrops reports whether program id uses the drops map pinned
// in pinDir.
func usesPinnedDrops(t *testing.T, pinDir string, id ebpf.ProgramID) bool {
	t.Helper()
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	maps, _ := info.MapIDs()
	drops, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, mapDrops), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer drops.Close()
	di, err := drops.Info()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := di.ID()
	for _, m := range maps {
		if m == want {
			return true
		}
	}
	return false
}

// pinLayout1Drops makes the fence pinned in pinDir look as layout 1 left
// it: no layout map, and drop counters in a map of 4-byte keys
// (tenant<<4|reason) holding counts. The pods' programs keep counting into
// the map they were loaded with, which is no longer pinned, as layout 1's
// programs count into theirs until the migration swaps them.
func pinLayout1Drops(t *testing.T, pinDir string, counts map[uint32][]uint64) {
	t.Helper()
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: mapDrops, Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: 8,
		MaxEntries: 1 << 16, Flags: flagNoPrealloc})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	for k, v := range counts {
		if err := old.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(pinDir, "layout1_drops")
	if err := old.Pin(tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(pinDir, mapDrops)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pinDir, mapLayout)); err != nil {
		t.Fatal(err)
	}
}

// TestMigrateLayout1: a fence pinned by layout 1, with pods on TCX and on
// clsact, is migrated by the next Open without a drain: every pod's
// programs count into the new map, the old counts carry over, verdicts are
// unchanged, and a second Open has nothing to do. A fence of a newer
// layout is refused, by Open and by readers, naming both layouts.
func TestMigrateLayout1(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, a2, b1, c1 := n.addPod("a1", 1), n.addPod("a2", 2), n.addPod("b1", 3), n.addPod("c1", 4)
	m := n.open(ctx, nil)
	for _, e := range []Endpoint{n.endpoint(a1, "tenant-a", nil), n.endpoint(a2, "tenant-a", nil), n.endpoint(b1, "tenant-b", nil)} {
		if err := m.Register(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	mc := n.open(ctx, func(o *Options) { o.ForceClsact = true })
	if err := mc.Register(ctx, n.endpoint(c1, "tenant-c", nil)); err != nil {
		t.Fatal(err)
	}
	mc.Close()
	ids := map[string]uint32{}
	for _, tenant := range []string{"tenant-a", "tenant-b", "tenant-c"} {
		id, err := lookupID(m.dp.tenantIDs, tenant)
		if err != nil || id == 0 {
			t.Fatalf("%s has id %d (%v)", tenant, id, err)
		}
		ids[tenant] = id
	}
	m.Close()
	if v, err := pinnedLayout(n.pinDir); err != nil || v != layoutVersion {
		t.Fatalf("a new fence is pinned as layout %d (%v), want %d", v, err, layoutVersion)
	}

	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := func(n uint64) []uint64 {
		v := make([]uint64, cpus)
		v[0] = n
		return v
	}
	// Layout 1's counters: 7 cross-tenant drops of tenant-a, 3 egress
	// drops of tenant-c.
	pinLayout1Drops(t, n.pinDir, map[uint32][]uint64{
		ids["tenant-a"]<<4 | uint32(ReasonTenant): perCPU(7),
		ids["tenant-c"]<<4 | uint32(ReasonEgress): perCPU(3),
	})
	if _, err := OpenReadOnly(n.pinDir); err == nil || !strings.Contains(err.Error(), "layout 1") {
		t.Errorf("a reader of a layout 1 fence: %v, want an error naming layout 1", err)
	}

	m = n.open(ctx, nil)
	defer func() { m.Close() }()
	mig := m.Migration()
	if mig == nil {
		t.Fatal("Open migrated nothing")
	}
	if mig.From != 1 || mig.To != layoutVersion || mig.Endpoints != 4 || mig.Counters != 2 {
		t.Errorf("migration %+v, want layout 1 to %d, 4 pods, 2 counters", *mig, layoutVersion)
	}
	t.Log(mig)
	drops, err := ebpf.LoadPinnedMap(filepath.Join(n.pinDir, mapDrops), nil)
	if err != nil {
		t.Fatal(err)
	}
	if drops.KeySize() != 8 || drops.MaxEntries() != maxCounters {
		t.Errorf("pinned drops: key size %d, %d entries; want 8, %d", drops.KeySize(), drops.MaxEntries(), maxCounters)
	}
	drops.Close()
	if got := n.drops(m, "tenant-a")[ReasonTenant]; got != 7 {
		t.Errorf("tenant-a cross-tenant drops after the migration: %d, want the 7 carried over", got)
	}
	if got := n.drops(m, "tenant-c")[ReasonEgress]; got != 3 {
		t.Errorf("tenant-c egress drops after the migration: %d, want the 3 carried over", got)
	}

	// Every pod's programs now count into the pinned map, and judge as
	// before.
	for _, p := range []*testPod{a1, a2, b1, c1} {
		for _, id := range attachedPrograms(t, n.pinDir, p, p == c1) {
			if !usesPinnedDrops(t, n.pinDir, id) {
				t.Errorf("%s: program %d does not count into the pinned drops map", p.name, id)
			}
		}
	}
	n.enter()
	if !n.reach(a1, a2, probeUDP, replyWait) {
		t.Error("a1 -> a2 (same tenant) failed after the migration")
	}
	for _, c := range [][2]*testPod{{a1, b1}, {a2, c1}, {b1, a1}, {c1, b1}} {
		if n.reach(c[0], c[1], probeUDP, silenceWait) {
			t.Errorf("%s -> %s (other tenant) got through after the migration", c[0].name, c[1].name)
		}
	}
	m.Close()

	// Nothing left to do; and a migration cut short after the new map was
	// pinned (no layout map yet) finishes on the next Open.
	m = n.open(ctx, nil)
	if mig := m.Migration(); mig != nil {
		t.Errorf("a second Open migrated again: %s", mig)
	}
	m.Close()
	if err := os.Remove(filepath.Join(n.pinDir, mapLayout)); err != nil {
		t.Fatal(err)
	}
	m = n.open(ctx, nil)
	if mig := m.Migration(); mig == nil || mig.Counters != 0 {
		t.Errorf("Open after a cut-short migration: %v, want layout 1 to %d with no counters to carry", mig, layoutVersion)
	}
	if v, err := pinnedLayout(n.pinDir); err != nil || v != layoutVersion {
		t.Errorf("layout after the finished migration: %d (%v), want %d", v, err, layoutVersion)
	}
	m.Close()

	// A newer release's fence: refused by Open and by readers.
	if err := writeLayout(n.pinDir, layoutVersion+1); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, Options{PinDir: n.pinDir, LockPath: n.lock})
	if !errors.Is(err, ErrNewerLayout) || !strings.Contains(err.Error(), "layout 3") || !strings.Contains(err.Error(), "up to 2") {
		t.Errorf("Open of a layout %d fence: %v, want ErrNewerLayout naming both layouts", layoutVersion+1, err)
	}
	if _, err := OpenReadOnly(n.pinDir); err == nil || !strings.Contains(err.Error(), "layout 3") {
		t.Errorf("a reader of a layout 3 fence: %v, want an error naming it", err)
	}
	if err := writeLayout(n.pinDir, layoutVersion); err != nil {
		t.Fatal(err)
	}
	m = n.open(ctx, nil)
}
