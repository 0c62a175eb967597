// Package mig owns a node's GPU partitions: the hardware geometry of every
// supported GPU model, the allocator that places MIG slices across a node's
// GPUs, the types its backends share (GPUInfo, Instance, Backend) and the
// registry a node opens its backend from by name (RegisterBackend,
// OpenBackend). The jobs around it live in subpackages that import it:
// nvmlbackend creates and destroys GPU and compute instances through NVML
// (backend "nvml"), mocknode is a hardware-true simulated node for that
// backend (backend "mock", linked by mocknode/register only into builds with
// the tag bulkhead_mockgpu), inject hands a GPU or slice to a container
// (OCI spec options and CDI specs), simulate replays workloads through the
// allocator.
//
// Invariant: a placement is only ever produced if the hardware would accept
// it. Every placement uses the start positions and sizes real NVML reports in
// 8 memory-slot units, never overlaps another instance on its GPU, never takes
// the GPU past 7 compute slices and respects each profile's instance limit.
// Releasing a placement restores the GPU's capacity exactly, and the same
// inputs always yield the same placement.
package mig
