package telemetry

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

func deny(rule string) policy.Reason {
	return policy.Reason{Rule: rule, Message: "no", Enforcement: policy.EnforceDeny}
}

func TestDecided(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind string
		d    policy.Decision
		err  error
		// want is the one decisions_total series: kind, result, rule.
		want [3]string
		// hits are the rule_hits_total series: kind, rule, enforcement.
		hits [][3]string
	}{
		{
			name: "allow",
			kind: KindSandbox,
			d:    policy.Decision{Allow: true},
			want: [3]string{"sandbox", "allow", ""},
		},
		{
			name: "allow with a warning",
			kind: KindContainer,
			d:    policy.Decision{Allow: true, Reasons: []policy.Reason{{Rule: "workload.latest_tag", Enforcement: policy.EnforceWarn}}},
			want: [3]string{"container", "allow", ""},
			hits: [][3]string{{"container", "workload.latest_tag", "warn"}},
		},
		{
			name: "deny counts the decisive rule once",
			kind: KindUpdate,
			d: policy.Decision{Reasons: []policy.Reason{
				{Rule: "workload.latest_tag", Enforcement: policy.EnforceAudit},
				deny("quota.memory"),
				{Rule: "gpu.profile", Message: "no"}, // no enforcement: a deny
			}},
			want: [3]string{"update", "deny", "quota.memory"},
			hits: [][3]string{{"update", "workload.latest_tag", "audit"}, {"update", "quota.memory", "deny"}, {"update", "gpu.profile", "deny"}},
		},
		{
			name: "engine error with the engine's rule",
			kind: KindSandbox,
			d:    policy.Decision{Reasons: []policy.Reason{deny(policy.RuleUndefined)}},
			err:  errors.New("policy: revision r1: undefined"),
			want: [3]string{"sandbox", "error", "engine.undefined"},
			hits: [][3]string{{"sandbox", "engine.undefined", "deny"}},
		},
		{
			name: "engine error without a decision",
			kind: KindSandbox,
			err:  errors.New("policy: closed"),
			want: [3]string{"sandbox", "error", "engine.error"},
		},
		{
			name: "unknown kind is bounded",
			kind: "admission",
			d:    policy.Decision{Allow: true},
			want: [3]string{"other", "allow", ""},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(Options{})
			m.Decided(tc.kind, tc.d, tc.err)
			// Count the series first: reading one by its labels creates it.
			if n := testutil.CollectAndCount(m.decisions); n != 1 {
				t.Errorf("%d decisions_total series, want 1", n)
			}
			if n := testutil.CollectAndCount(m.ruleHits); n != len(tc.hits) {
				t.Errorf("%d rule_hits_total series, want %d", n, len(tc.hits))
			}
			if got := testutil.ToFloat64(m.decisions.WithLabelValues(tc.want[:]...)); got != 1 {
				t.Errorf("decisions_total%q = %g, want 1", tc.want, got)
			}
			for _, h := range tc.hits {
				if got := testutil.ToFloat64(m.ruleHits.WithLabelValues(h[:]...)); got != 1 {
					t.Errorf("rule_hits_total%q = %g, want 1", h, got)
				}
			}
		})
	}
}

func TestStartHistograms(t *testing.T) {
	m := NewMetrics(Options{})
	for _, d := range []time.Duration{50 * time.Microsecond, 3 * time.Millisecond, 4 * time.Second, 10 * time.Second} {
		m.Stage(policy.RuntimeRunc, "gpu", d)
	}
	m.Stage(policy.RuntimeGVisor, "decide", time.Millisecond)
	m.Started(policy.RuntimeRunc, "ok", 2*time.Second)
	m.Started(policy.RuntimeRunc, "refused", time.Millisecond)

	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ family, a, b string }
	counts := map[key]uint64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "bulkhead_node_start") {
			continue
		}
		for _, mt := range mf.GetMetric() {
			h := mt.GetHistogram()
			bs := h.GetBucket()
			if lo, hi := bs[0].GetUpperBound(), bs[len(bs)-1].GetUpperBound(); lo > 0.0001+1e-12 || hi < 5-1e-9 {
				t.Errorf("%s buckets span %g..%g s, want 0.1 ms..5 s", mf.GetName(), lo, hi)
			}
			ls := mt.GetLabel()
			counts[key{mf.GetName(), ls[0].GetValue(), ls[1].GetValue()}] = h.GetSampleCount()
		}
	}
	want := map[key]uint64{
		{"bulkhead_node_start_stage_seconds", "runc", "gpu"}:      4,
		{"bulkhead_node_start_stage_seconds", "gvisor", "decide"}: 1,
		{"bulkhead_node_start_seconds", "refused", "runc"}:        1, // labels sort: result, runtime
		{"bulkhead_node_start_seconds", "ok", "runc"}:             1,
	}
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%v: %d observations, want %d (all: %v)", k, counts[k], n, counts)
		}
	}
	if len(counts) != len(want) {
		t.Errorf("series %v, want %v", counts, want)
	}
}

func TestBundle(t *testing.T) {
	m := NewMetrics(Options{})
	if n, err := testutil.GatherAndCount(m.Registry, "bulkhead_node_bundle_info", "bulkhead_node_bundle_age_seconds", "bulkhead_node_bundle_loaded_timestamp_seconds"); err != nil || n != 0 {
		t.Fatalf("before any load: %d bundle series (%v), want none", n, err)
	}
	m.BundleReloadFailed(nil)
	m.BundleReloadFailed(errors.New("signature"))
	if got := testutil.ToFloat64(m.reloadFailures); got != 1 {
		t.Errorf("reload failures = %g, want 1 (a nil error counts nothing)", got)
	}

	m.BundleLoaded("r1", time.Now())
	loaded := time.Now().Add(-time.Hour)
	m.BundleLoaded("r2", loaded)
	err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP bulkhead_node_bundle_info 1 for the revision of the active policy bundle.
# TYPE bulkhead_node_bundle_info gauge
bulkhead_node_bundle_info{revision="r2"} 1
`), "bulkhead_node_bundle_info")
	if err != nil {
		t.Error(err)
	}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, mf := range mfs {
		if len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge() != nil {
			values[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if got, want := values["bulkhead_node_bundle_loaded_timestamp_seconds"], float64(loaded.UnixNano())/1e9; got != want {
		t.Errorf("loaded timestamp = %f, want %f", got, want)
	}
	// The age is computed at scrape: an hour, plus the time this test took.
	if age := values["bulkhead_node_bundle_age_seconds"]; age < 3600 || age > 3600+60 {
		t.Errorf("bundle age = %f s, want about 3600", age)
	}
}

// fakeFence and fakeNode are sources a test fills in; the agent's are the
// fence and the ledger.
type fakeFence struct {
	drops []FenceDrop
	err   error
}

func (f *fakeFence) Drops() ([]FenceDrop, error) { return f.drops, f.err }

type fakeNode struct {
	use    map[string]policy.Usage
	mig    map[int]int
	useErr error
}

func (f *fakeNode) QuotaUse() (map[string]policy.Usage, error) { return f.use, f.useErr }
func (f *fakeNode) MIGInstances() (map[int]int, error)         { return f.mig, nil }

func TestSources(t *testing.T) {
	fence := &fakeFence{drops: []FenceDrop{
		{Tenant: "acme", Reason: "tenant", Packets: 7},
		{Tenant: "acme", Reason: "egress", Packets: 0},
		{Tenant: "globex", Reason: "spoof", Packets: 2},
	}}
	node := &fakeNode{
		use: map[string]policy.Usage{"acme": {Sandboxes: 2, MemoryBytes: 1 << 30, GPUSlices: 3}},
		mig: map[int]int{0: 2, 3: 1},
	}
	m := NewMetrics(Options{Fence: fence, Node: node})
	err := testutil.GatherAndCompare(m.Registry, strings.NewReader(`
# HELP bulkhead_node_fence_drops_total Packets the eBPF tenant fence dropped, by tenant and reason (netpol.Reason), read from the fence's counters at scrape time.
# TYPE bulkhead_node_fence_drops_total counter
bulkhead_node_fence_drops_total{reason="egress",tenant="acme"} 0
bulkhead_node_fence_drops_total{reason="spoof",tenant="globex"} 2
bulkhead_node_fence_drops_total{reason="tenant",tenant="acme"} 7
# HELP bulkhead_node_quota_used What a tenant holds on the node, from the ledger at scrape time, by tenant and resource (sandboxes, memory_bytes, gpu_slices).
# TYPE bulkhead_node_quota_used gauge
bulkhead_node_quota_used{resource="gpu_slices",tenant="acme"} 3
bulkhead_node_quota_used{resource="memory_bytes",tenant="acme"} 1.073741824e+09
bulkhead_node_quota_used{resource="sandboxes",tenant="acme"} 2
# HELP bulkhead_node_mig_instances MIG instances held on the node, from the ledger at scrape time, by GPU index.
# TYPE bulkhead_node_mig_instances gauge
bulkhead_node_mig_instances{gpu="0"} 2
bulkhead_node_mig_instances{gpu="3"} 1
`), "bulkhead_node_fence_drops_total", "bulkhead_node_quota_used", "bulkhead_node_mig_instances")
	if err != nil {
		t.Error(err)
	}

	// Read at scrape time: a change shows at the next gather.
	fence.drops[0].Packets = 9
	if n := testutil.CollectAndCount(&fenceCollector{src: fence}, "bulkhead_node_fence_drops_total"); n != 3 {
		t.Errorf("%d fence drop series, want 3", n)
	}

	// A source that fails makes the gather fail for its series only.
	node.useErr = errors.New("ledger busy")
	mfs, err := m.Registry.Gather()
	if err == nil || !strings.Contains(err.Error(), "ledger busy") {
		t.Errorf("gather with a failing ledger: %v, want its error", err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	if got["bulkhead_node_quota_used"] || !got["bulkhead_node_mig_instances"] || !got["bulkhead_node_fence_drops_total"] {
		t.Errorf("families with a failing quota read: %v", got)
	}
}

// TestFenceLoaded: bulkhead_node_fence_loaded is 1 only while the fence's
// counters read; a node without a fence says 0 and fails no scrape, a
// fence whose maps do not read says 0 and fails its drop series.
func TestFenceLoaded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fence FenceSource
		// loaded is the gauge; drops the number of drop series; failed
		// whether the gather reports an error.
		loaded float64
		drops  int
		failed bool
	}{
		{name: "loaded", fence: &fakeFence{drops: []FenceDrop{{Tenant: "acme", Reason: "tenant", Packets: 1}}}, loaded: 1, drops: 1},
		{name: "loaded, no tenant yet", fence: &fakeFence{}, loaded: 1},
		{name: "netpol disabled", fence: &fakeFence{err: ErrNoFence}, loaded: 0},
		{name: "no source", fence: nil, loaded: 0},
		{name: "maps unreadable", fence: &fakeFence{err: errors.New("map gone")}, loaded: 0, failed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(Options{Fence: tc.fence})
			mfs, err := m.Registry.Gather()
			if (err != nil) != tc.failed {
				t.Errorf("gather error %v, want failed=%v", err, tc.failed)
			}
			loaded, drops := -1.0, 0
			for _, mf := range mfs {
				switch mf.GetName() {
				case "bulkhead_node_fence_loaded":
					loaded = mf.GetMetric()[0].GetGauge().GetValue()
				case "bulkhead_node_fence_drops_total":
					drops = len(mf.GetMetric())
				}
			}
			if loaded != tc.loaded || drops != tc.drops {
				t.Errorf("fence_loaded %v with %d drop series, want %v with %d", loaded, drops, tc.loaded, tc.drops)
			}
		})
	}
}

// statsOnly is what NetpolFence reads from a netpol.Manager or Reader.
type statsOnly []netpol.Stats

func (s statsOnly) DropStats() ([]netpol.Stats, error) { return s, nil }

func TestNetpolFence(t *testing.T) {
	drops := map[netpol.Reason]uint64{}
	for _, r := range netpol.Reasons() {
		drops[r] = 0
	}
	drops[netpol.ReasonRDMA] = 4
	f := NetpolFence(statsOnly{{Tenant: "acme", Drops: drops}})
	got, err := f.Drops()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(netpol.Reasons()) {
		t.Fatalf("%d drops, want one per reason (%d)", len(got), len(netpol.Reasons()))
	}
	for _, d := range got {
		want := uint64(0)
		if d.Reason == "rdma" {
			want = 4
		}
		if d.Tenant != "acme" || d.Packets != want {
			t.Errorf("%+v, want tenant acme, %d packets", d, want)
		}
	}
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Decided(KindSandbox, policy.Decision{}, nil)
	m.Stage("runc", "gpu", time.Second)
	m.Started("runc", "ok", time.Second)
	m.BundleLoaded("r", time.Now())
	m.BundleReloadFailed(errors.New("x"))
}
