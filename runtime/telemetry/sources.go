package telemetry

import (
	"errors"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// FenceDrop is one counter of the eBPF fence: packets dropped for a tenant
// for one reason, since the fence was first pinned on the node.
type FenceDrop struct {
	Tenant string
	// Reason is a netpol.Reason's name ("tenant", "egress", ...).
	Reason  string
	Packets uint64
}

// FenceSource reads the fence's drop counters at scrape time.
type FenceSource interface {
	// Drops reads the counters; ErrNoFence when the node runs no fence.
	Drops() ([]FenceDrop, error)
}

// ErrNoFence is what a FenceSource returns, tested with errors.Is, when the
// node runs no fence (netpol.enabled = false): bulkhead_node_fence_loaded
// is then 0 and there are no drop counters to read.
var ErrNoFence = errors.New("telemetry: the node runs no fence")

// NetpolFence reads the drop counters of a *netpol.Manager (or a
// *netpol.Reader) through its DropStats.
func NetpolFence(fence interface {
	DropStats() ([]netpol.Stats, error)
}) FenceSource {
	return netpolFence{fence}
}

type netpolFence struct {
	fence interface {
		DropStats() ([]netpol.Stats, error)
	}
}

func (f netpolFence) Drops() ([]FenceDrop, error) {
	stats, err := f.fence.DropStats()
	if err != nil {
		return nil, err
	}
	var out []FenceDrop
	for _, s := range stats {
		for _, r := range netpol.Reasons() {
			out = append(out, FenceDrop{Tenant: s.Tenant, Reason: r.String(), Packets: s.Drops[r]})
		}
	}
	return out, nil
}

// NodeSource reads what the node holds at scrape time, from the ledger.
type NodeSource interface {
	// QuotaUse is every tenant's usage on the node, by tenant.
	QuotaUse() (map[string]policy.Usage, error)
	// MIGInstances is the number of MIG instances held, by GPU index.
	MIGInstances() (map[int]int, error)
}

var (
	fenceLoadedDesc = prometheus.NewDesc("bulkhead_node_fence_loaded",
		"1 when the node's eBPF tenant fence is loaded and its maps answer at scrape time, 0 when the node runs no fence or its maps cannot be read.",
		nil, nil)
	fenceDropsDesc = prometheus.NewDesc("bulkhead_node_fence_drops_total",
		"Packets the eBPF tenant fence dropped, by tenant and reason (netpol.Reason), read from the fence's counters at scrape time.",
		[]string{"tenant", "reason"}, nil)
	quotaUsedDesc = prometheus.NewDesc("bulkhead_node_quota_used",
		"What a tenant holds on the node, from the ledger at scrape time, by tenant and resource (sandboxes, memory_bytes, gpu_slices).",
		[]string{"tenant", "resource"}, nil)
	migInstancesDesc = prometheus.NewDesc("bulkhead_node_mig_instances",
		"MIG instances held on the node, from the ledger at scrape time, by GPU index.",
		[]string{"gpu"}, nil)
)

// fenceCollector reports whether the fence is loaded and its counters. A
// failed read is an invalid metric, so the scrape says so while the other
// series are still served, and the fence counts as not loaded. A nil src
// is a node without a fence.
type fenceCollector struct{ src FenceSource }

func (c *fenceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fenceLoadedDesc
	ch <- fenceDropsDesc
}

func (c *fenceCollector) Collect(ch chan<- prometheus.Metric) {
	drops, err := []FenceDrop(nil), ErrNoFence
	if c.src != nil {
		drops, err = c.src.Drops()
	}
	loaded := 1.0
	if err != nil {
		loaded = 0
	}
	ch <- prometheus.MustNewConstMetric(fenceLoadedDesc, prometheus.GaugeValue, loaded)
	switch {
	case errors.Is(err, ErrNoFence):
		return
	case err != nil:
		ch <- prometheus.NewInvalidMetric(fenceDropsDesc, err)
		return
	}
	for _, d := range drops {
		ch <- prometheus.MustNewConstMetric(fenceDropsDesc, prometheus.CounterValue, float64(d.Packets), d.Tenant, d.Reason)
	}
}

// nodeCollector reports quota use and MIG instances.
type nodeCollector struct{ src NodeSource }

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- quotaUsedDesc
	ch <- migInstancesDesc
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	if use, err := c.src.QuotaUse(); err != nil {
		ch <- prometheus.NewInvalidMetric(quotaUsedDesc, err)
	} else {
		for tenant, u := range use {
			ch <- prometheus.MustNewConstMetric(quotaUsedDesc, prometheus.GaugeValue, float64(u.Sandboxes), tenant, "sandboxes")
			ch <- prometheus.MustNewConstMetric(quotaUsedDesc, prometheus.GaugeValue, float64(u.MemoryBytes), tenant, "memory_bytes")
			ch <- prometheus.MustNewConstMetric(quotaUsedDesc, prometheus.GaugeValue, float64(u.GPUSlices), tenant, "gpu_slices")
		}
	}
	if mig, err := c.src.MIGInstances(); err != nil {
		ch <- prometheus.NewInvalidMetric(migInstancesDesc, err)
	} else {
		for gpu, n := range mig {
			ch <- prometheus.MustNewConstMetric(migInstancesDesc, prometheus.GaugeValue, float64(n), strconv.Itoa(gpu))
		}
	}
}
