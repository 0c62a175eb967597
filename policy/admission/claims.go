package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	resourcelisters "k8s.io/client-go/listers/resource/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// ListerClaims is a ClaimReader over informer caches of resource.k8s.io/v1
// ResourceClaims and ResourceClaimTemplates (for example
// informers.SharedInformerFactory.Resource().V1()). It reads the spec as
// the cache holds it: a template created in the same instant as its pod may
// not be there yet, and the claim is then judged unread (refused below
// trusted), which the pod's controller retries.
type ListerClaims struct {
	// Claims lists ResourceClaims; required.
	Claims resourcelisters.ResourceClaimLister
	// Templates lists ResourceClaimTemplates; required.
	Templates resourcelisters.ResourceClaimTemplateLister
}

// ClaimSpec implements ClaimReader.
func (l ListerClaims) ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error) {
	if l.Claims == nil || l.Templates == nil {
		return nil, errors.New("admission: ListerClaims needs both listers")
	}
	if template {
		t, err := l.Templates.ResourceClaimTemplates(namespace).Get(name)
		if err != nil {
			return nil, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", namespace, name, err)
		}
		return &t.Spec.Spec, nil
	}
	c, err := l.Claims.ResourceClaims(namespace).Get(name)
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return &c.Spec, nil
}

// DRA claims are judged on their own as well as through the pods that
// use them. A pod is judged on its claims as they are when it is admitted
// (readClaims), but a ResourceClaim or ResourceClaimTemplate is a separate
// object: its spec is immutable, yet the tenant may delete it and create
// another under the same name before the scheduler allocates it (or before
// the claim controller makes the pod's claim from the template), and the
// pod then gets the new one's devices. Judging every claim and template
// created in a tenant's namespace by the same DRA rules closes that: a
// claim a pod can be handed is one its tier allows.
var (
	kindResourceClaim         = schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"}
	kindResourceClaimTemplate = schema.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaimTemplate"}
)

// ClaimKinds lists the DRA kinds Review judges on their own, in the order
// the ValidatingWebhookConfiguration lists their resources. Their specs
// are immutable, so the configuration routes their CREATE only.
func ClaimKinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{kindResourceClaim, kindResourceClaimTemplate}
}

func isClaimKind(gvk schema.GroupVersionKind) bool {
	return gvk == kindResourceClaim || gvk == kindResourceClaimTemplate
}

// claimOf decodes a ResourceClaim or ResourceClaimTemplate: its metadata
// and the claim spec it asks for.
func claimOf(gvk schema.GroupVersionKind, raw []byte) (metav1.ObjectMeta, *resourcev1.ResourceClaimSpec, error) {
	if len(raw) == 0 {
		return metav1.ObjectMeta{}, nil, errors.New("object: empty")
	}
	if err := scanQuantities(raw); err != nil {
		return metav1.ObjectMeta{}, nil, fmt.Errorf("object: decoding %s: %w", gvk.Kind, err)
	}
	if gvk == kindResourceClaimTemplate {
		var t resourcev1.ResourceClaimTemplate
		if err := json.Unmarshal(raw, &t); err != nil {
			return metav1.ObjectMeta{}, nil, fmt.Errorf("object: decoding %s: %w", gvk.Kind, err)
		}
		return t.ObjectMeta, &t.Spec.Spec, nil
	}
	var c resourcev1.ResourceClaim
	if err := json.Unmarshal(raw, &c); err != nil {
		return metav1.ObjectMeta{}, nil, fmt.Errorf("object: decoding %s: %w", gvk.Kind, err)
	}
	return c.ObjectMeta, &c.Spec, nil
}

// reviewClaim judges a ResourceClaim or ResourceClaimTemplate as what it
// adds to a pod of its namespace: the bundle decides a pod that holds only
// this claim, read, and a pod that holds nothing, and the claim is refused
// for the reasons the first has and the second lacks. So the DRA rules
// (gpu.dra_forbidden, workload.device_class, ...) judge it as they would
// in a pod, the bundle owning which rules those are, while what any pod of
// the namespace would be refused for (a missing RuntimeClass, an unknown
// tenant) is left to the pods.
func (r *Reviewer) reviewClaim(ctx context.Context, req *admissionv1.AdmissionRequest, gvk schema.GroupVersionKind) (*admissionv1.AdmissionResponse, string) {
	meta, spec, err := claimOf(gvk, req.Object.Raw)
	if err != nil {
		return refuse(req.UID, http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("bulkhead: %s: %v", requestSubject(req), err)), ResultError
	}
	if req.Operation == admissionv1.Update && meta.DeletionTimestamp != nil {
		return &admissionv1.AdmissionResponse{Allowed: true}, ResultAllowed // finalizers on the way out
	}
	name := meta.Name
	if name == "" {
		name = meta.GenerateName
	}
	subject := fmt.Sprintf("%s %q in namespace %q", strings.ToLower(gvk.Kind), name, req.Namespace)
	claim := policy.ResourceClaim{Name: name, Read: true, Requests: deviceRequestsOf(spec)}
	if gvk == kindResourceClaimTemplate {
		claim.TemplateName = name
	} else {
		claim.ClaimName = name
	}
	in := policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindAdmission,
		Namespace: req.Namespace,
		Pod:       policy.Pod{Name: name, ResourceClaims: []policy.ResourceClaim{claim}},
	}
	with, err := r.decider.Decide(ctx, in)
	var without policy.Decision
	if err == nil {
		in.Pod.ResourceClaims = nil
		without, err = r.decider.Decide(ctx, in)
	}
	if err != nil {
		return refuse(req.UID, http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("bulkhead: %s: policy evaluation failed (fail closed): %v", subject, err)), ResultError
	}
	r.learn(req.Namespace, with)
	return r.respond(subject, podObject{}, claimShare(with, without))
}

// claimShare is decision with, less what without (the same pod without the
// claim) also has: the reasons and warnings the claim adds. It admits when
// the claim adds no deny, unless with refused without naming a rule where
// without admitted (fail closed: the claim made the difference).
func claimShare(with, without policy.Decision) policy.Decision {
	out := with
	out.Reasons = slices.DeleteFunc(slices.Clone(with.Reasons), func(r policy.Reason) bool { return slices.Contains(without.Reasons, r) })
	out.Warnings = slices.DeleteFunc(slices.Clone(with.Warnings), func(w string) bool { return slices.Contains(without.Warnings, w) })
	out.Allow = with.Allow || !without.Allow
	out.Allow = admits(out) // and a deny the claim adds refuses
	return out
}
