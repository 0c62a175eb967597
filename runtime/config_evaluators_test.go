package runtime

import (
	"slices"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// TestConfigEvaluatorsArePolicys keeps the evaluator names the
// configuration accepts (config.Evaluators, declared there so that the
// shims need not link the policy engine) those the policy engine knows.
func TestConfigEvaluatorsArePolicys(t *testing.T) {
	for _, name := range config.Evaluators {
		if !policy.KnownEvaluator(name) {
			t.Errorf("config accepts policy.evaluator %q, which the policy engine does not know", name)
		}
	}
	for _, name := range []string{"", policy.EvaluatorPlan, policy.EvaluatorTopdown} {
		if !slices.Contains(config.Evaluators, name) {
			t.Errorf("config refuses policy.evaluator %q, which the policy engine knows", name)
		}
	}
}
