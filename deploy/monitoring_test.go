package deploy

// deploy/monitoring is a kustomization of its own (the Prometheus
// Operator's ServiceMonitor and PrometheusRule, Grafana's dashboard), not
// part of deploy/kustomization.yaml. These tests hold it to the code and
// the manifests it watches: every expression parses, every series it names
// is one the webhook or the node agent registers (read from their real
// registries, not from a list kept here), every job is one a
// ServiceMonitor makes, and every ServiceMonitor finds its Service, port
// and pods.
//
// The expressions are parsed with VictoriaMetrics' metricsql, a superset of
// PromQL: Prometheus' own parser (module prometheus/prometheus) would raise
// eleven of the production binaries' dependencies (x/net, go-winio,
// mdlayher/vsock, ...) for a test. What metricsql accepts beyond PromQL is
// refused by promQLOnly below.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/VictoriaMetrics/metricsql"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

const monitoringDir = "monitoring"

// serviceMonitor is the subset of monitoring.coreos.com/v1 ServiceMonitor
// the manifests use; decoded strictly.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   monitoringObjMeta `json:"metadata"`
	Spec       struct {
		JobLabel string `json:"jobLabel"`
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port        string `json:"port"`
			Path        string `json:"path"`
			Interval    string `json:"interval"`
			Relabelings []struct {
				SourceLabels []string `json:"sourceLabels"`
				TargetLabel  string   `json:"targetLabel"`
			} `json:"relabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type monitoringObjMeta struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Labels    map[string]string `json:"labels"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule, alerts only.
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   monitoringObjMeta `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// grafanaDashboard is what the test reads of dashboard.json.
type grafanaDashboard struct {
	UID    string         `json:"uid"`
	Title  string         `json:"title"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID      int            `json:"id"`
	Type    string         `json:"type"`
	Title   string         `json:"title"`
	Panels  []grafanaPanel `json:"panels"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// yamlDocs splits a multi-document YAML file, dropping empty documents.
func yamlDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if b := stripComments([]byte(doc)); len(bytes.TrimSpace(b)) > 0 {
			out = append(out, b)
		}
	}
	return out
}

func loadServiceMonitors(t *testing.T) []serviceMonitor {
	t.Helper()
	var out []serviceMonitor
	for _, doc := range yamlDocs(t, filepath.Join(monitoringDir, "servicemonitor.yaml")) {
		var sm serviceMonitor
		if err := yaml.UnmarshalStrict(doc, &sm); err != nil {
			t.Fatalf("servicemonitor.yaml: %v", err)
		}
		if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Kind != "ServiceMonitor" {
			t.Fatalf("servicemonitor.yaml: %s %s, want monitoring.coreos.com/v1 ServiceMonitor", sm.APIVersion, sm.Kind)
		}
		out = append(out, sm)
	}
	return out
}

func loadRules(t *testing.T) prometheusRule {
	t.Helper()
	docs := yamlDocs(t, filepath.Join(monitoringDir, "prometheusrules.yaml"))
	if len(docs) != 1 {
		t.Fatalf("prometheusrules.yaml: %d documents, want 1", len(docs))
	}
	var pr prometheusRule
	if err := yaml.UnmarshalStrict(docs[0], &pr); err != nil {
		t.Fatalf("prometheusrules.yaml: %v", err)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("prometheusrules.yaml: %s %s, want monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	return pr
}

func loadDashboard(t *testing.T) (grafanaDashboard, []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var d grafanaDashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d, data
}

// monitoringServices are the Services deploy/monitoring adds.
func monitoringServices(t *testing.T) []*corev1.Service {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "service.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*corev1.Service
	for _, o := range decodeStrict(t, "monitoring/service.yaml", data) {
		svc, ok := o.(*corev1.Service)
		if !ok {
			t.Fatalf("monitoring/service.yaml: %T, want only Services", o)
		}
		out = append(out, svc)
	}
	return out
}

// registeredSeries are the series names the webhook's and the node agent's
// registries export once every series has a value, histograms and
// summaries with their _bucket, _sum and _count, plus the series
// Prometheus makes for every target (up).
func registeredSeries(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{"up": true}
	for _, fams := range [][]*dto.MetricFamily{webhookFamilies(t), agentFamilies(t)} {
		for _, f := range fams {
			names[f.GetName()] = true
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
				names[f.GetName()+"_bucket"] = true
				fallthrough
			case dto.MetricType_SUMMARY:
				names[f.GetName()+"_sum"] = true
				names[f.GetName()+"_count"] = true
			}
		}
	}
	return names
}

// webhookFamilies runs the webhook's handler, as Run assembles it, over
// the real engine and the default bundle: a review refused by a rule, a
// request refused before review, and a served certificate; then gathers.
func webhookFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	engine, err := policy.Open(context.Background(), policy.Options{
		BundlePath:               "../rego",
		DataPath:                 "../policy/admission/testdata/tenants.json",
		InsecureSkipVerification: true, // tests only: deploy/ verifies a signed bundle
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close() })
	m := admission.NewMetrics()
	m.WatchCertificate(selfSignedCert(t))
	reviewer, err := admission.NewReviewer(admission.Options{Decider: engine, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h, err := admission.Handler(admission.HandlerOptions{Reviewer: reviewer, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile("../policy/admission/testdata/pod-runc.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodPost, admission.PathValidate, bytes.NewReader(body)),
		httptest.NewRequest(http.MethodGet, admission.PathValidate, nil),
	} {
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	// The audit's series appear once it has run: over one running pod
	// that the bundle refuses (pod-runc.json's).
	var review struct {
		Request struct {
			Object corev1.Pod `json:"object"`
		} `json:"request"`
	}
	if err := json.Unmarshal(body, &review); err != nil {
		t.Fatal(err)
	}
	running := review.Request.Object
	running.Status.Phase = corev1.PodRunning
	auditor, err := admission.NewAuditor(admission.AuditOptions{Decider: engine, Pods: admission.APIPods{Client: fake.NewSimpleClientset(&running)}})
	if err != nil {
		t.Fatal(err)
	}
	m.WatchAudit(auditor)
	if rep, err := auditor.Run(context.Background()); err != nil || rep.Refused != 1 {
		t.Fatalf("audit of pod-runc.json: %+v, %v", rep, err)
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// selfSignedCert writes a serving certificate and key and loads them.
func selfSignedCert(t *testing.T) *admission.CertReloader {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "bulkhead-webhook.bulkhead-system.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	certs, err := admission.NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// fenceStats is what telemetry.NetpolFence reads from a netpol.Manager.
type fenceStats []netpol.Stats

func (s fenceStats) DropStats() ([]netpol.Stats, error) { return s, nil }

// nodeHoldings is a ledger's answer at scrape time.
type nodeHoldings struct{}

func (nodeHoldings) QuotaUse() (map[string]policy.Usage, error) {
	return map[string]policy.Usage{"acme": {Sandboxes: 1, MemoryBytes: 1 << 30, GPUSlices: 1}}, nil
}
func (nodeHoldings) MIGInstances() (map[int]int, error) { return map[int]int{0: 1}, nil }

// agentFamilies fills the node agent's registry through the calls the
// agent makes (runtime/agent/telemetry.go) and gathers it.
func agentFamilies(t *testing.T) []*dto.MetricFamily {
	t.Helper()
	drops := map[netpol.Reason]uint64{}
	for _, r := range netpol.Reasons() {
		drops[r] = 1
	}
	m := telemetry.NewMetrics(telemetry.Options{
		Fence: telemetry.NetpolFence(fenceStats{{Tenant: "acme", Drops: drops}}),
		Node:  nodeHoldings{},
	})
	m.Decided(telemetry.KindSandbox, policy.Decision{Reasons: []policy.Reason{{Rule: "gpu.profile", Message: "no"}}}, nil)
	m.Decided(telemetry.KindSandbox, policy.Decision{}, errors.New("policy: closed"))
	m.Stage("gvisor", "decide", time.Millisecond)
	m.Started("gvisor", "ok", time.Second)
	m.BundleLoaded("r1", time.Now())
	m.BundleReloadFailed(errors.New("bad signature"))
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// promQLOnly refuses what metricsql accepts beyond PromQL: functions and
// aggregations PromQL lacks, a range-vector function without its range
// ("rate(x)"), a range where PromQL wants an instant vector ("sum(x[5m])"),
// and MetricsQL's "limit" on aggregations.
func promQLOnly(e metricsql.Expr) error {
	var errs []error
	ranged := map[*metricsql.RollupExpr]bool{} // ranges in the argument of a range function
	metricsql.VisitAll(e, func(e metricsql.Expr) {
		switch e := e.(type) {
		case *metricsql.FuncExpr:
			arity, ok := promqlFuncs[e.Name]
			if !ok {
				errs = append(errs, fmt.Errorf("%s is not a PromQL function", e.Name))
				return
			}
			if !arity.rangeArg {
				return
			}
			found := false
			for _, a := range e.Args {
				if r, ok := a.(*metricsql.RollupExpr); ok && r.Window != nil {
					ranged[r], found = true, true
				}
			}
			if !found {
				errs = append(errs, fmt.Errorf("%s needs a range vector argument ([5m])", e.Name))
			}
		case *metricsql.AggrFuncExpr:
			if !slices.Contains(promqlAggregations, e.Name) {
				errs = append(errs, fmt.Errorf("%s is not a PromQL aggregation", e.Name))
			}
			if e.Limit != 0 {
				errs = append(errs, fmt.Errorf("%s ... limit is MetricsQL, not PromQL", e.Name))
			}
		}
	})
	metricsql.VisitAll(e, func(e metricsql.Expr) {
		if r, ok := e.(*metricsql.RollupExpr); ok && r.Window != nil && r.Step == nil && !r.InheritStep && !ranged[r] {
			errs = append(errs, fmt.Errorf("range %s outside a range function", r.AppendString(nil)))
		}
	})
	return errors.Join(errs...)
}

type promqlFunc struct{ rangeArg bool }

// promqlFuncs are PromQL's functions (Prometheus 3's querying/functions),
// those over a range vector marked.
var promqlFuncs = func() map[string]promqlFunc {
	out := map[string]promqlFunc{}
	for _, f := range strings.Fields(`abs absent ceil clamp clamp_max clamp_min day_of_month day_of_week
		day_of_year days_in_month exp floor histogram_avg histogram_count histogram_fraction
		histogram_quantile histogram_stddev histogram_stdvar histogram_sum hour label_join
		label_replace ln log2 log10 minute month round scalar sgn sort sort_desc sort_by_label
		sort_by_label_desc sqrt time timestamp vector year acos acosh asin asinh atan atanh cos
		cosh sin sinh tan tanh deg rad pi`) {
		out[f] = promqlFunc{}
	}
	for _, f := range strings.Fields(`absent_over_time changes delta deriv double_exponential_smoothing
		holt_winters idelta increase irate predict_linear rate resets avg_over_time min_over_time
		max_over_time sum_over_time count_over_time quantile_over_time stddev_over_time
		stdvar_over_time last_over_time present_over_time mad_over_time`) {
		out[f] = promqlFunc{rangeArg: true}
	}
	return out
}()

var promqlAggregations = strings.Fields(`sum min max avg group stddev stdvar count count_values
	bottomk topk quantile limitk limit_ratio`)

// parsedQuery is what an expression names: its series and job matchers.
type parsedQuery struct {
	series, jobs []string
}

func parsePromQL(expr string) (parsedQuery, error) {
	e, err := metricsql.Parse(expr)
	if err != nil {
		return parsedQuery{}, err
	}
	if err := promQLOnly(e); err != nil {
		return parsedQuery{}, err
	}
	var q parsedQuery
	metricsql.VisitAll(e, func(e metricsql.Expr) {
		me, ok := e.(*metricsql.MetricExpr)
		if !ok {
			return
		}
		for _, group := range me.LabelFilterss {
			name := ""
			for _, f := range group {
				switch {
				case f.Label == "__name__" && !f.IsRegexp && !f.IsNegative:
					name = f.Value
				case f.Label == "job" && !f.IsRegexp && !f.IsNegative:
					q.jobs = append(q.jobs, f.Value)
				}
			}
			q.series = append(q.series, name)
		}
	})
	return q, nil
}

// checkQuery reports what is wrong with expr: it does not parse as PromQL,
// names a series no registry exports (or none), or a job no
// ServiceMonitor makes.
func checkQuery(expr string, series map[string]bool, jobs []string) []string {
	q, err := parsePromQL(expr)
	if err != nil {
		return []string{fmt.Sprintf("does not parse as PromQL: %v", err)}
	}
	var problems []string
	for _, s := range q.series {
		if !series[s] {
			problems = append(problems, fmt.Sprintf("series %q is not registered by the webhook or the node agent", s))
		}
	}
	for _, j := range q.jobs {
		if !slices.Contains(jobs, j) {
			problems = append(problems, fmt.Sprintf("job %q is not one a ServiceMonitor makes (%v)", j, jobs))
		}
	}
	if len(q.series) > 0 && len(q.jobs) == 0 {
		problems = append(problems, "names no job: another exporter's series of the same name would be counted")
	}
	return problems
}

// TestPromQLCheckerCanFail: the checks below refuse what they should.
func TestPromQLCheckerCanFail(t *testing.T) {
	series := map[string]bool{"up": true, "bulkhead_webhook_decisions_total": true}
	jobs := []string{"bulkhead-webhook"}
	for _, tc := range []struct {
		expr string
		want string // in the first problem; "" for none
	}{
		{`sum(rate(bulkhead_webhook_decisions_total{job="bulkhead-webhook"}[5m])) > 0`, ""},
		{`absent(up{job="bulkhead-webhook"} == 1)`, ""},
		{`sum(rate(bulkhead_webhook_decisions_total{job="bulkhead-webhook"}[5m]) > 0`, "does not parse"},
		{`rate(bulkhead_webhook_decisions_total{job="bulkhead-webhook"})`, "needs a range vector"},
		{`sum(bulkhead_webhook_decisions_total{job="bulkhead-webhook"}[5m])`, "outside a range function"},
		{`range_median(bulkhead_webhook_decisions_total{job="bulkhead-webhook"})`, "not a PromQL function"},
		{`sum(up{job="bulkhead-webhook"}) limit 3`, "limit is MetricsQL"},
		{`rate(bulkhead_webhook_decision_total{job="bulkhead-webhook"}[5m])`, "is not registered"},
		{`up{job="bulkhead"}`, "is not one a ServiceMonitor makes"},
		{`up`, "names no job"},
		{`{job="bulkhead-webhook"}`, "series \"\" is not registered"},
	} {
		problems := checkQuery(tc.expr, series, jobs)
		switch {
		case tc.want == "" && len(problems) > 0:
			t.Errorf("%s: %v, want no problem", tc.expr, problems)
		case tc.want != "" && (len(problems) == 0 || !strings.Contains(problems[0], tc.want)):
			t.Errorf("%s: %v, want %q", tc.expr, problems, tc.want)
		}
	}
}

// scrapeJobs checks every ServiceMonitor against the Services and pods it
// must find, and returns the job names they make; unserved says why a
// target is not served yet, when it is not.
func scrapeJobs(t *testing.T) (jobs []string, unserved string) {
	t.Helper()
	tr := loadTree(t)
	services := monitoringServices(t)
	for _, o := range tr.objects {
		if svc, ok := o.(*corev1.Service); ok {
			services = append(services, svc)
		}
	}
	var pods []corev1.PodTemplateSpec
	for _, o := range tr.objects {
		switch w := o.(type) {
		case *appsv1.Deployment:
			pods = append(pods, w.Spec.Template)
		case *appsv1.DaemonSet:
			pods = append(pods, w.Spec.Template)
		}
	}
	for _, sm := range loadServiceMonitors(t) {
		name := "ServiceMonitor " + sm.Metadata.Name
		if sm.Metadata.Namespace != namespace || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
			t.Errorf("%s: namespace %q, namespaceSelector %v, want %s", name, sm.Metadata.Namespace, sm.Spec.NamespaceSelector.MatchNames, namespace)
		}
		if len(sm.Spec.Selector.MatchLabels) == 0 || len(sm.Spec.Endpoints) == 0 {
			t.Errorf("%s: selects nothing or scrapes no endpoint", name)
			continue
		}
		sel := labels.SelectorFromSet(sm.Spec.Selector.MatchLabels)
		var selected []*corev1.Service
		for _, svc := range services {
			if svc.Namespace == namespace && sel.Matches(labels.Set(svc.Labels)) {
				selected = append(selected, svc)
			}
		}
		if len(selected) == 0 {
			t.Errorf("%s: selector %v matches no Service", name, sm.Spec.Selector.MatchLabels)
			continue
		}
		for _, svc := range selected {
			job, ok := svc.Labels[sm.Spec.JobLabel]
			if !ok {
				t.Errorf("%s: Service %s has no jobLabel %q", name, svc.Name, sm.Spec.JobLabel)
			} else if !slices.Contains(jobs, job) {
				jobs = append(jobs, job)
			}
			for _, ep := range sm.Spec.Endpoints {
				if ep.Path != "/metrics" {
					t.Errorf("%s: path %q, want /metrics", name, ep.Path)
				}
				if _, err := model.ParseDuration(ep.Interval); err != nil {
					t.Errorf("%s: interval %q: %v", name, ep.Interval, err)
				}
				i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				if i < 0 {
					t.Errorf("%s: Service %s has no port %q", name, svc.Name, ep.Port)
					continue
				}
				if why := checkTargetPort(t, name, svc, svc.Spec.Ports[i].TargetPort, pods); why != "" {
					unserved = why
				}
			}
		}
	}
	slices.Sort(jobs)
	return jobs, unserved
}

// checkTargetPort: the Service selects pods, and targetPort is a port they
// serve: a named container port, or, for the node agent on the host's
// network (no container port), the port of [agent] metrics_address. It
// returns why the port is not served when deploy/node/config.toml sets no
// metrics_address.
func checkTargetPort(t *testing.T, name string, svc *corev1.Service, target intstr.IntOrString, pods []corev1.PodTemplateSpec) (unserved string) {
	t.Helper()
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	matched := false
	for _, pod := range pods {
		if len(svc.Spec.Selector) == 0 || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		matched = true
		if target.Type == intstr.String {
			if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return hasPort(c, target.StrVal) }) {
				t.Errorf("%s: Service %s targets port %q, which no container of its pods declares", name, svc.Name, target.StrVal)
			}
			continue
		}
		agent := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == "agent" })
		if agent < 0 || !pod.Spec.HostNetwork {
			t.Errorf("%s: Service %s targets port %d by number; only the node agent, on the host's network, is scraped so", name, svc.Name, target.IntVal)
			continue
		}
		addr := nodeConfig(t).Agent.MetricsAddress
		if addr == "" {
			unserved = fmt.Sprintf("deploy/node/config.toml sets no [agent] metrics_address: the node agent serves no /metrics, so %s scrapes nothing (set it to \":%d\")", name, target.IntVal)
			continue
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("deploy/node/config.toml [agent] metrics_address %q: %v", addr, err)
		} else if port != strconv.Itoa(int(target.IntVal)) {
			t.Errorf("%s: Service %s targets port %d, the agent serves %s (deploy/node/config.toml)", name, svc.Name, target.IntVal, addr)
		}
	}
	if !matched {
		t.Errorf("%s: Service %s selects no pod of the tree (selector %v)", name, svc.Name, svc.Spec.Selector)
	}
	return unserved
}

// TestServiceMonitorsFindTheirTargets: each ServiceMonitor selects a
// Service that carries its labels and names a port the Service has, whose
// target the pods serve.
func TestServiceMonitorsFindTheirTargets(t *testing.T) {
	jobs, unserved := scrapeJobs(t)
	if want := []string{"bulkhead-node", "bulkhead-webhook"}; !slices.Equal(jobs, want) {
		t.Errorf("jobs %v, want %v", jobs, want)
	}
	if unserved != "" {
		t.Skip(unserved)
	}
}

// prometheusTemplateFuncs are the functions Prometheus gives alert
// templates (template/template.go); only their names matter to Parse.
var prometheusTemplateFuncs = func() template.FuncMap {
	out := template.FuncMap{}
	for _, f := range strings.Fields(`query first label value strvalue args reReplaceAll safeHtml match
		title toUpper toLower graphLink tableLink sortByLabel humanize humanize1024 humanizeDuration
		humanizePercentage humanizeTimestamp toTime toDuration pathPrefix externalURL parseDuration
		stripPort stripDomain`) {
		out[f] = func(...any) any { return nil }
	}
	return out
}()

// TestAlertRules: every alert parses, names only registered series and
// existing jobs, waits a parseable time, has a severity, a summary, a
// description and a runbook that is a section of docs/install.md.
func TestAlertRules(t *testing.T) {
	series := registeredSeries(t)
	jobs, _ := scrapeJobs(t)
	install, err := os.ReadFile("../docs/install.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := markdownAnchors(string(install))
	pr := loadRules(t)
	if pr.Metadata.Namespace != namespace {
		t.Errorf("PrometheusRule namespace %q, want %s", pr.Metadata.Namespace, namespace)
	}
	seen := map[string]bool{}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			name := g.Name + "/" + r.Alert + "/" + r.Labels["severity"]
			if r.Alert == "" {
				t.Errorf("%s: a rule without an alert name (recording rules are not expected)", g.Name)
			}
			if seen[name] {
				t.Errorf("%s: defined twice", name)
			}
			seen[r.Alert+"/"+r.Labels["severity"]], seen[name] = true, true
			for _, p := range checkQuery(r.Expr, series, jobs) {
				t.Errorf("%s: expr %s", name, p)
			}
			if d, err := model.ParseDuration(r.For); err != nil || d <= 0 {
				t.Errorf("%s: for %q: want a positive duration (%v)", name, r.For, err)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q, want warning or critical", name, s)
			}
			for _, key := range []string{"summary", "description", "runbook_url"} {
				text := r.Annotations[key]
				if strings.TrimSpace(text) == "" {
					t.Errorf("%s: no %s", name, key)
					continue
				}
				// As Prometheus expands it: $labels and $value defined.
				tmpl := "{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$externalURL := .ExternalURL}}{{$value := .Value}}" + text
				if _, err := template.New(name).Funcs(prometheusTemplateFuncs).Option("missingkey=zero").Parse(tmpl); err != nil {
					t.Errorf("%s: %s does not parse as an alert template: %v", name, key, err)
				}
			}
			url, anchor, _ := strings.Cut(r.Annotations["runbook_url"], "#")
			if !strings.HasSuffix(url, "/docs/install.md") || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q is not a section of docs/install.md", name, r.Annotations["runbook_url"])
			}
		}
	}
	for _, want := range []string{
		"BulkheadWebhookDown/critical", "BulkheadWebhookSlow/warning",
		"BulkheadWebhookCertificateExpiring/warning", "BulkheadWebhookCertificateExpiring/critical",
		"BulkheadFenceNotLoaded/critical", "BulkheadDecisionErrors/warning", "BulkheadBundleStale/warning",
		"BulkheadNodeAgentDown/critical", "BulkheadBundleReloadFailing/warning",
		"BulkheadAuditRefusedPods/warning", "BulkheadAuditStale/warning",
	} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

// markdownAnchors are the heading anchors of a Markdown page, as GitHub
// makes them.
func markdownAnchors(md string) map[string]bool {
	out := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(md, "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return out
}

// TestDashboard: every panel's query parses and names only registered
// series and existing jobs; panel ids are unique.
func TestDashboard(t *testing.T) {
	series := registeredSeries(t)
	jobs, _ := scrapeJobs(t)
	d, _ := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard: uid %q, title %q", d.UID, d.Title)
	}
	ids := map[int]bool{}
	queries := 0
	var walk func([]grafanaPanel)
	walk = func(panels []grafanaPanel) {
		for _, p := range panels {
			if ids[p.ID] {
				t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q: no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				for _, problem := range checkQuery(tg.Expr, series, jobs) {
					t.Errorf("panel %q query %s: %s", p.Title, tg.RefID, problem)
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if queries == 0 {
		t.Error("dashboard: no query")
	}
}

// TestMonitoringKustomization: a root of its own, outside deploy/'s tree
// (its CRDs exist only with the Prometheus Operator), whose dashboard
// ConfigMap carries the label Grafana's sidecar loads; rendered by
// `kubectl kustomize` when kubectl is there.
func TestMonitoringKustomization(t *testing.T) {
	tr := loadTree(t)
	for dir := range tr.kusts {
		if dir == monitoringDir || strings.HasPrefix(dir, monitoringDir+"/") {
			t.Errorf("deploy/kustomization.yaml includes %s: applying deploy/ would fail where the Prometheus Operator's CRDs are missing", dir)
		}
	}
	data, err := os.ReadFile(filepath.Join(monitoringDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("monitoring/kustomization.yaml: %v", err)
	}
	if k.GeneratorOptions == nil || k.GeneratorOptions.Labels["grafana_dashboard"] != "1" {
		t.Error("monitoring/kustomization.yaml: the dashboard ConfigMap needs the label grafana_dashboard: \"1\"")
	}
	if len(k.ConfigMapGen) != 1 || k.ConfigMapGen[0].fileKeys()["bulkhead.json"] != "dashboard.json" {
		t.Errorf("monitoring/kustomization.yaml: want one ConfigMap generator with bulkhead.json=dashboard.json, got %+v", k.ConfigMapGen)
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		kubectl = "/root/.cache/bulkhead/tools/bin/kubectl"
		if _, err := os.Stat(kubectl); err != nil {
			t.Skip("kubectl is not installed (PATH, /root/.cache/bulkhead/tools/bin): deploy/monitoring is not rendered (its sources are checked)")
		}
	}
	out, err := exec.Command(kubectl, "kustomize", monitoringDir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", monitoringDir, err, out)
	}
	_, dashboard := loadDashboard(t)
	kinds := map[string]int{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(out), -1) {
		var obj struct {
			Kind     string            `json:"kind"`
			Metadata monitoringObjMeta `json:"metadata"`
			Data     map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("kustomize output: %v", err)
		}
		kinds[obj.Kind]++
		if obj.Metadata.Namespace != namespace {
			t.Errorf("rendered %s %s: namespace %q, want %s", obj.Kind, obj.Metadata.Name, obj.Metadata.Namespace, namespace)
		}
		if obj.Kind == "ConfigMap" {
			if obj.Metadata.Labels["grafana_dashboard"] != "1" || obj.Data["bulkhead.json"] != string(dashboard) {
				t.Errorf("rendered ConfigMap %s: labels %v, bulkhead.json %d bytes, want the dashboard (%d bytes) labelled grafana_dashboard",
					obj.Metadata.Name, obj.Metadata.Labels, len(obj.Data["bulkhead.json"]), len(dashboard))
			}
		}
	}
	want := map[string]int{"Service": 1, "ServiceMonitor": 2, "PrometheusRule": 1, "ConfigMap": 1}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("rendered kinds %v, want %v", kinds, want)
	}
}
