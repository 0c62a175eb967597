package netpol

import (
	"context"
	"fmt"
	"sort"
)

// DropStats returns the drop counters of every tenant the fence has a name
// for (a local pod's or a ClusterConfig.RemoteTenants range's), ordered by
// tenant. It reads what Stats reads, for all tenants at once, so that a
// metrics scrape needs no list of tenants.
func (m *Manager) DropStats() ([]Stats, error) {
	var out []Stats
	err := m.locked(context.Background(), func() error {
		var err error
		out, err = m.dp.allDropStats()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netpol: drop stats: %w", err)
	}
	return out, nil
}

// DropStats returns every tenant's drop counters, ordered by tenant, as
// Manager.DropStats does.
func (r *Reader) DropStats() ([]Stats, error) {
	out, err := r.dp.allDropStats()
	if err != nil {
		return nil, fmt.Errorf("netpol: drop stats: %w", err)
	}
	return out, nil
}

// allDropStats walks the tenant names and sums each one's counters.
func (d *datapath) allDropStats() ([]Stats, error) {
	var (
		key nameKey
		id  uint32
	)
	ids := map[string]uint32{}
	it := d.tenantIDs.Iterate()
	for it.Next(&key, &id) {
		ids[keyToName(key)] = id
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("tenant names: %w", err)
	}
	out := make([]Stats, 0, len(ids))
	for tenant, id := range ids {
		drops, err := d.dropCounts(id)
		if err != nil {
			return nil, fmt.Errorf("tenant %q: %w", tenant, err)
		}
		out = append(out, Stats{Tenant: tenant, Drops: drops})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}
