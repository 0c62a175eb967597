package admission

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// An UPDATE of a pod can change what it asks of a node only through the
// fields the API server lets change after create: its containers'
// resources (the resize subresource, in place), its ephemeral containers
// (kubectl debug) and its metadata. Review judges the first two as the
// pod they make; this file keeps the two rules that need the pod as it
// was (request.oldObject):
//
//   - bulkhead.dev/ request annotations are fixed at create. The node read
//     them when it started the sandbox (its GPU, RDMA, identity) and never
//     reads them again, and the quota ledger charges the pod by them: an
//     edit would change the charge without changing what the pod holds.
//   - An admitted pod's reservation never shrinks on UPDATE: a resize to
//     less memory is a wish the kubelet may defer or refuse (a memory
//     limit below the usage is not applied), and the webhook cannot tell
//     whether the node started the pod already. Only deletion or the end of
//     the pod (quota.go's release) gives a reservation back.

// SubresourceResize is the pods subresource of an in-place resize
// (kubectl patch --subresource resize): an UPDATE of kind v1 Pod whose
// object is the whole pod with its containers' new resources. Review
// judges it as that pod, against the tenant's quota with the pod's old
// charge excluded, and re-charges the reservation to the new resources.
const SubresourceResize = "resize"

// RuleRequestAnnotationImmutable refuses an UPDATE of a pod that adds,
// changes or removes a bulkhead.dev/ request annotation.
const RuleRequestAnnotationImmutable = "request.annotation_immutable"

// oldPodOf decodes the pod an UPDATE replaces. The API server always sends
// it; an UPDATE without one cannot be judged against the pod's reservation
// and is refused.
func oldPodOf(req *admissionv1.AdmissionRequest) (podObject, error) {
	old, err := podOf(kindPod, req.OldObject.Raw)
	if err != nil {
		return old, fmt.Errorf("request.oldObject (the pod as it was, which the API server sends with every UPDATE): %w", err)
	}
	return old, nil
}

// requestAnnotationChanges lists, one reason per key in key order, the
// bulkhead.dev/ annotations that before and after do not hold alike.
func requestAnnotationChanges(before, after map[string]string) []policy.Reason {
	keys := map[string]bool{}
	for _, m := range []map[string]string{before, after} {
		for k := range m {
			if strings.HasPrefix(k, policy.RequestAnnotationPrefix) {
				keys[k] = true
			}
		}
	}
	var out []policy.Reason
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		was, had := before[k]
		is, has := after[k]
		var change string
		switch {
		case had && has && was == is:
			continue
		case had && has:
			change = fmt.Sprintf("changed from %q to %q", truncate(was, 64), truncate(is, 64))
		case had:
			change = fmt.Sprintf("removed (was %q)", truncate(was, 64))
		default:
			change = fmt.Sprintf("added (%q)", truncate(is, 64))
		}
		out = append(out, policy.Reason{
			Rule:        RuleRequestAnnotationImmutable,
			Enforcement: policy.EnforceDeny,
			Message: fmt.Sprintf("annotation %s %s; %s annotations are requests fixed when the pod is created (its node, GPU and quota charge were decided on them): delete and re-create the pod instead",
				truncate(k, 128), change, policy.RequestAnnotationPrefix),
		})
	}
	return out
}

// refuseChange refuses an UPDATE for the request annotations it changes,
// before the new ones are even parsed and whatever the policy would say of
// a pod that will never run with them. The bundle is asked about the
// namespace alone, as for tenantOf, so that the refusal names the tenant
// and tier; nothing touches the ledger.
func (r *Reviewer) refuseChange(ctx context.Context, req *admissionv1.AdmissionRequest, subject, name string, changed []policy.Reason) (*admissionv1.AdmissionResponse, string) {
	dec, err := r.decider.Decide(ctx, policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindAdmission,
		Namespace: req.Namespace,
		Pod:       policy.Pod{Name: name},
	})
	if err != nil {
		return refuse(req.UID, http.StatusInternalServerError, metav1.StatusReasonInternalError,
			fmt.Sprintf("bulkhead: %s: policy evaluation failed (fail closed): %v: %s", subject, err, formatReasons(changed))), ResultError
	}
	r.learn(req.Namespace, dec)
	dec.Allow, dec.Reasons, dec.Warnings = false, changed, nil
	return r.respond(subject, podObject{}, dec)
}

// maxUsage is the larger of a and b in every field: the charge of a pod
// whose reservation may grow but not shrink.
func maxUsage(a, b policy.Usage) policy.Usage {
	return policy.Usage{Sandboxes: max(a.Sandboxes, b.Sandboxes), GPUSlices: max(a.GPUSlices, b.GPUSlices), MemoryBytes: max(a.MemoryBytes, b.MemoryBytes)}
}
