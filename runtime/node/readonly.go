package node

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/bulkhead-runtime/bulkhead/mig"
	// Every binary that links runtime can drive real GPUs (mig.backend =
	// "nvml"); the mock is linked only under the tag bulkhead_mockgpu
	// (package mig/mocknode/register).
	_ "github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
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
	b, gpus, err := mig.OpenBackend(cfg.MIG.Backend, backendOptions(cfg, true))
	if err != nil {
		return nil, err
	}
	// The GPUs are read; what the backend opened (NVML) is let go now.
	if c, ok := b.(io.Closer); ok {
		c.Close()
	}
	return gpus, nil
}

// backendOptions are what the mig section of cfg gives the backend it
// names; readOnly opens it for reading only (GPUsReadOnly).
func backendOptions(cfg config.Config, readOnly bool) mig.BackendOptions {
	return mig.BackendOptions{
		MockModel: cfg.MIG.MockModel,
		MockGPUs:  cfg.MIG.MockGPUs,
		MockState: cfg.MIG.MockState,
		ReadOnly:  readOnly,
	}
}
