package specinput

import (
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"
)

// TestImportsNeitherPipelineNorNode keeps specinput plain functions: it
// links neither the pipeline (package runtime) nor what outlives a pod
// (runtime/node, with the ledger and the fence).
func TestImportsNeitherPipelineNorNode(t *testing.T) {
	gotool := filepath.Join(goruntime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gotool); err != nil {
		t.Skipf("no go tool at %s (%v): cannot list specinput's dependencies", gotool, err)
	}
	out, err := exec.Command(gotool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, pkg := range []string{"github.com/bulkhead-runtime/bulkhead/runtime", "github.com/bulkhead-runtime/bulkhead/runtime/node"} {
		if slices.Contains(deps, pkg) {
			t.Errorf("specinput links %s", pkg)
		}
	}
}
