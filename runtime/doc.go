// Package runtime is Bulkhead's node runtime: the containerd shims that
// place every pod of a node, and the node-wide state they share.
//
// # Invariant
//
// Nothing of a pod runs before the policy has admitted it as containerd
// wrote it, and nothing a pod held outlives it. Every sandbox and every
// container reaching a Bulkhead shim is judged from its OCI spec, not from
// what a pod author or an admission webhook said; a pod holds its quota,
// GPU and fence entry from one ledger transaction until its sandbox is
// deleted or GC finds it dead.
//
// # One pod's path
//
// One shim process serves one pod (containerd routes every container of the
// pod to it by io.kubernetes.cri.sandbox-id). Two shims share the code, each
// wrapping its task service around one Pod:
//
//   - containerd-shim-bulkhead-v1 (handler bulkhead): gVisor's task service
//     with gvisor.PodExtension (package runtime/gvisor) in front of it;
//   - containerd-shim-bulkhead-runc-v1 (handler bulkhead-runc): containerd's
//     runc task service with RuncTask in front of it, for the tiers the
//     policy lets run on the host kernel.
//
// This package imports nothing of gVisor: whatever only the gVisor shim
// needs (its pod extension, its shim manager, runsc's options) lives in
// runtime/gvisor, so that the runc shim, executed twice on every pod start,
// does not link and initialise gVisor's shim library.
//
// On the sandbox's create, in order: record (the sandbox's file, before
// anything exists, so that GC can find a crash); decide (the policy, from
// the namespace's tenant, the bulkhead.dev/ requests, the host namespaces
// and sysctls the spec shares, the node's GPUs); reserve (in one bbolt
// transaction: usage, the decision again with it for quotas, the GPU
// placement); gpu (a MIG instance on runc, a whole GPU in gVisor, injected
// into the spec, and a CDI spec for it in mig.cdi_spec_dir); then, at the
// same time, sandbox (the task service creates it) and fence (the pod's
// host veth registered in the eBPF maps), both finished before the create
// returns; activate. A failure at any step unwinds the steps taken, in
// reverse. The decision must name the runtime the shim runs
// (runtime.handler_mismatch otherwise). The pipeline itself (ledger, MIG
// backend, fence, policy engine) and a GC pass begin opening when the shim
// begins to serve (OpenEarly), before containerd sends the create.
//
// On every other container's create: the policy again (input kind
// container) on what that container asks of the host — host bind mounts
// with the pod's own kubelet and containerd files told apart by where they
// live, device nodes named by their host node, capabilities beyond
// containerd's default set, host namespaces, sysctls — then the RDMA grant
// and the pod's GPU. A refused container is never created.
//
// On every resource update (a task Update: CRI UpdateContainerResources,
// the kubelet's in-place resize): the policy once, on the pod's memory
// charge kept at least the sum of its live containers' limits. Growth is
// the pod admitted again at its new size (kind sandbox, usage of the
// tenant's other pods) in the ledger transaction that writes the new charge
// before the runtime acts, undone if it fails; any other update is a
// container decision, a smaller charge written once the runtime applied it.
// A container's create whose limit takes the pod past its charge (an update
// made before it started) is charged the same way. The fence step refuses a
// pod whose network namespace has an interface besides the loopback and
// eth0 that could carry traffic past the fence (network.unfenced_interface).
//
// On the sandbox's delete: fence entry, MIG instance, CDI spec and
// reservation are released, then the record. What a crash leaves is repaired by GC: every
// shim runs it when it opens the pipeline, and `bulkhead node gc` on
// demand. A sandbox is alive while its shim runs or runsc/runc still hold
// state for it; GC never frees what a live container may use.
//
// # Failing closed
//
// A policy error, an undefined decision, a bundle that does not verify, a
// ledger or NVML error, or a fence that cannot be loaded (the fence is on
// unless the node's file says netpol.enabled = false) refuses the pod with
// a message naming the rule as the webhook does: "bulkhead refused pod
// NS/NAME (tenant T): [rule.id] message".
package runtime
