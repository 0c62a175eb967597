package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/internal/linkcheck"
	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// TestDoesNotLinkMockGPU keeps the GPU mock out of every binary that links
// runtime/node (and so runtime and the node agent): MIG backends register by name, the real one (nvml) is always
// linked and the mock (go-nvml's mock servers, mig/mocknode) only into builds
// with the tag bulkhead_mockgpu.
func TestDoesNotLinkMockGPU(t *testing.T) {
	deps := linkcheck.Deps(t, ".")
	linkcheck.Forbid(t, "runtime/node", deps, []string{
		"github.com/NVIDIA/go-nvml/pkg/nvml/mock/...",
		"github.com/bulkhead-runtime/bulkhead/mig/mocknode/...",
	})
	if !slices.Contains(deps, "github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend") {
		t.Errorf("runtime/node does not link mig/nvmlbackend: a node could not open mig.backend = \"nvml\"")
	}
}

// The node opens the backend mig.backend names; `bulkhead node status`
// reads the same GPUs without creating the mock node, and a name the binary
// does not link fails with mig.ErrUnknownBackend.
func TestOpenBackendByName(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.MIG = config.MIGConfig{Backend: "mock", MockModel: "a100-80gb", MockGPUs: 2, MockState: filepath.Join(dir, "gpus.json")}

	if gpus, err := GPUsReadOnly(cfg); err != nil || gpus != nil {
		t.Fatalf("GPUs before the node's first open: %v %v, want none", gpus, err)
	}
	if _, err := os.Stat(cfg.MIG.MockState); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("reading the GPUs created the mock node (%v)", err)
	}

	var c Parts
	if err := openLedgerAndMIG(context.Background(), cfg, &c); err != nil {
		t.Fatal(err)
	}
	if c.Backend == nil || len(c.GPUs) != 2 {
		t.Fatalf("opened backend %v with GPUs %v, want the mock's 2", c.Backend, c.GPUs)
	}
	gpus, err := GPUsReadOnly(cfg)
	if err != nil || len(gpus) != 2 || gpus[0].Model != "a100-80gb" {
		t.Fatalf("GPUs after the node opened: %v %v, want 2 x a100-80gb", gpus, err)
	}

	cfg.MIG.Backend = "nvlm"
	if _, err := GPUsReadOnly(cfg); !errors.Is(err, mig.ErrUnknownBackend) || !strings.Contains(err.Error(), "mig.backend") {
		t.Errorf("GPUs of mig.backend %q: %v, want mig.ErrUnknownBackend naming mig.backend", cfg.MIG.Backend, err)
	}
	if err := openLedgerAndMIG(context.Background(), cfg, &Parts{}); !errors.Is(err, mig.ErrUnknownBackend) {
		t.Errorf("opening mig.backend %q: %v, want mig.ErrUnknownBackend", cfg.MIG.Backend, err)
	}

	cfg.MIG.Backend = "none"
	if gpus, err := GPUsReadOnly(cfg); err != nil || gpus != nil {
		t.Errorf("GPUs of mig.backend none: %v %v, want none", gpus, err)
	}
}
