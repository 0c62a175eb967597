// Package node holds what outlives a pod on a Bulkhead node: the ledger of
// what each pod holds (quota, GPU placement, MIG instance, fence entry),
// the records of its sandboxes, the GPUs with their MIG backend, the fence,
// the release and repair (GC) of all of it, and the node's status report
// (Status). One process opens it, the node agent (`bulkhead node gc` on
// demand; `bulkhead node status` reads it with ReadStatus when the agent is
// down); what one pod does while it is placed is package runtime's, which
// places pods on a Node.
//
// # Invariant
//
// Nothing a pod held outlives it. Whatever is made for a pod is written
// down here before it is made — its record (StateDir) before anything
// exists for the sandbox, its reservation (Ledger) before its MIG instance,
// CDI spec or fence entry — so that Release, when the sandbox is deleted,
// and GC, when it is found dead, can find and undo every part of it, in
// reverse, whichever process made it and whenever that process died. GC
// never frees what a live sandbox may use: a sandbox is alive while its
// shim runs or runsc or runc still hold state for it (SandboxAlive).
//
// # Rules
//
//  1. The ledger is one bbolt file; each transaction holds its exclusive
//     lock, so transactions are serialised across processes and a crashed
//     process releases the lock with its file descriptor.
//  2. A release that fails keeps the reservation, so that a later GC pass
//     retries it; releasing twice is harmless.
//  3. Readers of a node (OpenLedgerReadOnly, GPUsReadOnly, ReadStatus)
//     create nothing: they leave the node as they found it.
//  4. The package decides nothing: the policy is asked by package runtime,
//     and what the node keeps of a decision (Sandbox.Decision, Input) is
//     only data for the pod's later containers and updates.
//  5. A record is sealed under the node key when it is saved and
//     authenticated when it is loaded (seal.go): state_dir may be written by
//     others than the agent, the ledger and the key may not. What a record
//     that does not authenticate says is only ever a hint (GC's liveness).
package node
