package admission

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// auditPod is a running pod of the test tenants.
func auditPod(ns, name, runtimeClass string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			RuntimeClassName: &runtimeClass,
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.local/app@sha256:4f6a0b2c8e9d1a3b5c7e9f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1c",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceMemory: resource.MustParse("1Gi"), corev1.ResourceCPU: resource.MustParse("1"),
				}},
			}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// openEngineWith opens testBundle with its signed tenants changed by edit:
// the next revision a security team rolls out.
func openEngineWith(t *testing.T, edit func(tenants map[string]any)) *policy.Engine {
	t.Helper()
	return openEngineOn(t, testBundle(t, func(data map[string]any) {
		edit(data["bulkhead"].(map[string]any)["tenants"].(map[string]any))
	}))
}

// The audit judges running pods against the bundle in force and names
// those it would now refuse, by tenant and rule, leaving out finished and
// deleting pods and the namespaces the webhook never sees.
func TestAuditFindsPodsTheNewRevisionRefuses(t *testing.T) {
	deleting := auditPod("platform", "leaving", "bulkhead-runc", nil)
	deleting.DeletionTimestamp = &metav1.Time{}
	done := auditPod("platform", "done", "bulkhead-runc", nil)
	done.Status.Phase = corev1.PodSucceeded
	objects := []runtime.Object{
		auditPod("agents", "sandboxed", "bulkhead", nil),
		auditPod("platform", "on-runc", "bulkhead-runc", nil),
		auditPod("platform", "on-runc-2", "bulkhead-runc", nil),
		auditPod("research", "sandboxed", "bulkhead", nil),
		auditPod("kube-system", "on-runc", "bulkhead-runc", nil),
		auditPod("agents", "bad-profile", "bulkhead", map[string]string{policy.RequestAnnotationPrefix + "gpu-profile": "9g.1000gb"}),
		deleting, done,
	}
	client := fake.NewSimpleClientset(objects...)
	for _, tc := range []struct {
		name        string
		engine      func(t *testing.T) *policy.Engine
		wantRefused []string // namespace/pod
		wantErrors  int
	}{
		{"the revision they were admitted under", func(t *testing.T) *policy.Engine { return openEngine(t) }, nil, 1},
		{"platform moved to the untrusted tier", func(t *testing.T) *policy.Engine {
			return openEngineWith(t, func(ts map[string]any) { ts["platform"].(map[string]any)["tier"] = "untrusted" })
		}, []string{"platform/on-runc", "platform/on-runc-2"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics()
			a, err := NewAuditor(AuditOptions{Decider: tc.engine(t), Pods: APIPods{Client: client, Chunk: 2}})
			if err != nil {
				t.Fatal(err)
			}
			m.WatchAudit(a)
			rep, err := a.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if rep.Pods != 5 {
				t.Errorf("judged %d pods, want 5 (not kube-system, not finished or deleting)", rep.Pods)
			}
			var refused []string
			for _, f := range rep.Findings {
				if f.Error != "" {
					if f.Pod != "bad-profile" || !strings.Contains(f.Error, "gpu-profile") {
						t.Errorf("unjudged %s/%s: %s", f.Namespace, f.Pod, f.Error)
					}
					continue
				}
				refused = append(refused, f.Namespace+"/"+f.Pod)
				if f.Tenant != "platform" || len(f.Reasons) == 0 || f.Reasons[0].Rule == "" {
					t.Errorf("finding %+v: want tenant platform and a named rule", f)
				}
			}
			if strings.Join(refused, " ") != strings.Join(tc.wantRefused, " ") || rep.Refused != len(tc.wantRefused) || rep.Errors != tc.wantErrors {
				t.Errorf("refused %v (%d), errors %d; want %v, %d errors", refused, rep.Refused, rep.Errors, tc.wantRefused, tc.wantErrors)
			}
			if rep.Revision == "" {
				t.Error("the report names no bundle revision")
			}
			// The metrics say the same: per tenant and rule, and in total.
			sum := 0.0
			for rule, byTenant := range rep.ByRule {
				for tenant, n := range byTenant {
					sum += float64(n)
					if tenant != "platform" || n != len(tc.wantRefused) {
						t.Errorf("byRule[%s][%s] = %d", rule, tenant, n)
					}
				}
			}
			if len(tc.wantRefused) > 0 && sum == 0 {
				t.Error("no rule counted")
			}
			if got := testutil.CollectAndCount(m.Registry, "bulkhead_audit_refused_pods"); got != len(rep.ByRule) {
				t.Errorf("%d refused_pods series, want %d", got, len(rep.ByRule))
			}
			if got, _ := testutil.GatherAndCount(m.Registry, "bulkhead_audit_pods"); got != 1 {
				t.Errorf("bulkhead_audit_pods: %d series", got)
			}
		})
	}
}

// An audit that cannot list the pods keeps the previous report, and its
// options are checked.
func TestAuditKeepsTheLastReport(t *testing.T) {
	if _, err := NewAuditor(AuditOptions{Pods: APIPods{}}); err == nil {
		t.Error("an auditor without a decider was accepted")
	}
	if _, err := NewAuditor(AuditOptions{Decider: staticDecider{}}); err == nil {
		t.Error("an auditor without pods was accepted")
	}
	if _, err := NewAuditor(AuditOptions{Decider: staticDecider{}, Pods: APIPods{}, MaxFindings: -1}); err == nil {
		t.Error("a negative MaxFindings was accepted")
	}
	client := fake.NewSimpleClientset(auditPod("platform", "a", "bulkhead-runc", nil))
	a, err := NewAuditor(AuditOptions{Decider: staticDecider{decision: policy.Decision{Revision: "r1", Tenant: "platform"}}, Pods: APIPods{Client: client}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Last(); ok {
		t.Fatal("a report before the first run")
	}
	if _, err := a.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Run(ctx); err == nil {
		t.Fatal("a cancelled run reported no error")
	}
	last, ok := a.Last()
	if !ok || last.Pods != 1 || last.Refused != 1 || last.Findings[0].Reasons[0].Rule != RulePolicyUndefined {
		t.Errorf("last report %+v", last)
	}
}

// The webhook's audit flags: an interval of 0 turns it off, anything
// else under a second is refused by name; the exclusions are a list.
func TestParseFlagsAudit(t *testing.T) {
	base := []string{"--bundle=b", "--insecure-skip-verification", "--tls-cert=c", "--tls-key=k"}
	for _, tc := range []struct {
		args     []string
		want     string // error substring; empty: accepted
		interval time.Duration
		excluded []string
	}{
		{nil, "", DefaultAuditInterval, DefaultAuditExcluded},
		{[]string{"--audit-interval=0"}, "", 0, DefaultAuditExcluded},
		{[]string{"--audit-interval=5m", "--audit-exclude-namespaces= ops, kube-system ,"}, "", 5 * time.Minute, []string{"ops", "kube-system"}},
		{[]string{"--audit-exclude-namespaces="}, "", DefaultAuditInterval, []string{}},
		{[]string{"--audit-interval=100ms"}, "--audit-interval 100ms: must be 0 (off) or at least 1s", 0, nil},
		{[]string{"--audit-interval=-1s"}, "--audit-interval -1s", 0, nil},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c, err := ParseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.AuditInterval != tc.interval || !slices.Equal(SplitList(c.AuditExcluded), tc.excluded) {
				t.Errorf("interval %v, excluded %q; want %v, %q", c.AuditInterval, SplitList(c.AuditExcluded), tc.interval, tc.excluded)
			}
		})
	}
}
