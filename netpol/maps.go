package netpol

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// datapath is one process's handle on the fence: the (possibly pinned) maps
// and the programs that reference them.
type datapath struct {
	coll *ebpf.Collection

	endpoints, tenantV4, tenantV6 *ebpf.Map
	ownerV4, ownerV6              *ebpf.Map
	serviceV4, serviceV6          *ebpf.Map
	egressV4, egressV6            *ebpf.Map
	clusterV4, clusterV6          *ebpf.Map
	drops, tenantIDs, tierIDs     *ebpf.Map
	ownerMAC                      *ebpf.Map
	metadataV4, metadataV6        *ebpf.Map

	fromPod, toPod *ebpf.Program
}

// loadDatapath creates the maps, or reuses those pinned in pinDir when pinDir
// is not empty, and loads the programs, reusing pinned ones that were built
// from the same instructions against the same maps: every shim on the node
// then shares one pair of programs. A fence an older release pinned is
// migrated to this build's layout first (migrateLayout); the Migration says
// what was done, nil when nothing was. The caller holds the node lock.
func loadDatapath(pinDir string) (*datapath, *Migration, error) {
	if pinDir == "" {
		d, err := newDatapath("", nil)
		return d, nil, err
	}
	v, err := pinnedLayout(pinDir)
	if err != nil {
		return nil, nil, err
	}
	mig, err := migrateLayout(pinDir, v)
	if err != nil {
		return nil, nil, err
	}
	d, err := newDatapath(pinDir, nil)
	if err != nil {
		return nil, nil, err
	}
	if v == 0 {
		// A fence pinned for the first time.
		if err := writeLayout(pinDir, layoutVersion); err != nil {
			d.close()
			return nil, nil, err
		}
	}
	return d, mig, nil
}

// newDatapath loads the maps and programs, with replace's maps in place of
// those of the same names (neither loaded nor pinned).
func newDatapath(pinDir string, replace map[string]*ebpf.Map) (*datapath, error) {
	spec := collectionSpec(pinDir != "")
	progs := spec.Programs
	spec.Programs = nil
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: pinDir},
		MapReplacements: replace,
	})
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("maps pinned in %s do not match layout %d of this build, and no migration knows them (drain the node and remove them): %w", pinDir, layoutVersion, err)
		}
		return nil, fmt.Errorf("load fence maps: %w", err)
	}
	d := &datapath{
		coll:      coll,
		endpoints: coll.Maps[mapEndpoints],
		tenantV4:  coll.Maps[mapTenantV4],
		tenantV6:  coll.Maps[mapTenantV6],
		ownerV4:   coll.Maps[mapOwnerV4],
		ownerV6:   coll.Maps[mapOwnerV6],
		serviceV4: coll.Maps[mapServiceV4],
		serviceV6: coll.Maps[mapServiceV6],
		egressV4:  coll.Maps[mapEgressV4],
		egressV6:  coll.Maps[mapEgressV6],
		clusterV4: coll.Maps[mapClusterV4],
		clusterV6: coll.Maps[mapClusterV6],
		drops:     coll.Maps[mapDrops],
		tenantIDs: coll.Maps[mapTenantIDs],
		tierIDs:   coll.Maps[mapTierIDs],

		ownerMAC:   coll.Maps[mapOwnerMAC],
		metadataV4: coll.Maps[mapMetadataV4],
		metadataV6: coll.Maps[mapMetadataV6],
	}
	for _, dir := range []Direction{FromPod, ToPod} {
		prog, err := loadProgram(progs[programName(dir)], coll.Maps, pinDir)
		if err != nil {
			d.close()
			return nil, err
		}
		if dir == FromPod {
			d.fromPod = prog
		} else {
			d.toPod = prog
		}
	}
	return d, nil
}

func programName(dir Direction) string {
	if dir == FromPod {
		return "fence_from_pod"
	}
	return "fence_to_pod"
}

// programDigest is a digest of a program as generated, before it is linked:
// each instruction's encoding, the label it carries and the label or map
// it refers to (jump offsets and map loads are resolved only at load).
// Encoding is about a tenth of the cost of formatting the instructions as
// text, which every shim paid on every open.
func programDigest(insns asm.Instructions) ([sha256.Size]byte, error) {
	h := sha256.New()
	for i, ins := range insns {
		if _, err := ins.Marshal(h, binary.LittleEndian); err != nil {
			return [sha256.Size]byte{}, fmt.Errorf("instruction %d: %w", i, err)
		}
		// Length-prefixed, so no two label pairs encode alike.
		for _, name := range []string{ins.Symbol(), ins.Reference()} {
			h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(name))))
			h.Write([]byte(name))
		}
	}
	return [sha256.Size]byte(h.Sum(nil)), nil
}

// loadProgram returns the program pinned in pinDir when its kernel name
// carries the hash of spec's instructions and it uses exactly maps; otherwise
// it loads spec and pins it in place of the old one.
func loadProgram(spec *ebpf.ProgramSpec, maps map[string]*ebpf.Map, pinDir string) (*ebpf.Program, error) {
	spec = spec.Copy()
	sum, err := programDigest(spec.Instructions)
	if err != nil {
		return nil, fmt.Errorf("program %s: %w", spec.Name, err)
	}
	pinName := spec.Name
	// Kernel object names hold 15 characters.
	spec.Name = fmt.Sprintf("bh%c_%s", pinName[len("fence_")], hex.EncodeToString(sum[:])[:10])
	for name, m := range maps {
		if err := spec.Instructions.AssociateMap(name, m); err != nil && !errors.Is(err, asm.ErrUnreferencedSymbol) {
			return nil, fmt.Errorf("program %s: map %s: %w", pinName, name, err)
		}
	}
	path := filepath.Join(pinDir, pinName)
	if pinDir != "" {
		if p, err := ebpf.LoadPinnedProgram(path, nil); err == nil {
			if reusable(p, spec.Name, maps) {
				return p, nil
			}
			p.Close()
		}
	}
	p, err := ebpf.NewProgram(spec)
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load program %s: %+v", pinName, verr)
		}
		return nil, fmt.Errorf("load program %s: %w", pinName, err)
	}
	if pinDir == "" {
		return p, nil
	}
	// Pin beside, then rename over: the pinned path never goes missing.
	tmp := filepath.Join(pinDir, "new_"+pinName) // bpffs refuses names with dots
	_ = os.Remove(tmp)
	if err := p.Pin(tmp); err != nil {
		p.Close()
		return nil, fmt.Errorf("pin program %s: %w", pinName, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = p.Unpin()
		p.Close()
		return nil, fmt.Errorf("pin program %s: %w", pinName, err)
	}
	return p, nil
}

// reusable reports whether a pinned program is the one this build would load.
func reusable(p *ebpf.Program, name string, maps map[string]*ebpf.Map) bool {
	info, err := p.Info()
	if err != nil || info.Name != name {
		return false
	}
	ids, ok := info.MapIDs()
	if !ok {
		return false
	}
	ours := map[ebpf.MapID]bool{}
	for _, m := range maps {
		mi, err := m.Info()
		if err != nil {
			return false
		}
		if id, ok := mi.ID(); ok {
			ours[id] = true
		}
	}
	for _, id := range ids {
		if !ours[id] {
			return false
		}
	}
	return len(ids) > 0
}

func (d *datapath) close() {
	if d.fromPod != nil {
		d.fromPod.Close()
	}
	if d.toPod != nil {
		d.toPod.Close()
	}
	d.coll.Close()
}

func (d *datapath) program(dir Direction) *ebpf.Program {
	if dir == FromPod {
		return d.fromPod
	}
	return d.toPod
}

// putOwner records that tenant owns prefix. A single address (a pod's, or
// a remote range of one address) goes in the exact-match owner hash, any
// other prefix in the tenant trie; the programs look in the hash first, which
// gives the same answer as one trie holding both (a host prefix is always
// the longest match) at the cost of a hash lookup instead of a trie walk.
func (d *datapath) putOwner(p netip.Prefix, o owner) error {
	p = p.Masked()
	switch {
	case p.Addr().Is4() && p.IsSingleIP():
		return d.ownerV4.Update(p.Addr().As4(), o, ebpf.UpdateAny)
	case p.Addr().Is4():
		return d.tenantV4.Update(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}, o, ebpf.UpdateAny)
	case p.IsSingleIP():
		return d.ownerV6.Update(p.Addr().As16(), o, ebpf.UpdateAny)
	default:
		return d.tenantV6.Update(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}, o, ebpf.UpdateAny)
	}
}

// ownerOf returns the exact entry for prefix, if any.
func (d *datapath) ownerOf(p netip.Prefix) (owner, bool, error) {
	var o owner
	var err error
	p = p.Masked()
	switch {
	case p.Addr().Is4() && p.IsSingleIP():
		err = d.ownerV4.Lookup(p.Addr().As4(), &o)
	case p.Addr().Is4():
		err = d.tenantV4.Lookup(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}, &o)
	case p.IsSingleIP():
		err = d.ownerV6.Lookup(p.Addr().As16(), &o)
	default:
		err = d.tenantV6.Lookup(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}, &o)
	}
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return o, false, nil
	}
	return o, err == nil, err
}

// deleteOwner removes prefix from the owner hash or tenant trie. A single
// address is removed from both: fences pinned before the owner hashes
// existed kept pods' addresses in the tries (owners lists them, so the
// orphan sweep clears them).
func (d *datapath) deleteOwner(p netip.Prefix) error {
	p = p.Masked()
	var trie error
	if p.Addr().Is4() {
		trie = ignoreNotExist(d.tenantV4.Delete(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}))
	} else {
		trie = ignoreNotExist(d.tenantV6.Delete(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}))
	}
	if trie != nil || !p.IsSingleIP() {
		return trie
	}
	if p.Addr().Is4() {
		return ignoreNotExist(d.ownerV4.Delete(p.Addr().As4()))
	}
	return ignoreNotExist(d.ownerV6.Delete(p.Addr().As16()))
}

// macKey is the owner_mac key of an Ethernet address: its 6 bytes and two
// zero bytes, as the programs build it on their stack.
func macKey(mac [6]byte) [8]byte {
	var k [8]byte
	copy(k[:], mac[:])
	return k
}

// putMACOwner records that the pod on o.Ifindex has mac. A MAC that a
// live endpoint on another interface already has is refused: the programs
// could not tell the two pods' ARP apart, and the bridge delivers to one
// of them only. live reports whether an ifindex holds an endpoint. The
// zero MAC (an endpoint that sends nothing) is not recorded.
func (d *datapath) putMACOwner(mac [6]byte, o owner, live func(uint32) bool) error {
	if mac == [6]byte{} {
		return nil
	}
	var cur owner
	err := d.ownerMAC.Lookup(macKey(mac), &cur)
	switch {
	case err == nil && cur.Ifindex != o.Ifindex && live(cur.Ifindex):
		return fmt.Errorf("MAC %s is the MAC of the endpoint on ifindex %d", HardwareAddr(mac[:]), cur.Ifindex)
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return err
	}
	return d.ownerMAC.Update(macKey(mac), o, ebpf.UpdateAny)
}

// deleteMACOwner removes mac's owner when it is the endpoint on ifindex.
func (d *datapath) deleteMACOwner(mac [6]byte, ifindex uint32) error {
	var cur owner
	err := d.ownerMAC.Lookup(macKey(mac), &cur)
	if errors.Is(err, ebpf.ErrKeyNotExist) || (err == nil && cur.Ifindex != ifindex) {
		return nil
	}
	if err != nil {
		return err
	}
	return ignoreNotExist(d.ownerMAC.Delete(macKey(mac)))
}

// sweepMACOwners removes the owners of MACs whose endpoint is gone or now
// has another MAC.
func (d *datapath) sweepMACOwners(live map[uint32]endpointValue) error {
	var (
		k     [8]byte
		o     owner
		stale [][8]byte
	)
	it := d.ownerMAC.Iterate()
	for it.Next(&k, &o) {
		v, ok := live[o.Ifindex]
		if !ok || macKey(v.MAC) != k {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range stale {
		if err := ignoreNotExist(d.ownerMAC.Delete(k)); err != nil {
			return err
		}
	}
	return nil
}

// sweepScopes clears the scopes of a scoped pair (by ifindex: egress
// allow-lists, credential endpoints) that no live endpoint holds.
func sweepScopes(v4, v6 *ebpf.Map, live map[uint32]endpointValue) error {
	scopes := map[uint32]bool{}
	var k4 scopedKeyV4
	var k6 scopedKeyV6
	var val uint8
	it := v4.Iterate()
	for it.Next(&k4, &val) {
		scopes[k4.Scope] = true
	}
	if err := it.Err(); err != nil {
		return err
	}
	it = v6.Iterate()
	for it.Next(&k6, &val) {
		scopes[k6.Scope] = true
	}
	if err := it.Err(); err != nil {
		return err
	}
	for s := range scopes {
		if _, ok := live[s]; !ok {
			if err := scopedReplace(v4, v6, s, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// scoped maps pick the v4 or v6 trie of a scoped pair.
func scopedPut(v4, v6 *ebpf.Map, scope uint32, p netip.Prefix) error {
	p = p.Masked()
	if p.Addr().Is4() {
		return v4.Update(scopedKeyV4{uint32(32 + p.Bits()), scope, p.Addr().As4()}, uint8(1), ebpf.UpdateAny)
	}
	return v6.Update(scopedKeyV6{uint32(32 + p.Bits()), scope, p.Addr().As16()}, uint8(1), ebpf.UpdateAny)
}

// scopedList returns every prefix of scope in the v4 and v6 tries.
func scopedList(v4, v6 *ebpf.Map, scope uint32) ([]netip.Prefix, error) {
	var out []netip.Prefix
	var k4 scopedKeyV4
	var val uint8
	it := v4.Iterate()
	for it.Next(&k4, &val) {
		if k4.Scope == scope {
			out = append(out, netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen)-32))
		}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	var k6 scopedKeyV6
	it = v6.Iterate()
	for it.Next(&k6, &val) {
		if k6.Scope == scope {
			out = append(out, netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen)-32))
		}
	}
	return out, it.Err()
}

func scopedDelete(v4, v6 *ebpf.Map, scope uint32, p netip.Prefix) error {
	var err error
	if p.Addr().Is4() {
		err = v4.Delete(scopedKeyV4{uint32(32 + p.Bits()), scope, p.Addr().As4()})
	} else {
		err = v6.Delete(scopedKeyV6{uint32(32 + p.Bits()), scope, p.Addr().As16()})
	}
	return ignoreNotExist(err)
}

// scopedReplace makes the prefixes of scope exactly want.
func scopedReplace(v4, v6 *ebpf.Map, scope uint32, want []netip.Prefix) error {
	have, err := scopedList(v4, v6, scope)
	if err != nil {
		return err
	}
	keep := make(map[netip.Prefix]bool, len(want))
	for _, p := range want {
		keep[p.Masked()] = true
		if err := scopedPut(v4, v6, scope, p); err != nil {
			return fmt.Errorf("prefix %s: %w", p, err)
		}
	}
	for _, p := range have {
		if !keep[p] {
			if err := scopedDelete(v4, v6, scope, p); err != nil {
				return fmt.Errorf("prefix %s: %w", p, err)
			}
		}
	}
	return nil
}

// owners lists the owner hashes and the tenant tries.
func (d *datapath) owners() (map[netip.Prefix]owner, error) {
	out := map[netip.Prefix]owner{}
	var (
		k4  lpmKeyV4
		k6  lpmKeyV6
		a4  [4]byte
		a16 [16]byte
		o   owner
	)
	it := d.tenantV4.Iterate()
	for it.Next(&k4, &o) {
		out[netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen))] = o
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	it = d.tenantV6.Iterate()
	for it.Next(&k6, &o) {
		out[netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen))] = o
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	it = d.ownerV4.Iterate()
	for it.Next(&a4, &o) {
		out[netip.PrefixFrom(netip.AddrFrom4(a4), 32)] = o
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	it = d.ownerV6.Iterate()
	for it.Next(&a16, &o) {
		out[netip.PrefixFrom(netip.AddrFrom16(a16), 128)] = o
	}
	return out, it.Err()
}

func ignoreNotExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	return err
}

// ids maps names to small stable numbers in a pinned hash. Callers hold the
// node lock, so allocation does not race.
func nameToKey(name string) (nameKey, error) {
	var k nameKey
	if name == "" || len(name) > nameLen {
		return k, fmt.Errorf("must be 1 to %d bytes, got %d", nameLen, len(name))
	}
	copy(k[:], name)
	return k, nil
}

func keyToName(k nameKey) string {
	n := 0
	for n < len(k) && k[n] != 0 {
		n++
	}
	return string(k[:n])
}

// lookupID returns the id of name, or 0 when it has none.
func lookupID(m *ebpf.Map, name string) (uint32, error) {
	k, err := nameToKey(name)
	if err != nil {
		return 0, err
	}
	var id uint32
	if err := m.Lookup(k, &id); err != nil {
		return 0, ignoreNotExist(err)
	}
	return id, nil
}

// allocateID returns the id of name, assigning the next free one (from 1) the
// first time. limit is the largest id the caller can represent.
func allocateID(m *ebpf.Map, name string, limit uint32) (uint32, error) {
	id, err := lookupID(m, name)
	if err != nil || id != 0 {
		return id, err
	}
	k, _ := nameToKey(name)
	var (
		key nameKey
		v   uint32
		max uint32
	)
	it := m.Iterate()
	for it.Next(&key, &v) {
		if v > max {
			max = v
		}
	}
	if err := it.Err(); err != nil {
		return 0, err
	}
	if max >= limit {
		return 0, fmt.Errorf("no free id: %d names allocated", max)
	}
	if err := m.Update(k, max+1, ebpf.UpdateNoExist); err != nil {
		return 0, err
	}
	return max + 1, nil
}

// nameOf reverses an id.
func nameOf(m *ebpf.Map, id uint32) (string, error) {
	var (
		key nameKey
		v   uint32
	)
	it := m.Iterate()
	for it.Next(&key, &v) {
		if v == id {
			return keyToName(key), nil
		}
	}
	return "", it.Err()
}

// dropCounts sums tenant's per-CPU drop counters.
func (d *datapath) dropCounts(tenant uint32) (map[Reason]uint64, error) {
	out := make(map[Reason]uint64, numReasons)
	for r := range numReasons {
		var perCPU []uint64
		err := d.drops.Lookup(dropKey{Tenant: tenant, Reason: uint32(r)}, &perCPU)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			out[r] = 0
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("drop counter %s: %w", r, err)
		}
		var sum uint64
		for _, n := range perCPU {
			sum += n
		}
		out[r] = sum
	}
	return out, nil
}
