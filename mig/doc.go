// Package mig owns a node's GPU partitions: the hardware geometry of every
// supported GPU model, the allocator that places MIG slices across a node's
// GPUs, the backends that create and destroy GPU and compute instances
// (NVML and a hardware-true mock), and the OCI/CDI device injection that
// hands a slice to a container.
//
// Invariant: a placement is only ever produced if the hardware would accept
// it. Every placement uses the start positions and sizes real NVML reports in
// 8 memory-slot units, never overlaps another instance on its GPU, never takes
// the GPU past 7 compute slices and respects each profile's instance limit.
// Releasing a placement restores the GPU's capacity exactly, and the same
// inputs always yield the same placement.
package mig
