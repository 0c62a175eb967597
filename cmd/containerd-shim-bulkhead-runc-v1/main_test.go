package main

import (
	"testing"

	"github.com/bulkhead-runtime/bulkhead/internal/linkcheck"
)

// TestShimLinksNoPolicyFenceOrGPU keeps the runc shim thin: containerd
// executes a shim twice on every pod start, and everything the pod needs
// decided is the node agent's. The shim links neither gVisor (it made this
// binary 72 MB with 393 package inits), nor OPA, nor Bulkhead's pipeline,
// policy, fence or GPU packages, nor NVML. cilium/ebpf it links only as far
// as containerd's own runc shim does (its cgroup device filter).
func TestShimLinksNoPolicyFenceOrGPU(t *testing.T) {
	ours := linkcheck.Deps(t, ".")
	linkcheck.Forbid(t, "containerd-shim-bulkhead-runc-v1", ours, []string{
		"gvisor.dev/...",
		"github.com/open-policy-agent/...",
		"github.com/NVIDIA/go-nvml/...",
		"github.com/bulkhead-runtime/bulkhead/policy/...",
		"github.com/bulkhead-runtime/bulkhead/netpol/...",
		"github.com/bulkhead-runtime/bulkhead/mig/...",
		"github.com/bulkhead-runtime/bulkhead/runtime",
		"github.com/bulkhead-runtime/bulkhead/runtime/agent/...",
		"github.com/bulkhead-runtime/bulkhead/runtime/node/...",
		"github.com/bulkhead-runtime/bulkhead/runtime/specinput/...",
		"github.com/bulkhead-runtime/bulkhead/runtime/gvisor/...",
	})
	linkcheck.NoMoreThan(t, "containerd-shim-bulkhead-runc-v1", ours, "github.com/cilium/ebpf",
		"containerd-shim-runc-v2", linkcheck.Deps(t, "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"))
}
