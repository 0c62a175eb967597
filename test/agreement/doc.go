// Package agreement holds one case set that Bulkhead's two enforcement
// points must decide alike: the admission webhook (policy/admission's HTTP
// handler, an AdmissionReview in) and the node (a real containerd with both
// Bulkhead shims, the pod turned into CRI requests as a kubelet would).
//
// The invariant it checks: for every pod spec of the table both reach the
// same verdict and refuse with the same rule ids, except the cases the
// table marks as invisible to one side, each with the reason (docs/security.md,
// "What the node cannot see"). Every case carries its expected verdicts,
// written down from the tier table (docs/policy.md), never computed by
// asking one side to predict the other: a case where both sides are wrong
// in the same way still fails.
//
// The package has only tests; this file is its documentation.
package agreement
