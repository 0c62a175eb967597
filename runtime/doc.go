// Package runtime is what one pod goes through on a Bulkhead node: the
// pipeline that places its sandbox (Pipeline.Place), judges each of its
// later containers (AdmitContainer) and re-charges it when a container's
// resources change (Recharge), and the Pod that drives the pipeline for
// one pod's shim. The node agent (runtime/agent) holds one Pipeline for
// the node and one Pod per pod.
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
// # What is where
//
// Split by lifetime: what outlives a pod is runtime/node's, what one pod
// goes through is this package's, and turning a spec into the policy's
// input is neither's.
//
//   - runtime (this package): the Pipeline (a *node.Node and the policy it
//     asks) with Place's step table (place.go) and each step in a file of
//     its own — decide.go, reserve.go, gpu.go, sandbox.go, fence.go,
//     activate.go — then a later container's admission (container.go) and
//     a resource update's charge (recharge.go); the Pod (pod.go) that
//     records the sandbox and drives them; RefusedError (refusal.go).
//   - runtime/node: the node's Node — ledger, sandbox records, GPUs and
//     their MIG backend, fence — with Release and GC, and the node's status
//     report (Status, ReadStatus). It decides nothing.
//   - runtime/specinput: plain functions from a spec (and a task update's
//     resources) to policy.Input; it imports neither runtime nor
//     runtime/node.
//   - runtime/agent serves the shims; runtime/shim, runtime/gvisor and
//     runtime/runc are the shims' side and link none of the three packages
//     above (the go list -deps tests of cmd/containerd-shim-bulkhead*-v1
//     prove it); runtime/agentapi is their protocol, runtime/config the
//     node's file, runtime/cri containerd's annotations.
//
// # One pod's path
//
// One shim process serves one pod (containerd routes every container of the
// pod to it by io.kubernetes.cri.sandbox-id) and asks the agent for
// everything; the agent runs the pod's Pod, which calls back into the
// shim's task service (gVisor's, or containerd's runc one) where something
// must be created or deleted.
//
// On the sandbox's create, in order: record (the sandbox's file in the
// node's state directory, before anything exists, so that GC can find a
// crash); decide (the policy input read from the spec: the namespace's
// tenant, the bulkhead.dev/ requests, the host namespaces and sysctls the
// spec shares); reserve (in one bbolt transaction: the node's GPUs and the
// tenant's usage, the policy with them, the GPU placement); gpu (a MIG
// instance on runc, a whole GPU in gVisor, injected into the spec, and a
// CDI spec for it in mig.cdi_spec_dir); then, at the same time, sandbox
// (the task service creates it) and fence (the pod's host veth registered
// in the eBPF maps), both finished before the create returns; activate. A
// failure at any step unwinds the steps taken, in reverse. The decision
// must name the runtime the shim runs (runtime.handler_mismatch
// otherwise).
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
// reservation are released (node.Node.Release), then the record. What a
// crash leaves is repaired by GC (node.Node.GC): the agent runs it when it
// starts, every little while and soon after a shim died mid-call, and
// `bulkhead node gc` on demand. A sandbox is alive while its shim runs or
// runsc/runc still hold state for it; GC never frees what a live container
// may use.
//
// # Failing closed
//
// A policy error, an undefined decision, a bundle that does not verify, a
// ledger or NVML error, or a fence that cannot be loaded (the fence is on
// unless the node's file says netpol.enabled = false) refuses the pod with
// a message naming the rule as the webhook does: "bulkhead refused pod
// NS/NAME (tenant T): [rule.id] message (bundle revision R)". When the node
// agent cannot be reached, the shim refuses the same way, naming the agent
// and its socket.
package runtime
