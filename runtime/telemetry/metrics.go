package telemetry

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Decision kinds, the kind label of bulkhead_node_decisions_total. A
// sandbox and a container are the policy's input kinds; an update is a
// resource update judged as one or the other.
const (
	KindSandbox   = policy.KindSandbox
	KindContainer = policy.KindContainer
	KindUpdate    = "update"
	// KindOther is the label of any other kind: the label stays bounded
	// whatever a caller passes.
	KindOther = "other"
)

// Decision results, the result label of bulkhead_node_decisions_total.
const (
	ResultAllow = "allow"
	ResultDeny  = "deny"
	ResultError = "error"
)

// startBuckets span 0.1 ms to 5 s: a policy decision takes well under a
// millisecond, a sandbox with a MIG instance seconds.
var startBuckets = prometheus.ExponentialBucketsRange(0.0001, 5, 16)

// Options configure NewMetrics.
type Options struct {
	// Fence is read at every scrape for bulkhead_node_fence_loaded and
	// bulkhead_node_fence_drops_total. Nil when the node runs no fence:
	// fence_loaded is then 0.
	Fence FenceSource
	// Node, when not nil, is read at every scrape for
	// bulkhead_node_quota_used and bulkhead_node_mig_instances.
	Node NodeSource
	// Health, when not nil, answers /healthz: an error makes it 503 with
	// the error's text. Nil answers 200 whenever Serve runs.
	Health func() error
}

// Metrics are the node agent's Prometheus series, on a registry of their
// own. A nil *Metrics records nothing.
type Metrics struct {
	// Registry holds every series; Handler serves it on /metrics.
	Registry *prometheus.Registry

	health func() error

	decisions      *prometheus.CounterVec
	ruleHits       *prometheus.CounterVec
	stages         *prometheus.HistogramVec
	starts         *prometheus.HistogramVec
	reloadFailures prometheus.Counter
	bundle         *bundleCollector
}

// NewMetrics registers the node's series, the collectors over opts.Fence
// (whether or not there is one) and opts.Node, and the Go and process collectors on a fresh registry.
func NewMetrics(opts Options) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		health:   opts.Health,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulkhead_node_decisions_total",
			Help: "Policy decisions made on the node, one per decision, by kind (sandbox, container, update, other), result (allow, deny, error) and rule (the decisive deny rule; \"\" when allowed).",
		}, []string{"kind", "result", "rule"}),
		ruleHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulkhead_node_rule_hits_total",
			Help: "Policy rules that fired in the node's decisions, every reason of every decision, by kind, rule and enforcement (deny, warn, audit).",
		}, []string{"kind", "rule", "enforcement"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bulkhead_node_start_stage_seconds",
			Help:    "Time taken by one stage of a sandbox create, by runtime (gvisor, runc) and stage.",
			Buckets: startBuckets,
		}, []string{"runtime", "stage"}),
		starts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "bulkhead_node_start_seconds",
			Help:    "Time taken by a whole sandbox create, by runtime (gvisor, runc) and result.",
			Buckets: startBuckets,
		}, []string{"runtime", "result"}),
		reloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "bulkhead_node_bundle_reload_failures_total",
			Help: "Policy bundle reloads refused; the active bundle stayed.",
		}),
		bundle: &bundleCollector{},
	}
	m.Registry.MustRegister(m.decisions, m.ruleHits, m.stages, m.starts, m.reloadFailures, m.bundle,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(&fenceCollector{src: opts.Fence})
	if opts.Node != nil {
		m.Registry.MustRegister(&nodeCollector{src: opts.Node})
	}
	return m
}

// kindLabel bounds the kind label.
func kindLabel(kind string) string {
	switch kind {
	case KindSandbox, KindContainer, KindUpdate:
		return kind
	}
	return KindOther
}

func isDeny(r policy.Reason) bool {
	return r.Enforcement == "" || r.Enforcement == policy.EnforceDeny
}

// Decided counts one decision of kind, as the policy engine returned it.
// An engine error (err not nil) is result "error", its rule the engine's
// fail-closed rule (policy.RuleError, RuleUndefined, RuleShape); a deny is
// labelled with its decisive rule, the first deny reason, which the bundle
// puts first. Every reason that fired is counted in rule_hits_total.
func (m *Metrics) Decided(kind string, d policy.Decision, err error) {
	if m == nil {
		return
	}
	kind = kindLabel(kind)
	var decisive string
	for _, r := range d.Reasons {
		enf := r.Enforcement
		if enf == "" {
			enf = policy.EnforceDeny
		}
		m.ruleHits.WithLabelValues(kind, r.Rule, enf).Inc()
		if decisive == "" && isDeny(r) {
			decisive = r.Rule
		}
	}
	switch {
	case err != nil:
		if decisive == "" {
			decisive = policy.RuleError
		}
		m.decisions.WithLabelValues(kind, ResultError, decisive).Inc()
	case d.Allow:
		m.decisions.WithLabelValues(kind, ResultAllow, "").Inc()
	default:
		m.decisions.WithLabelValues(kind, ResultDeny, decisive).Inc()
	}
}

// Stage observes one stage of a sandbox create (record, decide, reserve,
// gpu, sandbox, fence, activate) in runtime.
func (m *Metrics) Stage(runtime, stage string, d time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(runtime, stage).Observe(d.Seconds())
	}
}

// Started observes a whole sandbox create in runtime, from the first stage
// to the create's answer, by result (e.g. "ok", "refused", "error").
func (m *Metrics) Started(runtime, result string, d time.Duration) {
	if m != nil {
		m.starts.WithLabelValues(runtime, result).Observe(d.Seconds())
	}
}

// BundleLoaded records that the policy bundle at revision became active
// at at: bundle_info, bundle_loaded_timestamp_seconds and, from then on,
// bundle_age_seconds.
func (m *Metrics) BundleLoaded(revision string, at time.Time) {
	if m == nil {
		return
	}
	m.bundle.mu.Lock()
	defer m.bundle.mu.Unlock()
	m.bundle.revision, m.bundle.loadedAt = revision, at
}

// BundleReloadFailed counts a refused reload; a nil err counts nothing.
func (m *Metrics) BundleReloadFailed(err error) {
	if m != nil && err != nil {
		m.reloadFailures.Inc()
	}
}

var (
	bundleInfoDesc = prometheus.NewDesc("bulkhead_node_bundle_info",
		"1 for the revision of the active policy bundle.", []string{"revision"}, nil)
	bundleLoadedDesc = prometheus.NewDesc("bulkhead_node_bundle_loaded_timestamp_seconds",
		"When the active policy bundle was loaded, in seconds since the epoch.", nil, nil)
	bundleAgeDesc = prometheus.NewDesc("bulkhead_node_bundle_age_seconds",
		"Seconds since the active policy bundle was loaded, at scrape time.", nil, nil)
)

// bundleCollector reports the active bundle; nothing before the first load.
type bundleCollector struct {
	// mu guards revision and loadedAt.
	mu       sync.Mutex
	revision string
	loadedAt time.Time
}

func (c *bundleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bundleInfoDesc
	ch <- bundleLoadedDesc
	ch <- bundleAgeDesc
}

func (c *bundleCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	rev, at := c.revision, c.loadedAt
	c.mu.Unlock()
	if at.IsZero() {
		return
	}
	ch <- prometheus.MustNewConstMetric(bundleInfoDesc, prometheus.GaugeValue, 1, rev)
	ch <- prometheus.MustNewConstMetric(bundleLoadedDesc, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(bundleAgeDesc, prometheus.GaugeValue, time.Since(at).Seconds())
}
