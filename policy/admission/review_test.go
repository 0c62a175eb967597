package admission

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestReviewDefaultBundle runs real AdmissionReviews through the real
// engine on the default bundle.
func TestReviewDefaultBundle(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t), Metrics: NewMetrics()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file    string
		allowed bool
		code    int32
		// want are substrings of the status message (deny) or of the joined
		// warnings (allow).
		want []string
		// audit is a substring of the "audit" audit annotation.
		audit string
	}{
		{file: "pod-allowed.json", allowed: true},
		{file: "cronjob-allowed.json", allowed: true},
		{file: "pod-runc.json", code: 403, want: []string{"[runtime.runc_forbidden]", `tier "untrusted"`, `pod "agent-1" in namespace "agents"`}},
		{file: "pod-no-runtimeclass.json", code: 403, want: []string{"[runtime.handler_required]", `runtimeClassName "bulkhead"`}},
		{file: "pod-tenant-claim.json", code: 403, want: []string{"[identity.annotation_mismatch]", `bulkhead.dev/tenant="research"`}},
		{file: "pod-whole-gpu.json", code: 403, want: []string{"[gpu."}},
		{file: "deployment-violates.json", code: 403, want: []string{`deployment "agents-web"`, "[runtime.runc_forbidden]", "[workload.privileged]"}},
		{file: "pod-bad-annotation.json", code: 400, want: []string{"annotation bulkhead.dev/gpu-count", `got "lots"`}},
		{file: "configmap-unknown-kind.json", code: 400, want: []string{"unsupported kind", "ConfigMap"}},
		{file: "pod-unpinned-image.json", allowed: true, want: []string{"[workload.image_unpinned]"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			_, review := readReview(t, tt.file)
			resp := rev.Review(context.Background(), review.Request)
			if resp.UID != review.Request.UID {
				t.Errorf("uid = %q, want the request's %q", resp.UID, review.Request.UID)
			}
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v; result %+v, warnings %q", resp.Allowed, tt.allowed, resp.Result, resp.Warnings)
			}
			text := strings.Join(resp.Warnings, "\n")
			if !tt.allowed {
				if resp.Result == nil || resp.Result.Code != tt.code {
					t.Fatalf("result = %+v, want code %d", resp.Result, tt.code)
				}
				text = resp.Result.Message
			} else if resp.Result != nil {
				t.Errorf("allowed response carries a status: %+v", resp.Result)
			}
			t.Logf("answer: %s", text)
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("message %q lacks %q", text, w)
				}
			}
			if tt.code == 403 && resp.AuditAnnotations["bundle-revision"] == "" {
				t.Errorf("no bundle-revision audit annotation: %v", resp.AuditAnnotations)
			}
		})
	}
}

// TestReviewEnforcementModes checks that a security team's enforcement
// mode for a rule decides whether it refuses, warns or only audits.
func TestReviewEnforcementModes(t *testing.T) {
	reasons := []policy.Reason{
		{Rule: "a.deny", Message: "refused", Enforcement: policy.EnforceDeny},
		{Rule: "b.warn", Message: "careful", Enforcement: policy.EnforceWarn},
		{Rule: "c.audit", Message: "noted", Enforcement: policy.EnforceAudit},
		{Rule: "d.default", Message: "no mode"},
		{Rule: "e.unknown", Message: "odd mode", Enforcement: "shout"},
	}
	pick := func(idx ...int) []policy.Reason {
		var out []policy.Reason
		for _, i := range idx {
			out = append(out, reasons[i])
		}
		return out
	}
	tests := []struct {
		name       string
		decision   policy.Decision
		allowed    bool
		message    []string
		warnings   int
		audit      string
		notMessage []string
	}{
		{name: "warn only", decision: policy.Decision{Allow: true, Reasons: pick(1), Warnings: []string{"b.warn: careful"}}, allowed: true, warnings: 1},
		{name: "audit only", decision: policy.Decision{Allow: true, Reasons: pick(2)}, allowed: true, audit: "[c.audit] noted"},
		{name: "deny with warn and audit", decision: policy.Decision{Allow: false, Reasons: pick(0, 1, 2)}, message: []string{"[a.deny] refused"}, notMessage: []string{"b.warn", "c.audit"}, warnings: 1, audit: "[c.audit]"},
		{name: "missing mode denies", decision: policy.Decision{Allow: true, Reasons: pick(3)}, message: []string{"[d.default] no mode"}},
		{name: "unknown mode denies", decision: policy.Decision{Allow: true, Reasons: pick(4)}, message: []string{"[e.unknown] odd mode"}},
		{name: "refusal without reason", decision: policy.Decision{Allow: false}, message: []string{"[" + RulePolicyUndefined + "]"}},
		{name: "extra policy warning", decision: policy.Decision{Allow: true, Warnings: []string{"bundle is old"}}, allowed: true, warnings: 1},
	}
	_, review := readReview(t, "pod-allowed.json")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev, err := NewReviewer(Options{Decider: staticDecider{decision: tt.decision}})
			if err != nil {
				t.Fatal(err)
			}
			resp := rev.Review(context.Background(), review.Request)
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if len(resp.Warnings) != tt.warnings {
				t.Errorf("warnings = %q, want %d", resp.Warnings, tt.warnings)
			}
			if got := resp.AuditAnnotations["audit"]; !strings.Contains(got, tt.audit) || (tt.audit == "" && got != "") {
				t.Errorf("audit annotation = %q, want %q", got, tt.audit)
			}
			if !tt.allowed {
				if resp.Result.Code != http.StatusForbidden || resp.Result.Reason != metav1.StatusReasonForbidden {
					t.Errorf("status = %d %s, want 403 Forbidden", resp.Result.Code, resp.Result.Reason)
				}
				for _, m := range tt.message {
					if !strings.Contains(resp.Result.Message, m) {
						t.Errorf("message %q lacks %q", resp.Result.Message, m)
					}
				}
				for _, m := range tt.notMessage {
					if strings.Contains(resp.Result.Message, m) {
						t.Errorf("message %q names non-deny rule %q", resp.Result.Message, m)
					}
				}
			}
		})
	}
}

// TestReviewFailsClosed: a policy error, a missing request and an object
// that is not JSON all refuse with a message; DELETE and objects being
// deleted pass.
func TestReviewFailsClosed(t *testing.T) {
	_, base := readReview(t, "pod-allowed.json")
	failing := staticDecider{
		decision: policy.Decision{Reasons: []policy.Reason{{Rule: policy.RuleError, Message: "eval_conflict_error"}}},
		err:      errors.New("evaluation failed"),
	}
	allowAll := staticDecider{decision: policy.Decision{Allow: true}}
	tests := []struct {
		name    string
		decider policy.Decider
		mutate  func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest
		allowed bool
		code    int32
		want    string
	}{
		{name: "policy error", decider: failing, mutate: func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest { return r },
			code: 500, want: "policy evaluation failed (fail closed): evaluation failed: [engine.error] eval_conflict_error"},
		{name: "nil request", decider: allowAll, mutate: func(*admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest { return nil },
			code: 400, want: "request is missing"},
		{name: "object not json", decider: allowAll, mutate: func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest {
			r.Object = runtime.RawExtension{Raw: []byte(`{"spec": 7}`)}
			return r
		}, code: 400, want: "object: decoding Pod"},
		{name: "object missing", decider: allowAll, mutate: func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest {
			r.Object = runtime.RawExtension{}
			return r
		}, code: 400, want: "object: empty"},
		{name: "delete passes", decider: failing, mutate: func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest {
			r.Operation = admissionv1.Delete
			r.Object = runtime.RawExtension{}
			return r
		}, allowed: true},
		{name: "update of a deleting pod passes", decider: failing, mutate: func(r *admissionv1.AdmissionRequest) *admissionv1.AdmissionRequest {
			r.Operation = admissionv1.Update
			r.Object = runtime.RawExtension{Raw: []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","deletionTimestamp":"2026-12-02T10:00:00Z"},"spec":{"containers":[{"name":"a","image":"b"}]}}`)}
			return r
		}, allowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev, err := NewReviewer(Options{Decider: tt.decider})
			if err != nil {
				t.Fatal(err)
			}
			req := base.Request.DeepCopy()
			resp := rev.Review(context.Background(), tt.mutate(req))
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				return
			}
			if resp.Result.Code != tt.code || !strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("result = %d %q, want %d containing %q", resp.Result.Code, resp.Result.Message, tt.code, tt.want)
			}
		})
	}
}

func TestNewReviewerNeedsDecider(t *testing.T) {
	if _, err := NewReviewer(Options{}); err == nil || !strings.Contains(err.Error(), "Options.Decider") {
		t.Fatalf("err = %v, want one naming Options.Decider", err)
	}
}
