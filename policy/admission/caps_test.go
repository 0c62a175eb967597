package admission

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestResponsesAreCapped: however many reasons or warnings a decision
// carries, the response lists at most maxListed of each, says how many more
// were omitted, and repeats none.
func TestResponsesAreCapped(t *testing.T) {
	many := func(n int, rule, enf string) []policy.Reason {
		rs := make([]policy.Reason, n)
		for i := range rs {
			rs[i] = policy.Reason{Rule: rule, Message: fmt.Sprintf("container %q %s", fmt.Sprint("c", i), strings.Repeat("x", i%3)), Enforcement: enf}
		}
		return rs
	}
	warnings := func(rs []policy.Reason) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			out[i] = r.Rule + ": " + r.Message
		}
		return out
	}
	warns := many(10000, "workload.image_unpinned", policy.EnforceWarn)
	long := []policy.Reason{{Rule: "a.long", Message: strings.Repeat("y", 100000)}}
	tests := []struct {
		name         string
		dec          policy.Decision
		wantWarnings int
		wantOmitted  string
		maxMessage   int
	}{
		{name: "10000 warnings, each also in dec.Warnings", dec: policy.Decision{Allow: true, Reasons: warns, Warnings: warnings(warns)},
			wantWarnings: maxListed + 1, wantOmitted: "9975 more warnings omitted"},
		{name: "duplicate policy warnings", dec: policy.Decision{Allow: true, Warnings: []string{"old bundle", "old bundle", "old bundle"}}, wantWarnings: 1},
		{name: "10000 denials", dec: policy.Decision{Reasons: many(10000, "workload.privileged", policy.EnforceDeny)},
			wantOmitted: "9975 more reasons omitted", maxMessage: 64 << 10},
		{name: "a long message", dec: policy.Decision{Reasons: long}, maxMessage: 4 << 10},
	}
	_, review := readReview(t, "pod-allowed.json")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev, err := NewReviewer(Options{Decider: staticDecider{decision: tt.dec}})
			if err != nil {
				t.Fatal(err)
			}
			resp := rev.Review(context.Background(), review.Request.DeepCopy())
			if tt.dec.Allow {
				if len(resp.Warnings) != tt.wantWarnings {
					t.Fatalf("%d warnings, want %d", len(resp.Warnings), tt.wantWarnings)
				}
				seen := map[string]bool{}
				for _, w := range resp.Warnings {
					if seen[w] {
						t.Errorf("warning %q repeated", w)
					}
					seen[w] = true
				}
				if tt.wantOmitted != "" && !strings.Contains(resp.Warnings[len(resp.Warnings)-1], tt.wantOmitted) {
					t.Errorf("last warning %q lacks %q", resp.Warnings[len(resp.Warnings)-1], tt.wantOmitted)
				}
				return
			}
			msg := resp.Result.Message
			if len(msg) > tt.maxMessage {
				t.Errorf("message of %d bytes, want at most %d", len(msg), tt.maxMessage)
			}
			if !strings.Contains(msg, tt.wantOmitted) {
				t.Errorf("message lacks %q: %.300s...", tt.wantOmitted, msg)
			}
		})
	}
}
