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

// NamespaceGrant is what the policy gives any pod of one namespace before
// it looks at the pod itself: the tenant that owns the namespace ("" for
// none) and whether a pod there that asks for RDMA (annotation
// bulkhead.dev/rdma) gets it on the tenant's own VF.
type NamespaceGrant struct {
	Tenant string
	// RDMA is true when the decision for a pod that asks for RDMA answers
	// RDMAOwnVF.
	RDMA bool
}

// NamespaceTenant asks d which tenant owns namespace: the tenant of a
// decision on a minimal admission input in that namespace, so that the
// bundle's own rule (identity.tenant in the default bundle) answers and
// nothing in Go restates it. A namespace that no tenant, or more than one,
// lists has tenant "". revision is the bundle revision that decided.
func NamespaceTenant(ctx context.Context, d Decider, namespace string) (tenant, revision string, err error) {
	g, revision, err := NamespaceGrantOf(ctx, d, namespace)
	return g.Tenant, revision, err
}

// NamespaceGrantOf asks d for the grant of namespace: one decision on a
// minimal admission input in that namespace whose pod asks for RDMA, so
// that the bundle's own rules (identity.tenant, rdma.decision in the
// default bundle) answer both and nothing in Go restates them. A node
// learns a pod of another node this way: the same policy, in the same
// namespace, with the same request its own node judged.
func NamespaceGrantOf(ctx context.Context, d Decider, namespace string) (NamespaceGrant, string, error) {
	dec, err := d.Decide(ctx, Input{
		Version:   ContractVersion,
		Kind:      KindAdmission,
		Namespace: namespace,
		Pod:       Pod{Name: TenantProbePod},
		Request:   Request{RDMA: true},
	})
	if err != nil {
		return NamespaceGrant{}, dec.Revision, fmt.Errorf("policy: the tenant of namespace %q: %w", namespace, err)
	}
	return NamespaceGrant{Tenant: dec.Tenant, RDMA: dec.Tenant != "" && dec.RDMA == RDMAOwnVF}, dec.Revision, nil
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
	mu     sync.Mutex
	key    any
	grants map[string]NamespaceGrant
	seen   any
}

// NewNamespaceTenants resolves through d.
func NewNamespaceTenants(d Decider) *NamespaceTenants {
	return &NamespaceTenants{d: d, grants: map[string]NamespaceGrant{}}
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
		clear(c.grants)
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
	g, err := c.Grant(ctx, namespace)
	return g.Tenant, err
}

// Grant is NamespaceGrantOf's grant, remembered for the policy in force.
// Errors are not remembered.
func (c *NamespaceTenants) Grant(ctx context.Context, namespace string) (NamespaceGrant, error) {
	key := c.policyKey()
	c.mu.Lock()
	c.forgetLocked(key)
	g, ok := c.grants[namespace]
	c.mu.Unlock()
	if ok {
		return g, nil
	}
	g, _, err := NamespaceGrantOf(ctx, c.d, namespace)
	if err != nil {
		return NamespaceGrant{}, err
	}
	c.mu.Lock()
	if key != nil && c.key == key {
		c.grants[namespace] = g
	}
	c.mu.Unlock()
	return g, nil
}
