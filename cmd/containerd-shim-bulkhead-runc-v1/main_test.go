package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// deps lists the packages pkg links (go list -deps), or skips without a go tool.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	gotool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gotool); err != nil {
		t.Skipf("no go tool at %s (%v): cannot list the shim's dependencies", gotool, err)
	}
	out, err := exec.Command(gotool, "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

// TestShimLinksNoPolicyFenceOrGPU keeps the runc shim thin: containerd
// executes a shim twice on every pod start, and everything the pod needs
// decided is the node agent's. The shim links neither gVisor (it made this
// binary 72 MB with 393 package inits), nor OPA, nor Bulkhead's policy,
// fence or GPU packages, nor NVML. cilium/ebpf it links only as far as
// containerd's own runc shim does (its cgroup device filter).
func TestShimLinksNoPolicyFenceOrGPU(t *testing.T) {
	ours := deps(t, ".")
	forbidden := []string{
		"gvisor.dev/",
		"github.com/open-policy-agent/",
		"github.com/NVIDIA/go-nvml/",
		"github.com/bulkhead-runtime/bulkhead/policy",
		"github.com/bulkhead-runtime/bulkhead/netpol",
		"github.com/bulkhead-runtime/bulkhead/mig",
		"github.com/bulkhead-runtime/bulkhead/runtime/agent",
	}
	for _, prefix := range forbidden {
		var linked []string
		for _, pkg := range ours {
			if strings.HasPrefix(pkg, prefix) && pkg != "github.com/bulkhead-runtime/bulkhead/runtime/agentapi" {
				linked = append(linked, pkg)
			}
		}
		if len(linked) > 0 {
			t.Errorf("containerd-shim-bulkhead-runc-v1 links %d packages under %s, want none; the first: %s", len(linked), prefix, strings.Join(linked[:min(len(linked), 5)], ", "))
		}
	}
	for _, pkg := range []string{
		"github.com/bulkhead-runtime/bulkhead/runtime",           // the pipeline
		"github.com/bulkhead-runtime/bulkhead/runtime/node",      // what outlives a pod
		"github.com/bulkhead-runtime/bulkhead/runtime/specinput", // spec to policy input
	} {
		if slices.Contains(ours, pkg) {
			t.Errorf("containerd-shim-bulkhead-runc-v1 links %s, the node agent's; want only runtime/shim", pkg)
		}
	}
	upstream := deps(t, "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2")
	for _, pkg := range ours {
		if strings.HasPrefix(pkg, "github.com/cilium/ebpf") && !slices.Contains(upstream, pkg) {
			t.Errorf("containerd-shim-bulkhead-runc-v1 links %s, which containerd-shim-runc-v2 does not", pkg)
		}
	}
}
