package runtime

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// countingDecider counts the decisions asked of it and answers with the
// decider it wraps; tenant, when set, replaces the tenant of every pod
// decision (a policy that changed since the namespace's tenant was asked).
type countingDecider struct {
	policy.Decider
	mu     sync.Mutex
	kinds  []string
	usages []policy.Usage
	tenant string
}

func (c *countingDecider) Decide(ctx context.Context, in policy.Input) (policy.Decision, error) {
	c.mu.Lock()
	c.kinds = append(c.kinds, in.Kind)
	c.usages = append(c.usages, in.Usage)
	c.mu.Unlock()
	d, err := c.Decider.Decide(ctx, in)
	if c.tenant != "" {
		d.Tenant = c.tenant
	}
	return d, err
}

func (c *countingDecider) Unwrap() policy.Decider { return c.Decider }

// TestReserveAsksThePolicyOnce: a pod's reservation is one decision, with
// the usage of the tenant the policy gives its namespace; a decision that
// names another tenant is made again with that tenant's usage.
func TestReserveAsksThePolicyOnce(t *testing.T) {
	base := testPipeline(t)
	for _, tc := range []struct {
		name      string
		tenant    string
		decisions int
		usageOf   string
	}{
		{"the namespace's tenant", "", 1, "research"},
		{"a decision for another tenant", "agents", 2, "agents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter := &countingDecider{Decider: base.decider, tenant: tc.tenant}
			p := NewPipeline(base.node, counter)
			// A pod of agents holds one sandbox, so that its usage differs
			// from research's.
			if tc.tenant != "" {
				sb, spec := sandboxSpec("agents", "holder-"+tc.name, nil)
				if _, err := place(t, NewPipeline(base.node, base.decider), sb, spec); err != nil {
					t.Fatal(err)
				}
				defer base.node.Release(context.Background(), sb.ID)
			}
			sb, spec := sandboxSpec("research", "once-"+tc.name, nil)
			_, _ = place(t, p, sb, spec)
			defer base.node.Release(context.Background(), sb.ID)
			sandboxDecisions := 0
			var last policy.Usage
			for i, k := range counter.kinds {
				if k == policy.KindSandbox {
					sandboxDecisions++
					last = counter.usages[i]
				}
			}
			if sandboxDecisions != tc.decisions {
				t.Errorf("sandbox decisions = %d (%v), want %d", sandboxDecisions, counter.kinds, tc.decisions)
			}
			want := 0
			if tc.usageOf == "agents" {
				want = 1
			}
			if last.Sandboxes != want {
				t.Errorf("the last decision's usage = %+v, want %s's (%d sandboxes)", last, tc.usageOf, want)
			}
		})
	}
}

// TestRefusalNamesTheRevision: a refusal the policy decided names the
// bundle revision that decided it, after the rules, as the webhook's does.
func TestRefusalNamesTheRevision(t *testing.T) {
	p := testPipeline(t)
	sb, spec := sandboxSpec("nobody", "unknown-namespace", nil)
	_, err := place(t, p, sb, spec)
	if err == nil || !strings.HasPrefix(err.Error(), "bulkhead refused pod nobody/unknown-namespace (tenant (none)): [") || !strings.HasSuffix(err.Error(), " (bundle revision bulkhead-default-1)") {
		t.Errorf("refusal = %v, want the rules, then the bundle revision", err)
	}
}
