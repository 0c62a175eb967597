// Package dra publishes a node's MIG capacity to the Kubernetes scheduler
// as Dynamic Resource Allocation (resource.k8s.io/v1) partitionable devices:
// the content of the node's ResourceSlices, the DeviceClass that selects
// them and the way back from an allocated device to a MIG placement. It
// imports mig, the resource.k8s.io/v1 types and apimachinery's quantities
// and object metadata, nothing that talks to a cluster: the kubelet plugin that hands these slices to the API server and
// prepares what the scheduler allocated is built on top of it.
//
// Invariant: the scheduler can never allocate two devices that the hardware
// would refuse to hold at once, and it can allocate every placement the
// hardware accepts. Each GPU in MIG mode gets one counter set (SharedCounters)
// with one counter per memory slot (8, value 1 each), one for the compute
// slices (7) and one per profile whose instance limit is tighter than its
// memory and compute ("+me": one instance per GPU). Each (GPU, profile,
// start) the geometry allows is one device that consumes exactly the memory
// slots it covers, its compute slices and, where there is one, its profile's
// instance counter. Two devices that overlap share a memory-slot counter of
// value 1, so the scheduler allocates at most one of them: the counters say
// what mig's Occupancy.Fits says, no more and no less (tested in every
// occupancy a GPU can reach).
//
// # Order is the placement policy
//
// The scheduler's allocator walks the devices of a pool slice by slice, each
// slice in the order it lists its devices, and takes the first one that
// matches the claim and whose counters are free. The order devices are
// published in is therefore the placement policy the scheduler follows.
// Publish lists them so that first fit does what Bulkhead's best fit would
// as far as one fixed order can (OrderPreferred):
//
//  1. Profiles smallest first (memory slots, then compute), as the allocator
//     ranks the candidates of a request given by minimums: a claim whose
//     selector matches several profiles gets the smallest.
//  2. Within a profile, GPUs by index: used GPUs fill before later ones are
//     touched, which is best fit's "pack the fuller GPU" while GPUs fill in
//     index order.
//  3. Within a GPU, the profile's starts in the order best fit takes them
//     when it fills an empty GPU with that profile alone (1g: slots 6, 4,
//     5, then 0-3: slots 0-3 stay whole for a 4g or 3g as long as they
//     can, and slot 6 breaks no 2g); starts best fit never reaches (an
//     instance limit) follow in ascending order.
//
// OrderAscending (GPU, then start, ascending) is the naive order; first fit
// over it places exactly as mig.FirstFit does.
//
// What a static order cannot express, and best fit does:
//   - Best fit scores a start by the capacity it would cost given what the
//     GPU already holds; a fixed list prefers the same start whatever is
//     around it and takes the next free one when it is taken.
//   - Best fit sends a slice to the GPU where it costs least (a hole left by
//     a departure on GPU 5 rather than breaking a pair on GPU 0) and, on a
//     tie, to the fuller GPU; GPU order here is by index only, so after
//     departures the lowest-indexed GPU with room wins.
//   - Co-tenancy (tenant-isolated and exclusive slices) is not in the
//     counters: the scheduler cannot see who holds a slice, so the node
//     still judges it when it prepares the claim.
//
// Republishing the order after every allocation would express all of it,
// but ResourceSlice updates race with the scheduler and every change is an
// API write; the simulation (mig/simulate, "dra-first-fit") measures what
// the static order gives up.
//
// # Limits of the API
//
// A ResourceSlice holds devices or counter sets, never both; at most 8
// counter sets of at most 32 counters; at most 64 devices when they consume
// counters (128 otherwise); at most 2 counter consumptions per device.
// Publish puts the counter sets in slices of 8 GPUs and the devices in
// slices of 64, keeping every profile's devices in one slice where they fit
// (56 for a 1g on 8 GPUs), so that the order holds whichever way the
// scheduler walks the slices. kube-scheduler v1.37 with its default feature
// gates runs the "incubating" allocator (DRAConsumableCapacity and
// DRADeviceBindingConditions are on, and the "stable" one lacks them),
// which sorts a pool's slices by name; the kubelet plugin helper names them
// with their index first, zero-padded, so a profile that spans slices (1g
// from 10 GPUs on) keeps its order there. The stable allocator, used when
// those gates are off, walks slices in the order its lister returns them.
// Device names are DNS labels ("gpu0-3g-71gb-at4"), unique in the pool.
package dra
