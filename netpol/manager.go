package netpol

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-runtime/bulkhead/internal/dnslabel"
)

// Defaults for Options.
const (
	DefaultPinDir   = "/sys/fs/bpf/bulkhead"
	DefaultLockPath = "/run/bulkhead/netpol.lock"
)

// ErrUnknownTenant is returned for a tenant that was never registered on this node.
var ErrUnknownTenant = errors.New("tenant unknown on this node")

// Options configure Open.
type Options struct {
	// PinDir is where the maps and TCX links are pinned. It must be on a bpf
	// filesystem (see MountBPFFS). Default DefaultPinDir.
	PinDir string
	// LockPath is the file whose flock serializes map updates between the
	// shim processes of a node (bpffs cannot hold regular files). Its
	// directory is created. Default DefaultLockPath.
	LockPath string
	// Cluster, when not nil, replaces the node-wide configuration held in the
	// pinned maps. Nil leaves it as pinned, for processes that only register
	// endpoints or read counters.
	Cluster *ClusterConfig
	// ForceClsact attaches through clsact/cls_bpf even where TCX works.
	ForceClsact bool
}

// ClusterConfig is the node-wide part of the fence.
type ClusterConfig struct {
	// ClusterCIDRs are the cluster's pod and service ranges, and the node
	// network. An address in them that no tenant owns and no shared
	// service covers is dropped; addresses outside them are "leaving the
	// cluster". This node's own addresses are added to them, and so are
	// the other nodes' addresses the node agent learns
	// (Manager.SetRemoteNodes), which a new ClusterConfig leaves in place.
	ClusterCIDRs []netip.Prefix
	// SharedServices lists, per tier name, the CIDRs every pod of that tier
	// may reach whatever its tenant: cluster DNS, the API server.
	SharedServices map[string][]netip.Prefix
	// RemoteTenants are address ranges of pods on other nodes, by tenant:
	// static configuration. The remote pods the node agent learns from the
	// API server are kept apart (Manager.SetRemote) and survive a new
	// ClusterConfig; a single-address range replaces a remote pod of that
	// address, and SetRemote then skips it.
	RemoteTenants []TenantRange
}

// TenantRange gives a tenant an address range outside this node.
type TenantRange struct {
	// Tenant names the owner: a DNS-1123 label, as Endpoint.Tenant.
	Tenant string
	// Prefix is the range.
	Prefix netip.Prefix
	// AllowRDMA says the range's pods hold the RDMA grant.
	AllowRDMA bool
}

// Stats are a tenant's drop counters, summed over CPUs.
type Stats struct {
	Tenant string
	// Drops counts dropped packets by reason; every reason is present.
	Drops map[Reason]uint64
}

// Manager registers pod endpoints in the pinned fence. Several Managers, in
// several processes, may work on one node at once: every update holds the
// node lock.
type Manager struct {
	opts Options
	// mu guards dp and serializes this process's users of lockFile: flock
	// does not exclude goroutines sharing one open file.
	mu       sync.Mutex
	lockFile *os.File
	dp       *datapath
	// migration is what Open did to a fence an older release pinned.
	migration *Migration
}

func (o *Options) setDefaults() {
	if o.PinDir == "" {
		o.PinDir = DefaultPinDir
	}
	if o.LockPath == "" {
		o.LockPath = DefaultLockPath
	}
}

func (o *Options) validate() error {
	if !filepath.IsAbs(o.PinDir) {
		return fmt.Errorf("netpol: PinDir %q must be an absolute path", o.PinDir)
	}
	if !filepath.IsAbs(o.LockPath) {
		return fmt.Errorf("netpol: LockPath %q must be an absolute path", o.LockPath)
	}
	c := o.Cluster
	if c == nil {
		return nil
	}
	for i, p := range c.ClusterCIDRs {
		if !p.IsValid() {
			return fmt.Errorf("netpol: Cluster.ClusterCIDRs[%d] is not a valid prefix", i)
		}
	}
	for tier, ps := range c.SharedServices {
		if err := dnslabel.Check(tier); err != nil {
			return fmt.Errorf("netpol: Cluster.SharedServices tier %q %w", tier, err)
		}
		for i, p := range ps {
			if !p.IsValid() {
				return fmt.Errorf("netpol: Cluster.SharedServices[%q][%d] is not a valid prefix", tier, i)
			}
		}
	}
	for i, r := range c.RemoteTenants {
		if err := dnslabel.Check(r.Tenant); err != nil {
			return fmt.Errorf("netpol: Cluster.RemoteTenants[%d].Tenant %q %w", i, r.Tenant, err)
		}
		if !r.Prefix.IsValid() {
			return fmt.Errorf("netpol: Cluster.RemoteTenants[%d].Prefix is not a valid prefix", i)
		}
	}
	return nil
}

// Open loads the fence, reusing the maps pinned in PinDir (creating and
// pinning them the first time), and applies Options.Cluster when set.
func Open(ctx context.Context, opts Options) (*Manager, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := requireBPFFS(opts.PinDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(opts.PinDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("netpol: pin directory: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(opts.LockPath), 0o700); err != nil {
		return nil, fmt.Errorf("netpol: lock directory: %w", err)
	}
	lf, err := os.OpenFile(opts.LockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netpol: lock file: %w", err)
	}
	// Kernels with memcg accounting for BPF need no rlimit change; older
	// ones need RLIMIT_MEMLOCK lifted.
	if err := rlimit.RemoveMemlock(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("netpol: %w", err)
	}
	m := &Manager{opts: opts, lockFile: lf}
	err = m.locked(ctx, func() error {
		dp, mig, err := loadDatapath(opts.PinDir)
		if err != nil {
			return err
		}
		m.dp, m.migration = dp, mig
		if opts.Cluster != nil {
			return m.configure(opts.Cluster)
		}
		return nil
	})
	if err != nil {
		if m.dp != nil {
			m.dp.close()
		}
		lf.Close()
		return nil, fmt.Errorf("netpol: %w", err)
	}
	return m, nil
}

// Migration returns what Open did to migrate a fence pinned by an older
// release to this build's layout, or nil when it did nothing.
func (m *Manager) Migration() *Migration { return m.migration }

// Close releases this process's handles. Pins, and so enforcement, stay.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dp != nil {
		m.dp.close()
		m.dp = nil
	}
	if m.lockFile == nil {
		return nil
	}
	err := m.lockFile.Close()
	m.lockFile = nil
	return err
}

// locked runs fn holding the node lock.
func (m *Manager) locked(ctx context.Context, fn func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lockFile == nil {
		return errors.New("manager is closed")
	}
	for {
		err := unix.Flock(int(m.lockFile.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("lock %s: %w", m.opts.LockPath, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lock %s: %w", m.opts.LockPath, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	defer unix.Flock(int(m.lockFile.Fd()), unix.LOCK_UN)
	return fn()
}

// configure replaces the node-wide configuration. Caller holds the lock.
func (m *Manager) configure(c *ClusterConfig) error {
	d := m.dp
	// This node's own addresses are in the cluster whatever ClusterCIDRs
	// say: NodePort, LoadBalancer and host-network traffic reaches a pod
	// from them after the node's NAT, from any tenant (issue 24).
	own, err := nodeAddrs(c.ClusterCIDRs)
	if err != nil {
		return err
	}
	if err := d.replaceCluster(slices.Concat(c.ClusterCIDRs, own)); err != nil {
		return err
	}
	tiers := make([]string, 0, len(c.SharedServices))
	for tier := range c.SharedServices {
		tiers = append(tiers, tier)
	}
	sort.Strings(tiers)
	configured := map[uint32]bool{}
	for _, tier := range tiers {
		id, err := allocateID(d.tierIDs, tier, 255)
		if err != nil {
			return fmt.Errorf("tier %s: %w", tier, err)
		}
		configured[id] = true
		if err := scopedReplace(d.serviceV4, d.serviceV6, id, c.SharedServices[tier]); err != nil {
			return fmt.Errorf("shared services of tier %s: %w", tier, err)
		}
	}
	var (
		k  nameKey
		id uint32
	)
	var unconfigured []uint32
	it := d.tierIDs.Iterate()
	for it.Next(&k, &id) {
		if !configured[id] {
			unconfigured = append(unconfigured, id)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, id := range unconfigured {
		if err := scopedReplace(d.serviceV4, d.serviceV6, id, nil); err != nil {
			return err
		}
	}

	want := map[netip.Prefix]owner{}
	for _, r := range c.RemoteTenants {
		id, err := allocateID(d.tenantIDs, r.Tenant, maxTenantID)
		if err != nil {
			return fmt.Errorf("tenant %s: %w", r.Tenant, err)
		}
		o := owner{Tenant: id, Flags: flagRemote}
		if r.AllowRDMA {
			o.Flags |= flagRDMA
		}
		want[r.Prefix.Masked()] = o
	}
	have, err := d.owners()
	if err != nil {
		return err
	}
	for p, o := range have {
		if _, ok := want[p]; !ok && o.Flags&flagRemote != 0 && o.Flags&flagRemotePod == 0 {
			if err := d.deleteOwner(p); err != nil {
				return err
			}
		}
	}
	for p, o := range want {
		if cur, ok := have[p]; ok && cur.Flags&flagRemote == 0 {
			return fmt.Errorf("remote tenant range %s overlaps exactly a local pod address", p)
		}
		if err := d.putOwner(p, o); err != nil {
			return fmt.Errorf("remote tenant range %s: %w", p, err)
		}
	}
	return nil
}

// maxTenantID is the largest tenant id: one per name the ids map holds.
const maxTenantID = maxNames

// Register fences the endpoint: it records the pod's tenant, addresses and
// policy, then attaches the programs to the host-side veth. When Register
// returns an error nothing of the endpoint is enforced and the pod must not
// start. Registering a sandbox again updates it in place.
func (m *Manager) Register(ctx context.Context, e Endpoint) error {
	if err := e.validate(); err != nil {
		return err
	}
	link, err := resolveLink(e.Ifindex, e.HostVeth)
	if err != nil {
		return fmt.Errorf("endpoint %s: %w", e.SandboxID, err)
	}
	ifindex, ifname := link.Attrs().Index, link.Attrs().Name
	if err := fillLinkAddrs(&e, link); err != nil {
		return fmt.Errorf("netpol: register %s on %s (ifindex %d): %w", e.SandboxID, ifname, ifindex, err)
	}
	err = m.locked(ctx, func() error {
		d := m.dp
		tenant, err := allocateID(d.tenantIDs, e.Tenant, maxTenantID)
		if err != nil {
			return fmt.Errorf("tenant %s: %w", e.Tenant, err)
		}
		tier, err := allocateID(d.tierIDs, e.Tier, 255)
		if err != nil {
			return fmt.Errorf("tier %s: %w", e.Tier, err)
		}
		all, err := d.allEndpoints()
		if err != nil {
			return err
		}
		// The sandbox on another interface (its veth was recreated), or
		// another sandbox on this interface index (a stale entry): remove.
		for idx, v := range all {
			if (v.sandbox() == e.SandboxID) != (idx == uint32(ifindex)) {
				if err := m.unregisterLocked(idx, v); err != nil {
					return err
				}
			}
		}
		rec := newRecord(&e, ifindex, ifname, tenant, tier)
		old, hadOld := all[uint32(ifindex)]
		if hadOld && old.sandbox() == e.SandboxID {
			rec.value.Flags |= old.Flags & flagClsact
		}
		if err := d.install(rec); err != nil {
			return err
		}
		if hadOld && old.sandbox() == e.SandboxID {
			if err := d.dropStaleAddrs(uint32(ifindex), old, rec.value); err != nil {
				return err
			}
		}
		mode, err := m.attach(ifindex, rec.value.Flags&flagClsact != 0)
		if err != nil {
			// Fail closed: leave nothing half-registered.
			_ = m.detach(ifindex, ifname, true)
			_ = d.remove(uint32(ifindex), rec.value)
			return err
		}
		if mode == attachClsact && rec.value.Flags&flagClsact == 0 {
			rec.value.Flags |= flagClsact
			return d.endpoints.Update(uint32(ifindex), rec.value, ebpf.UpdateAny)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netpol: register %s on %s (ifindex %d): %w", e.SandboxID, ifname, ifindex, err)
	}
	return nil
}

// dropStaleAddrs removes the owners of addresses old had and now lacks.
func (d *datapath) dropStaleAddrs(ifindex uint32, old, cur endpointValue) error {
	keep := map[netip.Prefix]bool{}
	for _, p := range cur.addrs() {
		keep[p] = true
	}
	if old.MAC != cur.MAC {
		if err := d.deleteMACOwner(old.MAC, ifindex); err != nil {
			return err
		}
	}
	for _, p := range old.addrs() {
		if keep[p] {
			continue
		}
		o, ok, err := d.ownerOf(p)
		if err != nil {
			return err
		}
		if ok && o.Ifindex == ifindex && o.Flags&flagRemote == 0 {
			if err := d.deleteOwner(p); err != nil {
				return err
			}
		}
	}
	return nil
}

func resolveLink(ifindex int, name string) (netlink.Link, error) {
	if ifindex != 0 {
		l, err := netlink.LinkByIndex(ifindex)
		if err != nil {
			return nil, fmt.Errorf("interface index %d: %w", ifindex, err)
		}
		if name != "" && l.Attrs().Name != name {
			return nil, fmt.Errorf("interface index %d is %s, not HostVeth %s", ifindex, l.Attrs().Name, name)
		}
		return l, nil
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	return l, nil
}

// Unregister removes every endpoint of the sandbox and detaches its
// programs. Unregistering an unknown sandbox is not an error.
func (m *Manager) Unregister(ctx context.Context, sandboxID string) error {
	err := m.locked(ctx, func() error {
		all, err := m.dp.allEndpoints()
		if err != nil {
			return err
		}
		for idx, v := range all {
			if v.sandbox() == sandboxID {
				if err := m.unregisterLocked(idx, v); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netpol: unregister %s: %w", sandboxID, err)
	}
	return nil
}

// UnregisterInterface removes the endpoint on the host interface ifindex.
func (m *Manager) UnregisterInterface(ctx context.Context, ifindex int) error {
	err := m.locked(ctx, func() error {
		v, ok, err := m.dp.endpoint(uint32(ifindex))
		if err != nil || !ok {
			return err
		}
		return m.unregisterLocked(uint32(ifindex), v)
	})
	if err != nil {
		return fmt.Errorf("netpol: unregister interface %d: %w", ifindex, err)
	}
	return nil
}

// unregisterLocked detaches first, so that the programs never run against a
// half-removed endpoint; an endpoint without an entry passes traffic.
func (m *Manager) unregisterLocked(ifindex uint32, v endpointValue) error {
	if err := m.detach(int(ifindex), v.ifname(), v.Flags&flagClsact != 0); err != nil {
		return err
	}
	return m.dp.remove(ifindex, v)
}

// GC removes endpoints whose interface is gone (or is now another
// interface) or whose sandbox alive reports dead, then any pinned link,
// address or allow-list entry that no endpoint owns. alive may be nil.
func (m *Manager) GC(ctx context.Context, alive func(sandboxID string) bool) ([]EndpointInfo, error) {
	var removed []EndpointInfo
	err := m.locked(ctx, func() error {
		d := m.dp
		all, err := d.allEndpoints()
		if err != nil {
			return err
		}
		for idx, v := range all {
			l, err := netlink.LinkByIndex(int(idx))
			gone := err != nil || l.Attrs().Name != v.ifname()
			if !gone && alive != nil && !alive(v.sandbox()) {
				gone = true
			}
			if !gone {
				continue
			}
			info, err := m.info(idx, v)
			if err != nil {
				return err
			}
			if err := m.unregisterLocked(idx, v); err != nil {
				return err
			}
			delete(all, idx)
			removed = append(removed, info)
		}
		return m.sweepOrphans(all)
	})
	if err != nil {
		return removed, fmt.Errorf("netpol: gc: %w", err)
	}
	return removed, nil
}

// sweepOrphans deletes what a crash between steps may have left behind.
func (m *Manager) sweepOrphans(live map[uint32]endpointValue) error {
	d := m.dp
	owners, err := d.owners()
	if err != nil {
		return err
	}
	for p, o := range owners {
		if o.Flags&flagRemote != 0 {
			continue
		}
		if _, ok := live[o.Ifindex]; !ok {
			if err := d.deleteOwner(p); err != nil {
				return err
			}
		}
	}
	for _, pair := range [][2]*ebpf.Map{{d.egressV4, d.egressV6}, {d.metadataV4, d.metadataV6}} {
		if err := sweepScopes(pair[0], pair[1], live); err != nil {
			return err
		}
	}
	if err := d.sweepMACOwners(live); err != nil {
		return err
	}
	return m.sweepLinks(live)
}

// Endpoints lists the registered endpoints, ordered by interface index.
func (m *Manager) Endpoints() ([]EndpointInfo, error) {
	var out []EndpointInfo
	err := m.locked(context.Background(), func() error {
		all, err := m.dp.allEndpoints()
		if err != nil {
			return err
		}
		for idx, v := range all {
			info, err := m.info(idx, v)
			if err != nil {
				return err
			}
			out = append(out, info)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Ifindex < out[j].Ifindex })
	if err != nil {
		return nil, fmt.Errorf("netpol: endpoints: %w", err)
	}
	return out, nil
}

func (m *Manager) info(ifindex uint32, v endpointValue) (EndpointInfo, error) {
	d := m.dp
	tenant, err := nameOf(d.tenantIDs, v.Tenant)
	if err != nil {
		return EndpointInfo{}, err
	}
	tier, err := nameOf(d.tierIDs, v.Tier)
	if err != nil {
		return EndpointInfo{}, err
	}
	e := EndpointInfo{Attach: string(attachTCX)}
	if v.Flags&flagClsact != 0 {
		e.Attach = string(attachClsact)
	}
	e.SandboxID, e.Ifindex, e.HostVeth = v.sandbox(), int(ifindex), v.ifname()
	e.Tenant, e.Tier = tenant, tier
	if v.Flags&flagHasIPv4 != 0 {
		e.IPv4 = netip.AddrFrom4(v.IPv4)
	}
	if v.Flags&flagHasIPv6 != 0 {
		e.IPv6 = netip.AddrFrom16(v.IPv6)
	}
	if v.Flags&flagHasLinkLocal != 0 {
		e.LinkLocal = netip.AddrFrom16(v.LinkLocal)
	}
	if v.Flags&flagHasRouter != 0 {
		e.RouterLinkLocal = netip.AddrFrom16(v.Router)
	}
	e.MAC = HardwareAddr(v.MAC[:])
	e.AllowRDMA = v.Flags&flagRDMA != 0
	e.DenyMetadata = v.Flags&flagDenyMetadata != 0
	if e.DenyMetadata && d.metadataV4 != nil {
		if e.MetadataCIDRs, err = scopedList(d.metadataV4, d.metadataV6, ifindex); err != nil {
			return EndpointInfo{}, err
		}
	}
	if v.Flags&flagEgressRestricted != 0 {
		e.EgressCIDRs, err = scopedList(d.egressV4, d.egressV6, ifindex)
		if err != nil {
			return EndpointInfo{}, err
		}
		if e.EgressCIDRs == nil {
			e.EgressCIDRs = []netip.Prefix{}
		}
	}
	return e, nil
}

// Stats returns the tenant's drop counters.
func (m *Manager) Stats(tenant string) (Stats, error) {
	var s Stats
	if err := dnslabel.Check(tenant); err != nil {
		return s, fmt.Errorf("netpol: stats: tenant %q %w", tenant, err)
	}
	err := m.locked(context.Background(), func() error {
		id, err := lookupID(m.dp.tenantIDs, tenant)
		if err != nil {
			return fmt.Errorf("tenant %q %w", tenant, err)
		}
		if id == 0 {
			return fmt.Errorf("tenant %q: %w", tenant, ErrUnknownTenant)
		}
		drops, err := m.dp.dropCounts(id)
		s = Stats{Tenant: tenant, Drops: drops}
		return err
	})
	if err != nil {
		return Stats{}, fmt.Errorf("netpol: stats: %w", err)
	}
	return s, nil
}
