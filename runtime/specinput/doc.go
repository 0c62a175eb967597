// Package specinput turns what containerd hands a Bulkhead shim — a
// sandbox's or a container's OCI spec, a task update's resources — into
// the policy's input (policy.Input), as plain functions: Sandbox,
// Container, DecodeResources, MemoryAfter.
//
// # Invariant
//
// The input says what will run, read from the spec containerd wrote, never
// from what a pod's author or an admission webhook said: host namespaces
// are the namespaces the spec leaves out, a host path is where a bind's
// source leads on the host (a kubelet subPath resolved through the mount
// table, symlinks followed), a device is the host node with the entry's
// type and numbers, a capability is one beyond containerd's default set.
// The pod's identity comes from its record (Pod), which the node took from
// containerd's CRI annotations.
//
// # Rules
//
//  1. A function here asks no policy and writes nothing; it reads only the
//     spec, the node's mount table and /dev.
//  2. What the pod itself owns (its volumes, the kubelet's and containerd's
//     files for it, under Dirs) is not a host path; its volumes are listed
//     by type instead. What the node cannot tell apart (a claim's volume
//     from an inline source of its plugin) is said, not guessed
//     (policy.Volume.MayBeClaim).
//  3. The package imports neither runtime nor runtime/node: the pod is
//     given as a Pod value rather than the node's record, so that turning a
//     spec into input can be tested on a plain specs.Spec and cannot touch
//     the ledger or the fence.
package specinput
