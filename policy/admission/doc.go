// Package admission is Bulkhead's validating admission webhook: it turns an
// admission.k8s.io/v1 AdmissionRequest for a Pod, or for a workload that
// carries a pod template, into a policy.Input of kind "admission", asks the
// same policy bundle the nodes use, and answers with an AdmissionResponse.
//
// Invariants the package keeps:
//   - Identity comes from the request's namespace only. Pod annotations under
//     bulkhead.dev/ are requests; a tenant or tier written there that differs
//     from what the bundle derives from the namespace is refused.
//   - It fails closed: a policy error, an undefined decision, an input it
//     cannot read or a usage it cannot count refuses the object with a
//     message that names the rule or field and why.
//   - A pod's bulkhead.dev/ requests are fixed at create, and its quota
//     reservation may grow on UPDATE (an in-place resize) but never shrink
//     until the pod ends (update.go). DRA claims and claim templates are
//     judged on their own at create (claims.go), so a claim swapped under
//     a pod's reference meets the rules the pod would.
//   - Review is a pure function of the request, the policy and the usage
//     snapshot; the HTTP layer (Handler) only decodes, bounds and encodes.
//   - With a Rotator, the serving certificate is renewed before it expires
//     and is never signed by a CA the API server has not been given in
//     caBundle first (rotate.go).
package admission
