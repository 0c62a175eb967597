package runtime

import (
	"fmt"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// RefusedError is a policy refusal. Its message reaches the kubelet (and
// crictl) through containerd, so it names the tenant, each rule and why,
// and the bundle revision that decided when a decision did.
type RefusedError struct {
	Namespace, Pod, Tenant string
	Reasons                []policy.Reason
	// Revision is the revision of the bundle whose decision refused; ""
	// for a refusal no decision made (the runtime's own checks).
	Revision string
}

func (e *RefusedError) Error() string {
	tenant := e.Tenant
	if tenant == "" {
		tenant = "(none)"
	}
	var parts []string
	for _, r := range e.Reasons {
		if r.Enforcement == "" || r.Enforcement == policy.EnforceDeny {
			parts = append(parts, "["+r.Rule+"] "+r.Message)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "policy denied without a reason")
	}
	msg := fmt.Sprintf("bulkhead refused pod %s/%s (tenant %s): %s", e.Namespace, e.Pod, tenant, strings.Join(parts, "; "))
	if e.Revision != "" {
		msg += " (bundle revision " + e.Revision + ")"
	}
	return msg
}

func refusal(sb *node.Sandbox, d policy.Decision, err error) error {
	reasons := d.Reasons
	if err != nil && len(reasons) == 0 {
		reasons = []policy.Reason{{Rule: "engine.error", Message: err.Error()}}
	}
	return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: reasons, Revision: d.Revision}
}

// isRefusal reports whether err is the policy's refusal (returned as it is,
// so the user reads the rules, not the step).
func isRefusal(err error) bool {
	_, refused := err.(*RefusedError)
	return refused
}
