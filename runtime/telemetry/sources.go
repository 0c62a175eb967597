package telemetry

import (
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
	Drops() ([]FenceDrop, error)
}

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

// fenceCollector reports the fence's counters; a failed read is an invalid
// metric, so the scrape says so while the other series are still served.
type fenceCollector struct{ src FenceSource }

func (c *fenceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- fenceDropsDesc }

func (c *fenceCollector) Collect(ch chan<- prometheus.Metric) {
	drops, err := c.src.Drops()
	if err != nil {
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
