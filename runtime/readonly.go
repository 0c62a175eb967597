package runtime

import (
	"errors"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

// ErrNoLedger is returned by OpenLedgerReadOnly when the node has no ledger
// yet: no Bulkhead shim has run a pod here.
var ErrNoLedger = errors.New("no ledger")

// OpenLedgerReadOnly returns the ledger at path for View only. Unlike
// OpenLedger it creates neither the file nor its directory; readers of a
// node's state (`bulkhead node status`) must leave the node as they found it.
func OpenLedgerReadOnly(path string) (*Ledger, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ledger %s: %w", path, ErrNoLedger)
	}
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("ledger %s: not a regular file", path)
	}
	return &Ledger{path: path, timeout: 30 * time.Second}, nil
}

// GPUsReadOnly returns the node's GPUs as the allocator sees them, per the
// mig section of cfg, without creating state: a mock node whose state file
// does not exist yet has no GPUs to report (nil, nil).
func GPUsReadOnly(cfg config.Config) ([]mig.GPU, error) {
	var nb *nvmlbackend.Backend
	var err error
	switch cfg.MIG.Backend {
	case "", "none":
		return nil, nil
	case "mock":
		if _, err := os.Stat(cfg.MIG.MockState); errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		node, err := mocknode.Open(cfg.MIG.MockState, cfg.MIG.MockModel, cfg.MIG.MockGPUs, mocknode.Options{})
		if err != nil {
			return nil, fmt.Errorf("mig.mock_state: %w", err)
		}
		if nb, err = nvmlbackend.New(node.Interface(), nvmlbackend.Options{}); err != nil {
			return nil, fmt.Errorf("mig: %w", err)
		}
	case "nvml":
		if nb, err = nvmlbackend.New(nvml.New(), nvmlbackend.Options{}); err != nil {
			return nil, fmt.Errorf("mig: nvml: %w", err)
		}
	default:
		return nil, fmt.Errorf("mig.backend %q: not one of none, mock, nvml", cfg.MIG.Backend)
	}
	return nb.AllocatorGPUs(), nil
}
