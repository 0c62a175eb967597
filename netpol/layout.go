package netpol

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// The layout of the pinned fence: which maps exist, their key and value
// formats. A node agent of a new release opens the maps an older one
// pinned while their pods run, so a change of layout is migrated in
// place, under the node lock, without a drain: the pods keep their fence
// throughout (see migrateLayout).
//
// Layouts:
//
//	1  the first release with the node agent; no layout map is pinned.
//	2  drop counters keyed by (tenant, reason), two 32-bit words, instead
//	   of tenant<<4|reason: room for more than 16 reasons and for every
//	   tenant id, and a counter map sized for every reason of every
//	   tenant.
const layoutVersion = 2

// mapLayout is the pinned array holding the layout version (key 0). The
// programs never read it.
const mapLayout = "layout"

// ErrNewerLayout is returned by Open for a fence pinned by a newer
// release than this one: downgrading a node across a layout change is not
// supported.
var ErrNewerLayout = errors.New("the fence's pinned maps have a newer layout than this build")

// Migration is what Open did to a fence pinned by an older release.
type Migration struct {
	// From and To are the layout versions before and after.
	From, To uint32
	// Counters is how many drop counters were carried over.
	Counters int
	// Endpoints is how many pods' programs were swapped.
	Endpoints int
	// Took is how long the node lock was held for it.
	Took time.Duration
}

func (m Migration) String() string {
	return fmt.Sprintf("migrated the pinned fence from layout %d to %d: %d pods' programs swapped, %d drop counters carried over, in %s",
		m.From, m.To, m.Endpoints, m.Counters, m.Took.Round(time.Microsecond))
}

func layoutSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{Name: mapLayout, Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1, Pinning: ebpf.PinByName}
}

// pinnedLayout returns the layout of the fence pinned in pinDir, or 0 when
// nothing is pinned there. A fence without a layout map is layout 1.
func pinnedLayout(pinDir string) (uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, mapLayout), &ebpf.LoadPinOptions{ReadOnly: true})
	var v uint32
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return 0, fmt.Errorf("layout map: %w", err)
	default:
		err = m.Lookup(uint32(0), &v)
		m.Close()
		if err != nil {
			return 0, fmt.Errorf("layout map: %w", err)
		}
	}
	if v != 0 {
		return v, nil
	}
	if _, err := os.Stat(filepath.Join(pinDir, mapEndpoints)); err == nil {
		return 1, nil
	}
	return 0, nil
}

// writeLayout records v as the layout pinned in pinDir.
func writeLayout(pinDir string, v uint32) error {
	m, err := ebpf.NewMapWithOptions(layoutSpec(), ebpf.MapOptions{PinPath: pinDir})
	if err != nil {
		return fmt.Errorf("layout map: %w", err)
	}
	defer m.Close()
	if err := m.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("layout map: %w", err)
	}
	return nil
}

// migrations[v] turns layout v into v+1. Each step may have been cut short
// by a crash, and is then run again on what it left: it must finish the
// job from any point.
var migrations = map[uint32]func(pinDir string, m *Migration) error{
	1: migrateDropKeys,
}

// migrateLayout brings the fence pinned in pinDir, of layout v
// (pinnedLayout), to layoutVersion. It returns nil when there was nothing
// to migrate. The caller holds the
// node lock, so no other process changes the maps meanwhile; the packets
// of running pods are judged throughout, by the old programs on the old
// maps until each pod's programs are swapped, by the new ones after.
func migrateLayout(pinDir string, v uint32) (*Migration, error) {
	start := time.Now()
	switch {
	case v == 0 || v == layoutVersion:
		return nil, nil
	case v > layoutVersion:
		return nil, fmt.Errorf("%w: %s holds layout %d, this build knows layouts up to %d. "+
			"Run the release that pinned them (roll the node forward again), or drain the node and remove %s",
			ErrNewerLayout, pinDir, v, layoutVersion, pinDir)
	}
	mig := &Migration{From: v, To: layoutVersion}
	for ; v < layoutVersion; v++ {
		step, ok := migrations[v]
		if !ok {
			return nil, fmt.Errorf("%s holds layout %d, which this build cannot migrate: drain the node and remove %s", pinDir, v, pinDir)
		}
		if err := step(pinDir, mig); err != nil {
			return nil, fmt.Errorf("migrate the fence in %s from layout %d to %d: %w", pinDir, v, v+1, err)
		}
		if err := writeLayout(pinDir, v+1); err != nil {
			return nil, err
		}
	}
	mig.Took = time.Since(start)
	return mig, nil
}

// layout1DropKey turns a layout-1 drop counter key into layout 2's.
func layout1DropKey(k uint32) dropKey {
	const layout1ReasonBits = 4
	return dropKey{Tenant: k >> layout1ReasonBits, Reason: k & (1<<layout1ReasonBits - 1)}
}

// migrateDropKeys moves layout 1's drop counters (4-byte keys) to a map
// of layout 2 and every pod's programs to programs counting into it.
//
// The new map is filled with the old counts and then the programs are
// swapped, pod by pod, atomically (a TCX link update, a cls_bpf filter
// replace): no packet passes unjudged. The counts the old programs add
// during the swap are added afterwards, and the new map is pinned in
// place of the old. A crash before that pin leaves layout 1 pinned, and
// the step runs again; one after it leaves the new map pinned, and the
// step has nothing left to do.
func migrateDropKeys(pinDir string, mig *Migration) error {
	path := filepath.Join(pinDir, mapDrops)
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil // Open creates it
	}
	if err != nil {
		return fmt.Errorf("map %s: %w", mapDrops, err)
	}
	defer old.Close()
	want := mapSpecs(false)[mapDrops]
	switch old.KeySize() {
	case want.KeySize:
		return nil
	case 4:
	default:
		return fmt.Errorf("map %s: key size %d, want 4 (layout 1)", mapDrops, old.KeySize())
	}
	fresh, err := ebpf.NewMap(want)
	if err != nil {
		return fmt.Errorf("map %s: %w", mapDrops, err)
	}
	defer fresh.Close()

	before, err := layout1Counters(old)
	if err != nil {
		return err
	}
	for k, v := range before {
		if err := fresh.Put(layout1DropKey(k), v); err != nil {
			return fmt.Errorf("map %s: %w", mapDrops, err)
		}
	}
	d, err := newDatapath(pinDir, map[string]*ebpf.Map{mapDrops: fresh})
	if err != nil {
		return err
	}
	defer d.close()
	if mig.Endpoints, err = d.swapPrograms(pinDir); err != nil {
		return err
	}
	after, err := layout1Counters(old)
	if err != nil {
		return err
	}
	for k, v := range after {
		if err := addCounts(fresh, layout1DropKey(k), v, before[k]); err != nil {
			return fmt.Errorf("map %s: %w", mapDrops, err)
		}
	}
	mig.Counters = len(after)

	// Pin beside, then rename over: the pinned path never goes missing.
	tmp := filepath.Join(pinDir, "new_"+mapDrops)
	_ = os.Remove(tmp)
	if err := fresh.Pin(tmp); err != nil {
		return fmt.Errorf("pin map %s: %w", mapDrops, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = fresh.Unpin()
		return fmt.Errorf("pin map %s: %w", mapDrops, err)
	}
	return nil
}

// swapPrograms puts d's programs in place of those every endpoint pinned in
// pinDir runs, through the attach of a re-registration (a TCX link update,
// a cls_bpf filter replace: atomic, no gap), and returns how many endpoints
// it swapped. An endpoint whose interface is gone is skipped: the sweep
// removes it.
func (d *datapath) swapPrograms(pinDir string) (int, error) {
	eps, err := d.allEndpoints()
	if err != nil {
		return 0, fmt.Errorf("endpoints: %w", err)
	}
	m := &Manager{opts: Options{PinDir: pinDir}, dp: d}
	n := 0
	for idx, v := range eps {
		if l, err := netlink.LinkByIndex(int(idx)); err != nil || l.Attrs().Name != v.ifname() {
			continue
		}
		if _, err := m.attach(int(idx), v.Flags&flagClsact != 0); err != nil {
			return n, fmt.Errorf("endpoint %s: %w", v.sandbox(), err)
		}
		n++
	}
	return n, nil
}

// layout1Counters reads every per-CPU counter of a layout-1 drop map.
func layout1Counters(m *ebpf.Map) (map[uint32][]uint64, error) {
	out := map[uint32][]uint64{}
	var (
		k uint32
		v []uint64
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = append([]uint64(nil), v...)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("map %s: %w", mapDrops, err)
	}
	return out, nil
}

// addCounts adds now-was, per CPU, to the counter k of m.
func addCounts(m *ebpf.Map, k dropKey, now, was []uint64) error {
	delta := make([]uint64, len(now))
	changed := false
	for i := range now {
		if i < len(was) {
			delta[i] = now[i] - was[i]
		} else {
			delta[i] = now[i]
		}
		changed = changed || delta[i] != 0
	}
	if !changed {
		return nil
	}
	var cur []uint64
	err := m.Lookup(k, &cur)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	for i := range delta {
		if i < len(cur) {
			delta[i] += cur[i]
		}
	}
	return m.Put(k, delta)
}
