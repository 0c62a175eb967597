package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Rule ids the webhook itself reports, beside the bundle's own. (The bundle
// owns every other rule, including identity.annotation_mismatch, which
// refuses a bulkhead.dev/tenant or bulkhead.dev/tier annotation that
// contradicts the namespace.)
const (
	// RulePolicyUndefined fires when the bundle refuses without naming a rule.
	RulePolicyUndefined = "policy.denied_without_reason"
)

// UsageSource reports what running pods already hold, per namespace.
type UsageSource interface {
	// Snapshot returns each namespace's usage, not counting the pod whose
	// UID is exclude (the pod under review, on UPDATE). It fails when the
	// source cannot vouch for its counts (not yet synced).
	Snapshot(exclude types.UID) (map[string]policy.Usage, error)
}

// Options configure a Reviewer.
type Options struct {
	// Decider evaluates the policy bundle; required.
	Decider policy.Decider
	// Handlers resolves RuntimeClass names to CRI handlers. Nil means a
	// RuntimeClass's name is its handler.
	Handlers HandlerResolver
	// Usage counts the tenant's pods, GPU slices and memory cluster-wide.
	// Nil leaves input.usage zero (quotas then apply per pod only).
	Usage UsageSource
	// Metrics records decisions and rule hits; nil records nothing.
	Metrics *Metrics
	// Quota, when set, is where pods' usage is agreed with every other
	// replica: a pod is decided on its tenant's ledger and, if admitted,
	// reserved in it (quota.go). Usage is then not needed.
	Quota *QuotaLedger
	// Claims reads the pods' DRA ResourceClaims and ResourceClaimTemplates.
	// Nil reads none: every claim reaches the policy unread, which the
	// default tiers refuse below trusted.
	Claims ClaimReader
	// Deadline bounds one review: past it the review stops (the policy
	// evaluation is cancelled) and the request is refused. 0 means
	// DefaultReviewDeadline.
	Deadline time.Duration
}

// DefaultReviewDeadline is well inside the webhook's timeoutSeconds (5 s in
// deploy/), so the API server gets a reasoned refusal rather than a
// timeout, and an ordinary review takes a few milliseconds.
const DefaultReviewDeadline = 2 * time.Second

// Reviewer answers admission requests. It is safe for concurrent use.
type Reviewer struct {
	decider  policy.Decider
	handlers HandlerResolver
	usage    UsageSource
	metrics  *Metrics
	quota    *QuotaLedger
	claims   ClaimReader
	deadline time.Duration

	// mu guards tenants and revision: the tenant each namespace mapped to
	// under the bundle revision last seen in a decision.
	mu       sync.RWMutex
	tenants  map[string]string
	revision string
}

// NewReviewer checks opts and returns a Reviewer.
func NewReviewer(opts Options) (*Reviewer, error) {
	if opts.Decider == nil {
		return nil, errors.New("admission: Options.Decider is required")
	}
	if opts.Deadline < 0 {
		return nil, fmt.Errorf("admission: Options.Deadline %v must not be negative", opts.Deadline)
	}
	if opts.Deadline == 0 {
		opts.Deadline = DefaultReviewDeadline
	}
	return &Reviewer{
		decider:  opts.Decider,
		handlers: opts.Handlers,
		usage:    opts.Usage,
		metrics:  opts.Metrics,
		quota:    opts.Quota,
		claims:   opts.Claims,
		deadline: opts.Deadline,
		tenants:  map[string]string{},
	}, nil
}

// SubresourceEphemeralContainers is the pods subresource that kubectl debug
// updates to add a container to a running pod. Its AdmissionRequest is an
// UPDATE of kind v1 Pod whose object is the whole pod, ephemeral containers
// included, and Review judges it as such.
const SubresourceEphemeralContainers = "ephemeralcontainers"

// subresourcesUnjudged are the subresources that cannot change what a pod
// or pod template asks of the host, so Review allows them without a
// decision: status (the API server keeps the spec as it was), binding (sets
// the node), eviction (deletes) and scale (replica count only; every new
// pod is judged when it is created). Every other subresource that reaches
// the webhook is judged as the object it carries (fail closed): "" (the
// object itself), ephemeralcontainers (adds containers) and resize
// (SubresourceResize: changes container resources, so the memory quota)
// among them; one whose kind Review cannot read is refused. The shipped
// ValidatingWebhookConfiguration routes both of those subresources here.
var subresourcesUnjudged = map[string]bool{"status": true, "binding": true, "eviction": true, "scale": true}

// Review answers one AdmissionRequest. It never returns nil: a request it
// cannot read is refused with a status that names the problem.
func (r *Reviewer) Review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req == nil {
		return refuse("", http.StatusBadRequest, metav1.StatusReasonBadRequest, "admission review: request is missing")
	}
	kind := req.Kind.Kind
	ctx, cancel := context.WithTimeout(ctx, r.deadline)
	defer cancel()
	resp, result := r.review(ctx, req)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// However far it got, a review past its deadline is refused: an
		// answer the API server may already have given up on must never
		// be an allow that nothing checked in time.
		resp, result = refuse(req.UID, http.StatusGatewayTimeout, metav1.StatusReasonTimeout,
			fmt.Sprintf("bulkhead: %s: review stopped after its deadline of %v (fail closed)", requestSubject(req), r.deadline)), ResultError
	}
	resp.UID = req.UID
	r.metrics.observeDecision(result, kind)
	return resp
}

func (r *Reviewer) review(ctx context.Context, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, string) {
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
	case admissionv1.Delete, admissionv1.Connect:
		// DELETE and CONNECT carry no pod to judge.
		return &admissionv1.AdmissionResponse{Allowed: true}, ResultAllowed
	default:
		// The API server spells every operation it sends in capitals; an
		// operation it never sends (empty, "create") cannot be told apart
		// from a forged request, so it is refused rather than let through.
		return refuse(req.UID, http.StatusBadRequest, metav1.StatusReasonBadRequest,
			fmt.Sprintf("bulkhead: %s: request.operation %q: unknown; expected CREATE, UPDATE, DELETE or CONNECT", requestSubject(req), req.Operation)), ResultError
	}
	if subresourcesUnjudged[req.SubResource] {
		return &admissionv1.AdmissionResponse{Allowed: true}, ResultAllowed
	}
	gvk := schema.GroupVersionKind(req.Kind)
	if isClaimKind(gvk) {
		return r.reviewClaim(ctx, req, gvk)
	}
	pod, err := podOf(gvk, req.Object.Raw)
	if err != nil {
		return refuse(req.UID, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("bulkhead: %s: %v", requestSubject(req), err)), ResultError
	}
	if req.Operation == admissionv1.Update && req.SubResource == "" && pod.Object.DeletionTimestamp != nil {
		// Removing finalizers from an object on its way out must never be
		// blocked by a policy that changed since it was admitted. Only the
		// object itself carries finalizers: an ephemeral container added
		// to a pod in its grace period is judged like any other.
		return &admissionv1.AdmissionResponse{Allowed: true}, ResultAllowed
	}
	subject := fmt.Sprintf("%s %q in namespace %q", strings.ToLower(pod.Workload), pod.Name, req.Namespace)
	if req.SubResource != "" {
		subject = req.SubResource + " of " + subject
	}
	// old is the pod an UPDATE replaces (update.go); nil for a CREATE and
	// for workloads, whose templates only shape pods still to be judged.
	var old *podObject
	if req.Operation == admissionv1.Update && gvk == kindPod {
		o, err := oldPodOf(req)
		if err != nil {
			return refuse(req.UID, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("bulkhead: %s: %v", subject, err)), ResultError
		}
		old = &o
		if changed := requestAnnotationChanges(old.Meta.Annotations, pod.Meta.Annotations); len(changed) > 0 {
			return r.refuseChange(ctx, req, subject, pod.Name, changed)
		}
	}

	in, err := inputFor(req.Namespace, pod, r.handlers)
	if err != nil {
		return refuse(req.UID, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("bulkhead: %s: %v", subject, err)), ResultError
	}
	if ctx.Err() != nil {
		// Decoding cannot be interrupted, but its cost is bounded by the
		// body cap and scanQuantities; evaluation can, and is not started.
		return refuse(req.UID, http.StatusGatewayTimeout, metav1.StatusReasonTimeout, "bulkhead: "+subject+": "+ctx.Err().Error()), ResultError
	}
	readClaims(req.Namespace, in.Pod.ResourceClaims, r.claims)
	// Quotas count pods. A template is judged as one pod of a tenant with no
	// usage, like Kubernetes' own ResourceQuota: its pods meet the real
	// usage when the controller creates them, and updating a workload of a
	// tenant at its quota stays possible.
	if r.usage != nil && gvk == kindPod {
		in.Usage, err = r.tenantUsage(ctx, req.Namespace, pod.Object.UID)
		if err != nil {
			return refuse(req.UID, http.StatusInternalServerError, metav1.StatusReasonInternalError,
				fmt.Sprintf("bulkhead: %s: counting tenant usage (fail closed): %v", subject, err)), ResultError
		}
	}

	dec, err := r.decideWithLedger(ctx, req, gvk, pod, old, in)
	if err != nil {
		msg := fmt.Sprintf("bulkhead: %s: policy evaluation failed (fail closed): %v", subject, err)
		if rs := formatReasons(deniesOf(dec.Reasons)); rs != "" {
			msg += ": " + rs
		}
		return refuse(req.UID, http.StatusInternalServerError, metav1.StatusReasonInternalError, msg), ResultError
	}
	r.learn(req.Namespace, dec)
	return r.respond(subject, pod, dec)
}

// requestSubject names the object of req from the request's own fields,
// for refusals made before (or instead of) decoding the object.
func requestSubject(req *admissionv1.AdmissionRequest) string {
	kind := strings.ToLower(req.Kind.Kind)
	if kind == "" {
		kind = "object"
	}
	name := fmt.Sprintf("%q", req.Name)
	if req.Name == "" {
		name = "(name not yet set)"
	}
	s := fmt.Sprintf("%s %s in namespace %q", kind, name, req.Namespace)
	if req.SubResource != "" {
		s = req.SubResource + " of " + s
	}
	return s
}

// respond turns a decision into a response: deny-level reasons refuse,
// warn-level ones become warnings, audit-level ones audit annotations.
func (r *Reviewer) respond(subject string, pod podObject, dec policy.Decision) (*admissionv1.AdmissionResponse, string) {
	r.metrics.observeRevision(dec.Revision)
	var denies, warns, audits []policy.Reason
	for _, rs := range dec.Reasons {
		enf := rs.Enforcement
		if enf == "" {
			enf = policy.EnforceDeny
		}
		r.metrics.observeRule(rs.Rule, enf)
		switch enf {
		case policy.EnforceWarn:
			warns = append(warns, rs)
		case policy.EnforceAudit:
			audits = append(audits, rs)
		default:
			// Unknown modes are treated as deny: fail closed.
			denies = append(denies, rs)
		}
	}
	if !dec.Allow && len(denies) == 0 {
		denies = append(denies, policy.Reason{Rule: RulePolicyUndefined, Message: "the policy refused without naming a rule (fail closed)"})
		r.metrics.observeRule(RulePolicyUndefined, policy.EnforceDeny)
	}

	resp := &admissionv1.AdmissionResponse{Allowed: len(denies) == 0, Warnings: warningsOf(warns, dec.Warnings)}
	annotations := map[string]string{}
	if dec.ID != "" {
		annotations["decision-id"] = dec.ID
	}
	if dec.Revision != "" {
		annotations["bundle-revision"] = dec.Revision
	}
	if len(audits) > 0 {
		annotations["audit"] = formatReasons(audits)
	}
	if len(annotations) > 0 {
		resp.AuditAnnotations = annotations
	}
	if resp.Allowed {
		return resp, ResultAllowed
	}
	identity := fmt.Sprintf("tenant %q, tier %q", dec.Tenant, dec.Tier)
	if dec.Revision != "" {
		identity += ", bundle revision " + dec.Revision
	}
	resp.Result = &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusForbidden,
		Reason:  metav1.StatusReasonForbidden,
		Message: fmt.Sprintf("bulkhead denied %s (%s): %s", subject, identity, formatReasons(denies)),
	}
	return resp, ResultDenied
}

// tenantUsage sums the usage of every namespace the bundle maps to the same
// tenant as namespace. A namespace with no tenant counts alone.
func (r *Reviewer) tenantUsage(ctx context.Context, namespace string, exclude types.UID) (policy.Usage, error) {
	perNS, err := r.usage.Snapshot(exclude)
	if err != nil {
		return policy.Usage{}, err
	}
	tenant, err := r.tenantOf(ctx, namespace)
	if err != nil {
		return policy.Usage{}, err
	}
	if tenant == "" {
		return perNS[namespace], nil
	}
	var sum policy.Usage
	for ns, u := range perNS {
		t, err := r.tenantOf(ctx, ns)
		if err != nil {
			return policy.Usage{}, err
		}
		if t == tenant {
			sum.Sandboxes += u.Sandboxes
			sum.GPUSlices += u.GPUSlices
			sum.MemoryBytes = saturatingAdd(sum.MemoryBytes, max(u.MemoryBytes, 0))
		}
	}
	return sum, nil
}

// tenantOf returns the tenant the bundle derives from namespace. The bundle
// owns that mapping, so on a miss it asks the policy about an empty pod in
// the namespace and keeps the answer until the bundle revision changes.
func (r *Reviewer) tenantOf(ctx context.Context, namespace string) (string, error) {
	r.mu.RLock()
	t, ok := r.tenants[namespace]
	r.mu.RUnlock()
	if ok {
		return t, nil
	}
	dec, err := r.decider.Decide(ctx, policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindAdmission,
		Namespace: namespace,
		Pod:       policy.Pod{Name: "bulkhead-tenant-probe"},
	})
	if err != nil {
		return "", fmt.Errorf("resolving the tenant of namespace %q: %w", namespace, err)
	}
	r.learn(namespace, dec)
	return dec.Tenant, nil
}

// learn records the namespace's tenant from a decision, forgetting every
// mapping when the decision comes from a new bundle revision.
// Only decisions made without error are learnt from.
func (r *Reviewer) learn(namespace string, dec policy.Decision) {
	r.mu.RLock()
	known, ok := r.tenants[namespace]
	same := ok && known == dec.Tenant && r.revision == dec.Revision
	r.mu.RUnlock()
	if same {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if dec.Revision != r.revision {
		r.tenants = map[string]string{}
		r.revision = dec.Revision
	}
	r.tenants[namespace] = dec.Tenant
}

func deniesOf(rs []policy.Reason) []policy.Reason {
	var out []policy.Reason
	for _, r := range rs {
		if r.Enforcement == "" || r.Enforcement == policy.EnforceDeny {
			out = append(out, r)
		}
	}
	return out
}

// A response lists at most maxListed reasons and maxListed warnings, each
// cut to maxReasonBytes, and says how many more it omitted: a pod of
// 10,000 privileged containers once got a 2.6 MB denial. The decision log
// keeps every reason.
const (
	maxListed      = 25
	maxReasonBytes = 1024
)

// formatReasons lists reasons as "[rule] message; [rule] message" in the
// decision's order (the default bundle's puts the decisive reason first,
// policy.Decision.Reasons), each listed once.
func formatReasons(rs []policy.Reason) string {
	seen := make(map[policy.Reason]bool, len(rs))
	rs = slices.DeleteFunc(slices.Clone(rs), func(r policy.Reason) bool {
		dup := seen[r]
		seen[r] = true
		return dup
	})
	parts := make([]string, 0, min(len(rs), maxListed)+1)
	for _, r := range rs[:min(len(rs), maxListed)] {
		parts = append(parts, cut(fmt.Sprintf("[%s] %s", r.Rule, r.Message)))
	}
	if len(rs) > maxListed {
		parts = append(parts, fmt.Sprintf("%d more reasons omitted", len(rs)-maxListed))
	}
	return strings.Join(parts, "; ")
}

// warningsOf lists warn-level reasons, then the decision's other
// warnings, each once (a warn reason also appears in decision.warnings as
// "rule: message"), in linear time, capped at maxListed.
func warningsOf(warns []policy.Reason, other []string) []string {
	seen := make(map[string]bool, len(warns)+len(other))
	var out []string
	omitted := 0
	add := func(key, text string) {
		if seen[key] {
			return
		}
		seen[key] = true
		if len(out) == maxListed {
			omitted++
			return
		}
		out = append(out, cut(text))
	}
	for _, w := range warns {
		add(w.Rule+": "+w.Message, fmt.Sprintf("bulkhead [%s] %s", w.Rule, w.Message))
	}
	for _, w := range other {
		add(w, "bulkhead: "+w)
	}
	if omitted > 0 {
		out = append(out, fmt.Sprintf("bulkhead: %d more warnings omitted", omitted))
	}
	return out
}

// cut shortens one listed reason or warning to maxReasonBytes.
func cut(s string) string {
	if len(s) <= maxReasonBytes {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes omitted)", strings.ToValidUTF8(s[:maxReasonBytes], ""), len(s)-maxReasonBytes)
}

func refuse(uid types.UID, code int32, reason metav1.StatusReason, msg string) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{
		UID:     uid,
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg},
	}
}
