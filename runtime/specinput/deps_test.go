package specinput

import (
	"testing"

	"github.com/bulkhead-runtime/bulkhead/internal/linkcheck"
)

// TestImportsNeitherPipelineNorNode keeps specinput plain functions: it
// links neither the pipeline (package runtime) nor what outlives a pod
// (runtime/node, with the ledger and the fence).
func TestImportsNeitherPipelineNorNode(t *testing.T) {
	linkcheck.Forbid(t, "runtime/specinput", linkcheck.Deps(t, "."), []string{
		"github.com/bulkhead-runtime/bulkhead/runtime",
		"github.com/bulkhead-runtime/bulkhead/runtime/node/...",
	})
}
