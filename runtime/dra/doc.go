// Package dra is Bulkhead's DRA kubelet plugin (driver mig.bulkhead.dev),
// hosted by the node agent: it publishes the node's MIG capacity as the
// ResourceSlices package mig/dra describes, and prepares the devices the
// scheduler allocated from them through the node's pipeline.
//
// Invariant: a device this node prepares is judged, reserved and created
// exactly as a pod's annotated slice is — the policy in force decides with
// the claim's tenant's usage in one ledger transaction, and the allocator
// refuses a placement that overlaps one the ledger holds or breaks a
// co-tenancy rule — and whatever a refused or failed preparation made is
// undone before the kubelet hears of it. The ledger, not this process,
// holds what was prepared: the reservation is keyed by the claim's UID and
// names the claim, so an unprepare after an agent restart finds it, GC
// leaves it alone, and `bulkhead node status` shows it.
//
// The order of work for one claim (runtime.Pipeline.PrepareClaim):
//
//  1. the allocated device, by name, is read back to its placement
//     (mig/dra.PartitionOf) from the devices this node publishes now;
//  2. the policy decides on a sandbox input asking for that profile, in
//     the claim's namespace, with the runtime handler of the pod the claim
//     is reserved for;
//  3. the placement is reserved under the claim's UID;
//  4. the MIG instance is created and recorded;
//  5. the CDI spec is written, its one device named by the claim's UID.
//
// The scheduler tracks what it allocated through the published counters,
// so the slices change only when the GPUs do (a GPU appears, leaves or
// changes MIG mode); the plugin reads the backend's GPUs every
// Options.PollInterval and republishes on a change.
//
// The kubelet unprepares a claim before it is deleted or deallocated,
// unless its own state was lost; then nothing on the node would end the
// claim's reservation. Once the slices are published, and every
// Options.SweepInterval after, the plugin looks up each claim the ledger
// holds and releases, as an unprepare does, one the API server says is
// gone: not found, recreated under another UID, or no longer allocated
// the device this node holds for it. Nothing else (the API server down,
// forbidden) releases anything, and a reservation written in the last
// ClaimGrace is left alone: its claim may be being prepared.
package dra
