package policy

import (
	"context"
	"fmt"
	"sync"
	"weak"
)

// TenantProbePod is the pod name of the decisions that only ask which
// tenant a namespace belongs to; the decision log shows them under it.
const TenantProbePod = "bulkhead-tenant-probe"

// NamespaceTenant asks d which tenant owns namespace: the tenant of a
// decision on a minimal admission input in that namespace, so that the
// bundle's own rule (identity.tenant in the default bundle) answers and
// nothing in Go restates it. A namespace that no tenant, or more than one,
// lists has tenant "". revision is the bundle revision that decided.
func NamespaceTenant(ctx context.Context, d Decider, namespace string) (tenant, revision string, err error) {
	dec, err := d.Decide(ctx, Input{
		Version:   ContractVersion,
		Kind:      KindAdmission,
		Namespace: namespace,
		Pod:       Pod{Name: TenantProbePod},
	})
	if err != nil {
		return "", dec.Revision, fmt.Errorf("policy: the tenant of namespace %q: %w", namespace, err)
	}
	return dec.Tenant, dec.Revision, nil
}

// NamespaceTenants resolves namespaces to tenants through a Decider and
// remembers each answer for as long as the policy that gave it is the one
// in force: for an *Engine, until its next successful reload (of the
// bundle or of the data file, which may move a namespace without changing
// the revision); for a Decider with a Revision method, until the revision
// changes; for any other Decider, not at all. It is safe for concurrent use.
type NamespaceTenants struct {
	d Decider

	// mu guards the fields below: the answers tenants, given by the
	// policy key names, and seen, the policy at the last Refresh.
	mu      sync.Mutex
	key     any
	tenants map[string]string
	seen    any
}

// NewNamespaceTenants resolves through d.
func NewNamespaceTenants(d Decider) *NamespaceTenants {
	return &NamespaceTenants{d: d, tenants: map[string]string{}}
}

// policyKey names the policy in force; nil when d cannot tell. For an
// Engine it is a weak pointer to the active snapshot: equal for as long as
// that snapshot is active, and never keeping an old one alive.
func (c *NamespaceTenants) policyKey() any {
	switch d := c.d.(type) {
	case *Engine:
		return weak.Make(d.active.Load())
	case interface{ Revision() string }:
		return d.Revision()
	}
	return nil
}

// forgetLocked forgets the answers of a policy other than key's. Caller
// holds mu.
func (c *NamespaceTenants) forgetLocked(key any) {
	if key == nil || key != c.key {
		c.key = key
		clear(c.tenants)
	}
}

// Refresh reports whether the policy in force changed since the last call
// (always true for a Decider that cannot tell, and on the first call):
// the caller should resolve its namespaces again. Answers of an older
// policy are forgotten, here or by Tenant, whichever sees the change first.
func (c *NamespaceTenants) Refresh() bool {
	key := c.policyKey()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(key)
	changed := key == nil || key != c.seen
	c.seen = key
	return changed
}

// Tenant is NamespaceTenant's tenant, remembered for the policy in force.
// Errors are not remembered.
func (c *NamespaceTenants) Tenant(ctx context.Context, namespace string) (string, error) {
	key := c.policyKey()
	c.mu.Lock()
	c.forgetLocked(key)
	t, ok := c.tenants[namespace]
	c.mu.Unlock()
	if ok {
		return t, nil
	}
	t, _, err := NamespaceTenant(ctx, c.d, namespace)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if key != nil && c.key == key {
		c.tenants[namespace] = t
	}
	c.mu.Unlock()
	return t, nil
}
