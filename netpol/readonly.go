package netpol

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/cilium/ebpf"
)

// ErrNoFence is returned by OpenReadOnly when no fence is pinned in the
// directory: no shim of this node has opened it yet, or it was removed.
var ErrNoFence = errors.New("no fence pinned")

// Reader reads the pinned fence without changing anything: it creates no
// directory, pin or lock file, loads no program and takes no lock. Readers
// may see an update that a shim is making half done; they are for status
// and tests, never for decisions.
type Reader struct {
	pinDir string
	dp     *datapath // maps only; the programs stay nil
}

// OpenReadOnly opens the maps pinned in pinDir read-only (BPF_F_RDONLY).
// It returns an error wrapping ErrNoFence when pinDir holds no fence.
func OpenReadOnly(pinDir string) (*Reader, error) {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	if _, err := os.Stat(filepath.Join(pinDir, mapEndpoints)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("netpol: %s: %w", pinDir, ErrNoFence)
	}
	if err := requireBPFFS(pinDir); err != nil {
		return nil, err
	}
	// A Reader never migrates: the node agent does when it starts.
	switch v, err := pinnedLayout(pinDir); {
	case err != nil:
		return nil, fmt.Errorf("netpol: %s: %w", pinDir, err)
	case v != layoutVersion:
		return nil, fmt.Errorf("netpol: %s holds a fence of layout %d, this build reads layout %d (the node agent of this release migrates it when it starts)", pinDir, v, layoutVersion)
	}
	maps := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range maps {
			m.Close()
		}
	}
	for _, name := range []string{mapEndpoints, mapEgressV4, mapEgressV6, mapDrops, mapTenantIDs, mapTierIDs, mapOwnerV4, mapOwnerV6, mapClusterV4, mapClusterV6} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			closeAll()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("netpol: %s: map %s missing: %w", pinDir, name, ErrNoFence)
			}
			return nil, fmt.Errorf("netpol: %s: map %s: %w", pinDir, name, err)
		}
		maps[name] = m
	}
	return &Reader{pinDir: pinDir, dp: &datapath{
		endpoints: maps[mapEndpoints],
		egressV4:  maps[mapEgressV4],
		egressV6:  maps[mapEgressV6],
		drops:     maps[mapDrops],
		tenantIDs: maps[mapTenantIDs],
		tierIDs:   maps[mapTierIDs],
		ownerV4:   maps[mapOwnerV4],
		ownerV6:   maps[mapOwnerV6],
		clusterV4: maps[mapClusterV4],
		clusterV6: maps[mapClusterV6],
	}}, nil
}

// Close releases the map handles.
func (r *Reader) Close() error {
	for _, m := range []*ebpf.Map{r.dp.endpoints, r.dp.egressV4, r.dp.egressV6, r.dp.drops, r.dp.tenantIDs, r.dp.tierIDs, r.dp.ownerV4, r.dp.ownerV6, r.dp.clusterV4, r.dp.clusterV6} {
		if m != nil {
			m.Close()
		}
	}
	return nil
}

// Endpoints lists the registered endpoints, ordered by interface index.
func (r *Reader) Endpoints() ([]EndpointInfo, error) {
	all, err := r.dp.allEndpoints()
	if err != nil {
		return nil, fmt.Errorf("netpol: endpoints: %w", err)
	}
	m := &Manager{dp: r.dp}
	out := []EndpointInfo{}
	for idx, v := range all {
		info, err := m.info(idx, v)
		if err != nil {
			return nil, fmt.Errorf("netpol: endpoints: %w", err)
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ifindex < out[j].Ifindex })
	return out, nil
}

// Stats returns the tenant's drop counters; ErrUnknownTenant when the
// tenant never had an endpoint on this node.
func (r *Reader) Stats(tenant string) (Stats, error) {
	id, err := lookupID(r.dp.tenantIDs, tenant)
	if err != nil {
		return Stats{}, fmt.Errorf("netpol: stats: tenant %q %w", tenant, err)
	}
	if id == 0 {
		return Stats{}, fmt.Errorf("netpol: stats: tenant %q: %w", tenant, ErrUnknownTenant)
	}
	drops, err := r.dp.dropCounts(id)
	if err != nil {
		return Stats{}, fmt.Errorf("netpol: stats: %w", err)
	}
	return Stats{Tenant: tenant, Drops: drops}, nil
}

// RemotePods lists the remote pods the node agent gave the fence
// (Manager.SetRemote), ordered by address, without the fence's lock: each
// entry is as one map update left it, and the set may be mid-change.
func (r *Reader) RemotePods() ([]RemotePod, error) {
	var out []RemotePod
	var (
		a4  [4]byte
		a16 [16]byte
		o   owner
	)
	add := func(a netip.Addr) error {
		if o.Flags&flagRemotePod == 0 {
			return nil
		}
		tenant, err := nameOf(r.dp.tenantIDs, o.Tenant)
		if err != nil {
			return err
		}
		out = append(out, RemotePod{Addr: a, Tenant: tenant, AllowRDMA: o.Flags&flagRDMA != 0})
		return nil
	}
	it := r.dp.ownerV4.Iterate()
	for it.Next(&a4, &o) {
		if err := add(netip.AddrFrom4(a4)); err != nil {
			return nil, fmt.Errorf("netpol: remote pods: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("netpol: remote pods: %w", err)
	}
	it = r.dp.ownerV6.Iterate()
	for it.Next(&a16, &o) {
		if err := add(netip.AddrFrom16(a16)); err != nil {
			return nil, fmt.Errorf("netpol: remote pods: %w", err)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("netpol: remote pods: %w", err)
	}
	slices.SortFunc(out, func(a, b RemotePod) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}
