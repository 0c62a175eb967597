package netpol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// The value of a cluster_v4/cluster_v6 entry says who put it there, one bit
// each, so that neither replaces the other's: the programs test only that
// an entry exists. A prefix both hold carries both bits and stays until
// both let it go.
const (
	// clusterConfigured: ClusterConfig.ClusterCIDRs or this node's own
	// addresses, written by configure (fences pinned before the bits
	// existed hold 1 everywhere: configured).
	clusterConfigured uint8 = 1 << 0
	// clusterNode: another node's address, learned by the node agent
	// (Manager.SetRemoteNodes).
	clusterNode uint8 = 1 << 1
)

// checkNodeAddr refuses what cannot be another node's address.
func checkNodeAddr(a netip.Addr) error {
	if !a.IsValid() {
		return errors.New("not a valid address")
	}
	if err := checkPeerAddr(a, "a unicast address, not loopback or link-local"); err != nil {
		return fmt.Errorf("node address %s: %w", a, err)
	}
	return nil
}

// checkPeerAddr refuses what cannot be a peer the agent names by one
// address (another node, a pod of another node): the why, for the caller
// to prefix with what the address is; unicast says what it must be.
func checkPeerAddr(a netip.Addr, unicast string) error {
	switch {
	case !a.IsValid():
		return errors.New("not a valid address")
	case a.Is4In6():
		return errors.New("an IPv4-mapped IPv6 address; give the IPv4 address")
	case a.Zone() != "":
		return errors.New("an address with a zone")
	case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast():
		return errors.New("must be " + unicast)
	}
	return nil
}

// SetRemoteNodes makes the addresses of the other nodes of the cluster
// (their InternalIP and ExternalIP, as the node agent learns them from the
// API server) exactly addrs. Each is in the cluster and owned by no tenant
// (rule 14 of the package comment), as this node's own addresses are: a
// host-network pod, a NodePort masqueraded on that node or its kubelet
// reaches a pod from them, from any tenant, so only a tier that lists them
// as shared services exchanges packets with them. Without this an address
// of another node outside ClusterConfig.ClusterCIDRs is "outside the
// cluster" and passes rule 15.
//
// The learned addresses are kept apart from the configured ranges: a new
// ClusterConfig (Open with Options.Cluster) leaves them, and SetRemoteNodes
// never removes a configured range or this node's own addresses. An address
// a configured range already covers still gets its entry, so that a
// ClusterConfig that narrows the ranges cannot let it out of the cluster
// before the agent's next call. New addresses are written before stale
// ones are removed. An invalid address refuses the whole call before
// anything changes.
func (m *Manager) SetRemoteNodes(ctx context.Context, addrs []netip.Addr) error {
	want := make(map[netip.Prefix]bool, len(addrs))
	for i, a := range addrs {
		if err := checkNodeAddr(a); err != nil {
			return fmt.Errorf("netpol: set remote nodes: addrs[%d]: %w", i, err)
		}
		want[netip.PrefixFrom(a, a.BitLen())] = true
	}
	err := m.locked(ctx, func() error {
		return m.dp.replaceClusterBit(clusterNode, slices.SortedFunc(maps.Keys(want), netip.Prefix.Compare))
	})
	if err != nil {
		return fmt.Errorf("netpol: set remote nodes: %w", err)
	}
	return nil
}

// RemoteNodes lists the other nodes' addresses that SetRemoteNodes put in
// the cluster, ordered.
func (m *Manager) RemoteNodes() ([]netip.Addr, error) {
	var out []netip.Addr
	err := m.locked(context.Background(), func() error {
		var err error
		out, err = m.dp.remoteNodes()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netpol: remote nodes: %w", err)
	}
	return out, nil
}

// RemoteNodes lists the other nodes' addresses in the cluster
// (Manager.SetRemoteNodes), ordered, without the fence's lock: the set may
// be mid-change.
func (r *Reader) RemoteNodes() ([]netip.Addr, error) {
	out, err := r.dp.remoteNodes()
	if err != nil {
		return nil, fmt.Errorf("netpol: remote nodes: %w", err)
	}
	return out, nil
}

func (d *datapath) remoteNodes() ([]netip.Addr, error) {
	have, err := d.clusterEntries()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for p, v := range have {
		if v&clusterNode != 0 {
			out = append(out, p.Addr())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// replaceCluster makes the configured entries of the in-cluster tries
// exactly want; the learned ones (clusterNode) stay.
func (d *datapath) replaceCluster(want []netip.Prefix) error {
	return d.replaceClusterBit(clusterConfigured, want)
}

// replaceClusterBit makes bit set on exactly the entries of want in the
// in-cluster tries: it adds bit to each prefix of want (creating the entry
// when missing), then clears it elsewhere, deleting an entry left with no
// bit. The other bits are untouched.
func (d *datapath) replaceClusterBit(bit uint8, want []netip.Prefix) error {
	have, err := d.clusterEntries()
	if err != nil {
		return err
	}
	keep := make(map[netip.Prefix]bool, len(want))
	for _, p := range want {
		p = p.Masked()
		keep[p] = true
		if v, ok := have[p]; ok && v&bit != 0 {
			continue
		}
		if err := d.putCluster(p, have[p]|bit); err != nil {
			return fmt.Errorf("cluster entry %s: %w", p, err)
		}
	}
	for p, v := range have {
		if keep[p] || v&bit == 0 {
			continue
		}
		if v &^= bit; v != 0 {
			err = d.putCluster(p, v)
		} else {
			err = d.deleteCluster(p)
		}
		if err != nil {
			return fmt.Errorf("cluster entry %s: %w", p, err)
		}
	}
	return nil
}

// clusterEntries lists the in-cluster tries: prefix -> bits.
func (d *datapath) clusterEntries() (map[netip.Prefix]uint8, error) {
	out := map[netip.Prefix]uint8{}
	var (
		k4  lpmKeyV4
		k6  lpmKeyV6
		val uint8
	)
	it := d.clusterV4.Iterate()
	for it.Next(&k4, &val) {
		out[netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen))] = val
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	it = d.clusterV6.Iterate()
	for it.Next(&k6, &val) {
		out[netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen))] = val
	}
	return out, it.Err()
}

func (d *datapath) putCluster(p netip.Prefix, bits uint8) error {
	if p.Addr().Is4() {
		return d.clusterV4.Update(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}, bits, ebpf.UpdateAny)
	}
	return d.clusterV6.Update(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}, bits, ebpf.UpdateAny)
}

func (d *datapath) deleteCluster(p netip.Prefix) error {
	if p.Addr().Is4() {
		return ignoreNotExist(d.clusterV4.Delete(lpmKeyV4{uint32(p.Bits()), p.Addr().As4()}))
	}
	return ignoreNotExist(d.clusterV6.Delete(lpmKeyV6{uint32(p.Bits()), p.Addr().As16()}))
}
