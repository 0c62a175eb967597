package netpol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/bulkhead-runtime/bulkhead/internal/dnslabel"
)

// ErrAddressHeld is returned for a remote pod whose address the node
// already gives a tenant by other means: a pod of this node, or a
// single-address ClusterConfig.RemoteTenants range. Those win; the remote
// pod's entry is not written.
var ErrAddressHeld = errors.New("address held by a pod of this node or a configured remote range")

// RemotePod is one address of a pod on another node, as the API server
// describes it (the node agent keeps the set). It answers rule 11 of the
// package comment, as a pod of this node does: same tenant passes, another
// tenant drops (tenant). An in-cluster address that is neither a pod of
// this node nor a remote pod is owned by no tenant (rule 14).
type RemotePod struct {
	// Addr is one of the pod's addresses (status.podIPs): a unicast IPv4
	// or IPv6 address, not link-local. A dual-stack pod is two RemotePods.
	Addr netip.Addr
	// Tenant names the pod's tenant: a DNS-1123 label, as Endpoint.Tenant.
	Tenant string
	// AllowRDMA says the pod holds the RDMA grant: RoCEv2 with it passes
	// between pods of one tenant that both hold it (rule 11).
	AllowRDMA bool
}

func (r RemotePod) validate() error {
	a := r.Addr
	if !a.IsValid() {
		return errors.New("remote pod: Addr is not a valid address")
	}
	if err := checkPeerAddr(a, "a unicast, non-link-local pod address"); err != nil {
		return fmt.Errorf("remote pod %s: %w", a, err)
	}
	if err := dnslabel.Check(r.Tenant); err != nil {
		return fmt.Errorf("remote pod %s: Tenant %q %w", a, r.Tenant, err)
	}
	return nil
}

// SetRemote makes the fence's remote pods exactly pods: every address in
// pods is given its pod's tenant, and every remote pod address not in pods
// is removed (it is an unknown cluster address again). Each address moves
// from its old tenant to its new one in a single map update, so a reused
// address never passes through a moment where it carries the old tenant
// once SetRemote returns, nor one where another address is affected.
// The set as a whole is not replaced atomically: while SetRemote runs,
// some addresses have their new entry and others their old one.
//
// Addresses the node holds otherwise (ErrAddressHeld) are skipped and
// named in the returned error, after every other address was applied. An
// invalid pod, or two pods of one address with different tenants, refuses
// the whole call before anything changes.
func (m *Manager) SetRemote(ctx context.Context, pods []RemotePod) error {
	want := make(map[netip.Addr]RemotePod, len(pods))
	for _, p := range pods {
		if err := p.validate(); err != nil {
			return fmt.Errorf("netpol: set remote pods: %w", err)
		}
		if prev, ok := want[p.Addr]; ok && prev != p {
			return fmt.Errorf("netpol: set remote pods: address %s given twice (tenant %q and %q)", p.Addr, prev.Tenant, p.Tenant)
		}
		want[p.Addr] = p
	}
	var held []error
	err := m.locked(ctx, func() error {
		have, err := m.dp.owners()
		if err != nil {
			return err
		}
		for _, a := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
			err := m.putRemoteLocked(want[a], have)
			if errors.Is(err, ErrAddressHeld) {
				held = append(held, err)
				continue
			}
			if err != nil {
				return err
			}
		}
		for p, o := range have {
			if o.Flags&flagRemotePod == 0 {
				continue
			}
			if _, ok := want[p.Addr()]; ok {
				continue
			}
			if err := m.dp.deleteOwner(p); err != nil {
				return fmt.Errorf("remote pod %s: %w", p.Addr(), err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netpol: set remote pods: %w", err)
	}
	if held != nil {
		return fmt.Errorf("netpol: set remote pods: %w", errors.Join(held...))
	}
	return nil
}

// UpsertRemote gives the remote pod's address its tenant, replacing what a
// previous pod of that address had in one map update.
func (m *Manager) UpsertRemote(ctx context.Context, pod RemotePod) error {
	if err := pod.validate(); err != nil {
		return fmt.Errorf("netpol: upsert remote pod: %w", err)
	}
	err := m.locked(ctx, func() error {
		p := netip.PrefixFrom(pod.Addr, pod.Addr.BitLen())
		o, ok, err := m.dp.ownerOf(p)
		if err != nil {
			return err
		}
		have := map[netip.Prefix]owner{}
		if ok {
			have[p] = o
		}
		return m.putRemoteLocked(pod, have)
	})
	if err != nil {
		return fmt.Errorf("netpol: upsert remote pod: %w", err)
	}
	return nil
}

// DeleteRemote removes the remote pod entry of addr, if there is one: the
// address is an unknown cluster address again. An address the node holds
// otherwise (a pod of this node, a configured range) is left alone.
func (m *Manager) DeleteRemote(ctx context.Context, addr netip.Addr) error {
	if !addr.IsValid() {
		return errors.New("netpol: delete remote pod: not a valid address")
	}
	err := m.locked(ctx, func() error {
		p := netip.PrefixFrom(addr, addr.BitLen())
		o, ok, err := m.dp.ownerOf(p)
		if err != nil || !ok || o.Flags&flagRemotePod == 0 {
			return err
		}
		return m.dp.deleteOwner(p)
	})
	if err != nil {
		return fmt.Errorf("netpol: delete remote pod %s: %w", addr, err)
	}
	return nil
}

// RemotePods lists the fence's remote pods, ordered by address.
func (m *Manager) RemotePods() ([]RemotePod, error) {
	var out []RemotePod
	err := m.locked(context.Background(), func() error {
		have, err := m.dp.owners()
		if err != nil {
			return err
		}
		for p, o := range have {
			if o.Flags&flagRemotePod == 0 {
				continue
			}
			tenant, err := nameOf(m.dp.tenantIDs, o.Tenant)
			if err != nil {
				return err
			}
			out = append(out, RemotePod{Addr: p.Addr(), Tenant: tenant, AllowRDMA: o.Flags&flagRDMA != 0})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netpol: remote pods: %w", err)
	}
	slices.SortFunc(out, func(a, b RemotePod) int { return a.Addr.Compare(b.Addr) })
	return out, nil
}

// putRemoteLocked writes pod's entry in the owner hash. have holds at
// least the current entry of pod's address, if any. Caller holds the lock.
func (m *Manager) putRemoteLocked(pod RemotePod, have map[netip.Prefix]owner) error {
	p := netip.PrefixFrom(pod.Addr, pod.Addr.BitLen())
	if cur, ok := have[p]; ok && cur.Flags&flagRemotePod == 0 {
		return fmt.Errorf("remote pod %s (tenant %s): %w", pod.Addr, pod.Tenant, ErrAddressHeld)
	}
	id, err := allocateID(m.dp.tenantIDs, pod.Tenant, maxTenantID)
	if err != nil {
		return fmt.Errorf("remote pod %s: tenant %s: %w", pod.Addr, pod.Tenant, err)
	}
	o := owner{Tenant: id, Flags: flagRemote | flagRemotePod}
	if pod.AllowRDMA {
		o.Flags |= flagRDMA
	}
	if err := m.dp.putOwner(p, o); err != nil {
		return fmt.Errorf("remote pod %s: %w", pod.Addr, err)
	}
	return nil
}
