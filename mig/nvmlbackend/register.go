package nvmlbackend

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// The real hardware is always linked: mig.backend = "nvml".
func init() {
	mig.RegisterBackend("nvml", openNVML)
}

// openNVML opens the node's real GPUs. MIG mode is read, never toggled, and
// reading the GPUs creates no state, so ReadOnly changes nothing here.
func openNVML(mig.BackendOptions) (mig.Backend, []mig.GPU, error) {
	b, err := New(nvml.New(), Options{})
	if err != nil {
		return nil, nil, err
	}
	return b, b.AllocatorGPUs(), nil
}
