package main

import (
	"testing"

	"github.com/bulkhead-runtime/bulkhead/internal/linkcheck"
)

// TestShimLinksNoPolicyFenceOrGPU keeps the gVisor shim thin: everything
// the pod needs decided is the node agent's, so the shim links neither
// OPA, nor Bulkhead's pipeline, policy, fence or GPU packages, nor NVML,
// nor containerd's runc task service. cilium/ebpf it links only as far as
// gVisor's own shim (containerd-shim-runsc-v1) does, through containerd's
// cgroup code.
func TestShimLinksNoPolicyFenceOrGPU(t *testing.T) {
	ours := linkcheck.Deps(t, ".")
	linkcheck.Forbid(t, "containerd-shim-bulkhead-v1", ours, []string{
		"github.com/open-policy-agent/...",
		"github.com/NVIDIA/go-nvml/...",
		"github.com/bulkhead-runtime/bulkhead/policy/...",
		"github.com/bulkhead-runtime/bulkhead/netpol/...",
		"github.com/bulkhead-runtime/bulkhead/mig/...",
		"github.com/bulkhead-runtime/bulkhead/runtime",               // the pipeline
		"github.com/bulkhead-runtime/bulkhead/runtime/agent/...",     // the agent
		"github.com/bulkhead-runtime/bulkhead/runtime/node/...",      // what outlives a pod
		"github.com/bulkhead-runtime/bulkhead/runtime/specinput/...", // spec to policy input
		"github.com/bulkhead-runtime/bulkhead/runtime/runc/...",
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/...",
	})
	linkcheck.NoMoreThan(t, "containerd-shim-bulkhead-v1", ours, "github.com/cilium/ebpf",
		"containerd-shim-runsc-v1", linkcheck.Deps(t, "gvisor.dev/gvisor/shim"))
}
