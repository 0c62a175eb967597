package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// The audit re-judges the pods already running against the bundle revision
// in force, as Gatekeeper's audit does: a revision that tightens a tier
// refuses new pods at once, and the audit says which running pods it would
// now refuse and why. It judges each pod exactly as a CREATE of that pod
// would be judged (the same input, the same claims read), except quotas:
// usage is left zero, because the running pods are the usage, and the
// ledger reconciles with them on its own (quota.go). It refuses nothing and
// changes nothing.

// DefaultAuditChunk is how many pods one LIST returns: the API server
// serves a large cluster's pods in pages rather than one response.
const DefaultAuditChunk = 500

// DefaultAuditInterval is how often the webhook audits: a minute, as
// Gatekeeper's audit, for one LIST of every pod in pages.
const DefaultAuditInterval = time.Minute

// DefaultAuditExcluded are the namespaces the shipped
// ValidatingWebhookConfiguration does not send to the webhook, and so the
// namespaces the audit leaves out.
var DefaultAuditExcluded = []string{"kube-system", "bulkhead-system"}

// PodSource lists the pods an audit judges, whole: the usage informer's
// pods are trimmed to what quotas read (trimPod).
type PodSource interface {
	// EachPod calls fn for every pod, in pages; fn's error stops it.
	EachPod(ctx context.Context, fn func(*corev1.Pod) error) error
}

// APIPods lists pods from the API server in chunks of Chunk.
type APIPods struct {
	Client kubernetes.Interface
	// Chunk is the page size; 0 means DefaultAuditChunk.
	Chunk int64
}

// EachPod pages through every namespace's pods.
func (a APIPods) EachPod(ctx context.Context, fn func(*corev1.Pod) error) error {
	chunk := a.Chunk
	if chunk <= 0 {
		chunk = DefaultAuditChunk
	}
	opts := metav1.ListOptions{Limit: chunk}
	for {
		list, err := a.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return fmt.Errorf("listing pods: %w", err)
		}
		for i := range list.Items {
			if err := fn(&list.Items[i]); err != nil {
				return err
			}
		}
		if list.Continue == "" {
			return nil
		}
		opts.Continue = list.Continue
	}
}

// APIHandlers resolves RuntimeClass handlers with a GET each, for one-off
// audits that run no informer (the CLI).
type APIHandlers struct{ Client kubernetes.Interface }

// Handler returns the named RuntimeClass's handler.
func (h APIHandlers) Handler(name string) (string, error) {
	rc, err := h.Client.NodeV1().RuntimeClasses().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return rc.Handler, nil
}

// APIClaims reads claims and claim templates with a GET each.
type APIClaims struct{ Client kubernetes.Interface }

// ClaimSpec implements ClaimReader.
func (c APIClaims) ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error) {
	ctx := context.Background()
	if template {
		t, err := c.Client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return &t.Spec.Spec, nil
	}
	cl, err := c.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return &cl.Spec, nil
}

// AuditOptions configure an Auditor.
type AuditOptions struct {
	// Decider is the policy, as the webhook decides with it; required.
	Decider policy.Decider
	// Pods lists the pods to judge; required.
	Pods PodSource
	// Handlers and Claims are read as in a review (Options).
	Handlers HandlerResolver
	Claims   ClaimReader
	// Excluded namespaces are not judged (DefaultAuditExcluded when nil;
	// an empty, non-nil slice judges every namespace).
	Excluded []string
	// MaxFindings caps the refused pods a report lists (every one is
	// counted); 0 means 1000.
	MaxFindings int
	// Logger reports failed runs; nil logs nothing.
	Logger *slog.Logger
}

// AuditFinding is a running pod the bundle in force would refuse, or could
// not judge.
type AuditFinding struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Tenant    string `json:"tenant,omitempty"`
	Tier      string `json:"tier,omitempty"`
	// Reasons are the deny-level reasons, in the decision's order.
	Reasons []policy.Reason `json:"reasons,omitempty"`
	// Error is why the pod could not be judged (an input the webhook
	// would refuse as unreadable, a failed evaluation).
	Error string `json:"error,omitempty"`
}

// AuditReport is one audit run.
type AuditReport struct {
	// Revision is the bundle revision the pods were judged against.
	Revision string    `json:"revision"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Pods is how many pods were judged; Refused and Errors how many of
	// them the bundle would refuse or could not judge.
	Pods    int `json:"pods"`
	Refused int `json:"refused"`
	Errors  int `json:"errors"`
	// ByRule counts refused pods per rule (a pod refused by two rules
	// counts under both), by tenant.
	ByRule map[string]map[string]int `json:"byRule,omitempty"`
	// Findings lists refused and unjudged pods, sorted by namespace and
	// name, up to MaxFindings; Truncated says that more were counted.
	Findings  []AuditFinding `json:"findings,omitempty"`
	Truncated bool           `json:"truncated,omitempty"`
}

// Auditor runs audits. It is safe for concurrent use.
type Auditor struct {
	opts     AuditOptions
	excluded map[string]bool

	// mu guards last, the latest completed run.
	mu   sync.Mutex
	last *AuditReport
}

// NewAuditor checks opts and returns an Auditor.
func NewAuditor(opts AuditOptions) (*Auditor, error) {
	if opts.Decider == nil {
		return nil, errors.New("admission: AuditOptions.Decider is required")
	}
	if opts.Pods == nil {
		return nil, errors.New("admission: AuditOptions.Pods is required")
	}
	if opts.MaxFindings < 0 {
		return nil, fmt.Errorf("admission: AuditOptions.MaxFindings %d must not be negative", opts.MaxFindings)
	}
	if opts.MaxFindings == 0 {
		opts.MaxFindings = 1000
	}
	if opts.Excluded == nil {
		opts.Excluded = DefaultAuditExcluded
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	a := &Auditor{opts: opts, excluded: map[string]bool{}}
	for _, ns := range opts.Excluded {
		a.excluded[ns] = true
	}
	return a, nil
}

// SplitList splits a comma-separated flag value (--audit-exclude-namespaces,
// the CLI's --exclude-namespaces), dropping empty items.
func SplitList(v string) []string {
	out := []string{}
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// judged reports whether the audit judges p: a pod that has not finished
// and is not being deleted, outside the excluded namespaces.
func (a *Auditor) judged(p *corev1.Pod) bool {
	if a.excluded[p.Namespace] || p.DeletionTimestamp != nil {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// Run judges every pod once and returns the report; the error is set when
// the pods could not be listed (the report then holds what was judged).
func (a *Auditor) Run(ctx context.Context) (AuditReport, error) {
	rep := AuditReport{Started: time.Now(), ByRule: map[string]map[string]int{}}
	var findings []AuditFinding
	err := a.opts.Pods.EachPod(ctx, func(p *corev1.Pod) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !a.judged(p) {
			return nil
		}
		rep.Pods++
		f, dec, refused := a.judge(ctx, p)
		if dec.Revision != "" {
			rep.Revision = dec.Revision
		}
		switch {
		case f.Error != "":
			rep.Errors++
		case refused:
			rep.Refused++
			seen := map[string]bool{}
			for _, r := range f.Reasons {
				if seen[r.Rule] {
					continue
				}
				seen[r.Rule] = true
				if rep.ByRule[r.Rule] == nil {
					rep.ByRule[r.Rule] = map[string]int{}
				}
				rep.ByRule[r.Rule][f.Tenant]++
			}
		default:
			return nil
		}
		findings = append(findings, f)
		return nil
	})
	rep.Finished = time.Now()
	sort.Slice(findings, func(i, j int) bool {
		if findings[i].Namespace != findings[j].Namespace {
			return findings[i].Namespace < findings[j].Namespace
		}
		return findings[i].Pod < findings[j].Pod
	})
	if len(findings) > a.opts.MaxFindings {
		findings, rep.Truncated = findings[:a.opts.MaxFindings], true
	}
	rep.Findings = findings
	if err == nil {
		a.mu.Lock()
		a.last = &rep
		a.mu.Unlock()
	}
	return rep, err
}

// judge decides p as a CREATE of it would be decided.
func (a *Auditor) judge(ctx context.Context, p *corev1.Pod) (AuditFinding, policy.Decision, bool) {
	f := AuditFinding{Namespace: p.Namespace, Pod: p.Name}
	raw, err := json.Marshal(p)
	if err != nil {
		f.Error = err.Error()
		return f, policy.Decision{}, false
	}
	pod, err := podOf(kindPod, raw)
	if err != nil {
		f.Error = err.Error()
		return f, policy.Decision{}, false
	}
	in, err := inputFor(p.Namespace, pod, a.opts.Handlers)
	if err != nil {
		f.Error = err.Error()
		return f, policy.Decision{}, false
	}
	readClaims(p.Namespace, in.Pod.ResourceClaims, a.opts.Claims)
	dec, err := a.opts.Decider.Decide(ctx, in)
	f.Tenant, f.Tier = dec.Tenant, dec.Tier
	if err != nil {
		f.Error = "policy evaluation failed: " + err.Error()
		return f, dec, false
	}
	if dec.Allow {
		return f, dec, false
	}
	f.Reasons = deniesOf(dec.Reasons)
	if len(f.Reasons) == 0 {
		f.Reasons = []policy.Reason{{Rule: RulePolicyUndefined, Message: "the policy refused without naming a rule (fail closed)"}}
	}
	return f, dec, true
}

// Last returns the latest completed run; ok is false before the first.
func (a *Auditor) Last() (rep AuditReport, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		return AuditReport{}, false
	}
	return *a.last, true
}

// Loop runs an audit every interval until ctx ends, the first at once.
func (a *Auditor) Loop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := a.Run(ctx)
		if err != nil && ctx.Err() == nil {
			a.opts.Logger.Warn("audit run failed; the previous report stands", "err", err, "pods_judged", rep.Pods)
		} else if err == nil {
			a.opts.Logger.Info("audit", "revision", rep.Revision, "pods", rep.Pods, "refused", rep.Refused, "errors", rep.Errors,
				"took", rep.Finished.Sub(rep.Started).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// WatchAudit exports a's latest completed run, read at scrape time:
//
//	bulkhead_audit_refused_pods{tenant,rule}  running pods the bundle would now refuse
//	bulkhead_audit_pods                       pods judged
//	bulkhead_audit_errors                     pods that could not be judged
//	bulkhead_audit_last_run_timestamp_seconds when the run finished
//	bulkhead_audit_bundle_revision_info{revision}
//
// Before the first run only the timestamp is exported, as 0. Call it once
// per Metrics.
func (m *Metrics) WatchAudit(a *Auditor) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(auditCollector{a})
}

type auditCollector struct{ a *Auditor }

var (
	auditRefusedDesc = prometheus.NewDesc("bulkhead_audit_refused_pods",
		"Running pods the bundle revision in force would refuse, by tenant and rule, at the latest audit.", []string{"tenant", "rule"}, nil)
	auditPodsDesc = prometheus.NewDesc("bulkhead_audit_pods",
		"Running pods judged by the latest audit.", nil, nil)
	auditErrorsDesc = prometheus.NewDesc("bulkhead_audit_errors",
		"Running pods the latest audit could not judge.", nil, nil)
	auditLastDesc = prometheus.NewDesc("bulkhead_audit_last_run_timestamp_seconds",
		"When the latest completed audit finished, in seconds since the epoch; 0 before the first.", nil, nil)
	auditRevisionDesc = prometheus.NewDesc("bulkhead_audit_bundle_revision_info",
		"1 for the bundle revision the latest audit judged against.", []string{"revision"}, nil)
)

func (c auditCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{auditRefusedDesc, auditPodsDesc, auditErrorsDesc, auditLastDesc, auditRevisionDesc} {
		ch <- d
	}
}

func (c auditCollector) Collect(ch chan<- prometheus.Metric) {
	rep, ok := c.a.Last()
	if !ok {
		ch <- prometheus.MustNewConstMetric(auditLastDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(auditLastDesc, prometheus.GaugeValue, float64(rep.Finished.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(auditPodsDesc, prometheus.GaugeValue, float64(rep.Pods))
	ch <- prometheus.MustNewConstMetric(auditErrorsDesc, prometheus.GaugeValue, float64(rep.Errors))
	if rep.Revision != "" {
		ch <- prometheus.MustNewConstMetric(auditRevisionDesc, prometheus.GaugeValue, 1, rep.Revision)
	}
	rules := make([]string, 0, len(rep.ByRule))
	for r := range rep.ByRule {
		rules = append(rules, r)
	}
	slices.Sort(rules)
	for _, r := range rules {
		for tenant, n := range rep.ByRule[r] {
			ch <- prometheus.MustNewConstMetric(auditRefusedDesc, prometheus.GaugeValue, float64(n), tenant, r)
		}
	}
}
