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

// TestShimLinksNoPolicyFenceOrGPU keeps the gVisor shim thin: everything
// the pod needs decided is the node agent's, so the shim links neither
// OPA, nor Bulkhead's policy, fence or GPU packages, nor NVML, nor
// containerd's runc task service. cilium/ebpf it links only as far as
// gVisor's own shim (containerd-shim-runsc-v1) does, through containerd's
// cgroup code.
func TestShimLinksNoPolicyFenceOrGPU(t *testing.T) {
	ours := deps(t, ".")
	for _, prefix := range []string{
		"github.com/open-policy-agent/",
		"github.com/NVIDIA/go-nvml/",
		"github.com/bulkhead-runtime/bulkhead/policy",
		"github.com/bulkhead-runtime/bulkhead/netpol",
		"github.com/bulkhead-runtime/bulkhead/mig",
		"github.com/bulkhead-runtime/bulkhead/runtime/runc",
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task",
	} {
		var linked []string
		for _, pkg := range ours {
			if strings.HasPrefix(pkg, prefix) {
				linked = append(linked, pkg)
			}
		}
		if len(linked) > 0 {
			t.Errorf("containerd-shim-bulkhead-v1 links %d packages under %s, want none; the first: %s", len(linked), prefix, strings.Join(linked[:min(len(linked), 5)], ", "))
		}
	}
	for _, pkg := range []string{
		"github.com/bulkhead-runtime/bulkhead/runtime",           // the pipeline
		"github.com/bulkhead-runtime/bulkhead/runtime/node",      // what outlives a pod
		"github.com/bulkhead-runtime/bulkhead/runtime/specinput", // spec to policy input
	} {
		if slices.Contains(ours, pkg) {
			t.Errorf("containerd-shim-bulkhead-v1 links %s, the node agent's; want only runtime/shim", pkg)
		}
	}
	upstream := deps(t, "gvisor.dev/gvisor/shim")
	for _, pkg := range ours {
		if strings.HasPrefix(pkg, "github.com/cilium/ebpf") && !slices.Contains(upstream, pkg) {
			t.Errorf("containerd-shim-bulkhead-v1 links %s, which containerd-shim-runsc-v1 does not", pkg)
		}
	}
}
