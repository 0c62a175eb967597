package admission

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// TestReviewRefusesUnknownOperations: only CREATE and UPDATE are judged and
// only DELETE and CONNECT pass unjudged; anything else, a mis-spelling or
// an empty operation included, is refused with a reason naming the field.
func TestReviewRefusesUnknownOperations(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, base := readReview(t, "pod-allowed.json")
	tests := []struct {
		op      admissionv1.Operation
		allowed bool
	}{
		{op: admissionv1.Create, allowed: true},
		{op: admissionv1.Update, allowed: true},
		{op: admissionv1.Delete, allowed: true},
		{op: admissionv1.Connect, allowed: true},
		{op: ""},
		{op: "create"},
		{op: "Update"},
		{op: "PATCH"},
		{op: "CREATE "},
	}
	for _, tt := range tests {
		t.Run(string(tt.op), func(t *testing.T) {
			req := base.Request.DeepCopy()
			req.Operation = tt.op
			resp := rev.Review(context.Background(), req)
			if resp.UID != req.UID {
				t.Errorf("uid = %q, want %q", resp.UID, req.UID)
			}
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				return
			}
			if resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
				t.Fatalf("result = %+v, want 400", resp.Result)
			}
			for _, w := range []string{"request.operation", `pod "agent-1"`} {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		})
	}
}
