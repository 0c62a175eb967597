// Package gvisor holds what only the gVisor shim (containerd-shim-bulkhead-v1,
// runtime type io.containerd.bulkhead.v1) needs: PodExtension, the shim's
// pod (runtime/shim, which asks the node agent) in front of gVisor's task
// service; the shim manager that starts
// one shim process per pod and writes gVisor's options file into the
// sandbox's bundle; and the runsc options Bulkhead derives from its own
// configuration.
//
// # Invariant
//
// Every container of a pod reaches gVisor's task service pointing at the
// options file in its sandbox's bundle, and a sandbox whose bundle lacks that
// file is refused before the policy is asked, leaving nothing behind.
//
// It is a package of its own, as runtime/runc is, so that neither shim
// links the other's runtime: containerd executes a shim twice on every pod
// start, and each exec of the runc shim paid for gVisor's package inits.
package gvisor
