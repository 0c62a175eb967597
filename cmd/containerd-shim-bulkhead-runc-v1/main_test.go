package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDoesNotLinkGVisor keeps the runc shim free of gVisor: containerd
// executes a shim twice on every pod start, and gVisor's shim library made
// this binary 72 MB with 393 package inits (now in runtime/gvisor, which only
// containerd-shim-bulkhead-v1 imports).
func TestDoesNotLinkGVisor(t *testing.T) {
	gotool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gotool); err != nil {
		t.Skipf("no go tool at %s (%v): cannot list the shim's dependencies", gotool, err)
	}
	out, err := exec.Command(gotool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var gvisor []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "gvisor.dev/") {
			gvisor = append(gvisor, pkg)
		}
	}
	if len(gvisor) > 0 {
		t.Errorf("containerd-shim-bulkhead-runc-v1 links %d gVisor packages, want none; the first: %s", len(gvisor), strings.Join(gvisor[:min(len(gvisor), 5)], ", "))
	}
}
