// Package register links the simulated GPU node of package mocknode into a
// binary as MIG backend "mock" (mig.backend = "mock"), behind the NVML
// backend exactly as real GPUs are.
//
// Invariant: production binaries never link the mock. Only test code and
// files built with the tag bulkhead_mockgpu import this package
// (cmd/bulkhead-agent/mockgpu.go, cmd/bulkhead/mockgpu.go); a binary
// without it refuses mig.backend = "mock" and names the tag.
package register

import (
	"errors"
	"fmt"
	"os"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/mocknode"
	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

func init() {
	mig.RegisterBackend("mock", open)
}

// open opens the mock node whose state lives in opts.MockState, creating it
// with opts.MockGPUs GPUs of opts.MockModel unless opts.ReadOnly: then a
// node not created yet has no GPUs (nil, nil, nil).
func open(opts mig.BackendOptions) (mig.Backend, []mig.GPU, error) {
	if opts.MockState == "" {
		return nil, nil, errors.New("mig.mock_state: must name the mock node's state file")
	}
	if opts.ReadOnly {
		if _, err := os.Stat(opts.MockState); errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
	}
	node, err := mocknode.Open(opts.MockState, opts.MockModel, opts.MockGPUs, mocknode.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("mig.mock_state: %w", err)
	}
	b, err := nvmlbackend.New(node.Interface(), nvmlbackend.Options{})
	if err != nil {
		return nil, nil, err
	}
	return b, b.AllocatorGPUs(), nil
}
