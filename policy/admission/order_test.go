package admission

import (
	"context"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestDenialListsDecisiveReasonFirst: a refusal lists the reasons in the
// decision's order, in which the default bundle puts the decisive one first
// (rego/decision.rego, reason_precedence): a pod of a namespace no tenant
// owns is refused for that before the GPU rules its lockdown tier fails.
func TestDenialListsDecisiveReasonFirst(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t), Metrics: NewMetrics()})
	if err != nil {
		t.Fatal(err)
	}
	_, review := readReview(t, "pod-whole-gpu.json")
	review.Request.Namespace = "nobody-owns-this"
	resp := rev.Review(context.Background(), review.Request)
	if resp.Allowed || resp.Result == nil {
		t.Fatalf("allowed: %+v", resp)
	}
	msg := resp.Result.Message
	tenant, gpu := strings.Index(msg, "[tenant.unknown_namespace]"), strings.Index(msg, "[gpu.")
	if tenant < 0 || gpu < 0 || tenant > gpu {
		t.Fatalf("message %q: want [tenant.unknown_namespace] listed before the [gpu.*] reasons", msg)
	}
}

func TestFormatReasonsKeepsOrderListsOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []policy.Reason
		want string
	}{
		{"decision order kept", []policy.Reason{{Rule: "tenant.b", Message: "x"}, {Rule: "gpu.a", Message: "y"}}, "[tenant.b] x; [gpu.a] y"},
		{"repeats dropped wherever they are", []policy.Reason{{Rule: "r.a", Message: "x"}, {Rule: "r.b", Message: "y"}, {Rule: "r.a", Message: "x"}}, "[r.a] x; [r.b] y"},
		{"same rule, other message kept", []policy.Reason{{Rule: "r.a", Message: "x"}, {Rule: "r.a", Message: "z"}}, "[r.a] x; [r.a] z"},
		{"none", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatReasons(tc.in); got != tc.want {
				t.Fatalf("formatReasons = %q, want %q", got, tc.want)
			}
		})
	}
}
