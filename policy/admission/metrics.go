package admission

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results counted by Metrics.
const (
	ResultAllowed = "allowed"
	ResultDenied  = "denied"
	ResultError   = "error"
)

// Metrics are the webhook's Prometheus series. A nil *Metrics records nothing.
type Metrics struct {
	// Registry holds every series below; serve it on /metrics.
	Registry *prometheus.Registry

	decisions  *prometheus.CounterVec
	rules      *prometheus.CounterVec
	latency    prometheus.Histogram
	badRequest *prometheus.CounterVec
	revision   *prometheus.GaugeVec

	// mu serialises changes of the revision series; current holds the
	// revision label set to 1, read without the lock on the hot path.
	mu      sync.Mutex
	current atomic.Pointer[string]
}

// NewMetrics registers the webhook's series, plus the Go and process
// collectors, on a fresh registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulkhead_webhook_decisions_total",
			Help: "Admission reviews answered, by result (allowed, denied, error) and object kind (the reviewed kinds by name, every other as \"other\").",
		}, []string{"result", "kind"}),
		rules: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulkhead_webhook_rule_hits_total",
			Help: "Policy rules that fired in admission reviews, by rule id and enforcement (deny, warn, audit).",
		}, []string{"rule", "enforcement"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "bulkhead_webhook_review_duration_seconds",
			Help:    "Time from a complete request body to an encoded AdmissionReview response.",
			Buckets: prometheus.ExponentialBuckets(0.000125, 2, 16),
		}),
		badRequest: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bulkhead_webhook_bad_requests_total",
			Help: "Requests refused before review, by reason (method, content_type, too_large, read_timeout, buffer_full, malformed, cancelled, encode).",
		}, []string{"reason"}),
		revision: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "bulkhead_webhook_bundle_revision_info",
			Help: "1 for the revision of the policy bundle that made the latest decision.",
		}, []string{"revision"}),
	}
	m.Registry.MustRegister(m.decisions, m.rules, m.latency, m.badRequest, m.revision,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// WatchCertificate exports certs' expiry as
// bulkhead_webhook_certificate_expiry_timestamp_seconds, read at scrape
// time. The scrape first reloads the pair if its files changed, as the next
// handshake would, so that a renewed Secret shows before any client
// connects; a pair that fails to load leaves the served one, and its
// expiry, in place. Call it once per Metrics.
func (m *Metrics) WatchCertificate(certs *CertReloader) {
	m.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "bulkhead_webhook_certificate_expiry_timestamp_seconds",
		Help: "When the serving certificate expires (its notAfter), in seconds since the epoch.",
	}, func() float64 {
		if err := certs.Reload(); err != nil {
			certs.logger.Warn("tls certificate reload failed; serving the previous one", "err", err)
		}
		return float64(certs.NotAfter().Unix())
	}))
}

// Kinds of bulkhead_webhook_certificate_rotations_total.
const (
	RotationServing = "serving"
	RotationCA      = "ca"
)

// WatchRotator exports r's counts, read at scrape time:
//
//	bulkhead_webhook_certificate_rotations_total{kind}  certificates this replica issued and stored
//	bulkhead_webhook_cabundle_repairs_total             caBundles it wrote back
//
// Both kinds are exported from the start, at 0. A nil r exports nothing
// (certificates from files). Call it once per Metrics.
func (m *Metrics) WatchRotator(r *Rotator) {
	if m == nil || r == nil {
		return
	}
	for _, c := range []struct {
		kind string
		n    *atomic.Uint64
	}{{RotationServing, &r.servingIssued}, {RotationCA, &r.caIssued}} {
		m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "bulkhead_webhook_certificate_rotations_total",
			Help:        "Certificates this replica issued and stored in the rotator's Secret, by kind (serving, ca); the Secret's first pair counts one of each.",
			ConstLabels: prometheus.Labels{"kind": c.kind},
		}, func() float64 { return float64(c.n.Load()) }))
	}
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "bulkhead_webhook_cabundle_repairs_total",
		Help: "Times this replica wrote its CA bundle back into the ValidatingWebhookConfiguration after someone removed or changed a caBundle that held it.",
	}, func() float64 { return float64(r.repairs.Load()) }))
}

// KindOther is the kind label of every decision about a kind the webhook
// does not review: the kind comes from the request, and a label value per
// made-up kind would grow the series without bound.
const KindOther = "other"

// kindLabels are the kind label values: the kinds Review judges, by name.
var kindLabels = func() map[string]string {
	out := map[string]string{}
	for _, k := range append(SupportedKinds(), ClaimKinds()...) {
		out[k.Kind] = k.Kind
	}
	return out
}()

// kindLabel bounds the kind label to the reviewed kinds and KindOther.
func kindLabel(kind string) string {
	if l, ok := kindLabels[kind]; ok {
		return l
	}
	return KindOther
}

func (m *Metrics) observeDecision(result, kind string) {
	if m != nil {
		m.decisions.WithLabelValues(result, kindLabel(kind)).Inc()
	}
}

func (m *Metrics) observeRule(rule, enforcement string) {
	if m != nil {
		m.rules.WithLabelValues(rule, enforcement).Inc()
	}
}

func (m *Metrics) observeLatency(d time.Duration) {
	if m != nil {
		m.latency.Observe(d.Seconds())
	}
}

func (m *Metrics) observeBadRequest(reason string) {
	if m != nil {
		m.badRequest.WithLabelValues(reason).Inc()
	}
}

// observeRevision sets the bundle revision series; one label value at a time.
func (m *Metrics) observeRevision(rev string) {
	if m == nil || rev == "" {
		return
	}
	if cur := m.current.Load(); cur != nil && *cur == rev {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.current.Load(); cur != nil {
		if *cur == rev {
			return
		}
		m.revision.DeleteLabelValues(*cur)
	}
	m.revision.WithLabelValues(rev).Set(1)
	m.current.Store(&rev)
}
