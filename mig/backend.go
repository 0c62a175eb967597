package mig

import "errors"

var (
	// ErrMIGDisabled means the GPU is not in MIG mode. A backend never turns
	// MIG mode on as a side effect of placing a slice.
	ErrMIGDisabled = errors.New("MIG mode disabled")
	// ErrMIGModePending means the GPU's MIG mode was changed and the change
	// waits for a GPU reset (NVML reports a pending mode that differs from
	// the current one). Until the reset the GPU takes no placement: neither
	// a slice (the mode may be on its way out) nor a whole GPU (CUDA sees
	// none on a GPU still in MIG mode).
	ErrMIGModePending = errors.New("MIG mode change pending a GPU reset")
)

// GPUInfo describes one physical GPU.
type GPUInfo struct {
	Index int `json:"index"`
	// Minor is the device minor: /dev/nvidia<Minor>.
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// Model is the short model name (see Model).
	Model string `json:"model"`
	// MIGEnabled is the current MIG mode.
	MIGEnabled bool `json:"mig_enabled"`
	// MIGPending is set when the pending MIG mode differs from the current
	// one: the GPU waits for a reset and takes no placement (ErrMIGModePending).
	MIGPending bool `json:"mig_pending,omitempty"`
}

// Instance is one GPU instance and its compute instance.
type Instance struct {
	GPU int `json:"gpu"`
	// GPUUUID is the parent GPU's UUID.
	GPUUUID string `json:"gpu_uuid"`
	// ParentMinor is the parent's device minor: /dev/nvidia<ParentMinor>.
	ParentMinor int    `json:"parent_minor"`
	Profile     string `json:"profile"`
	Start       int    `json:"start"`
	Size        int    `json:"size"`
	// GI is the GPU-instance ID.
	GI int `json:"gi"`
	// CI is the compute-instance ID, -1 for a GPU instance without one
	// (left by a crash between the two creations; GC destroys it).
	CI int `json:"ci"`
	// UUID is the MIG device UUID ("MIG-..."), empty without a CI.
	UUID string `json:"uuid"`
}

// Backend creates and destroys MIG instances on a node's GPUs.
type Backend interface {
	// GPUs lists the node's GPUs by index.
	GPUs() ([]GPUInfo, error)
	// Create makes a GPU instance of profile at start on gpu and a compute
	// instance spanning it, and returns the MIG device.
	Create(gpu int, profile string, start int) (Instance, error)
	// Destroy removes compute instance ci (if ci >= 0) of GPU instance gi
	// on gpu, then the GPU instance once it has no compute instance left.
	// Destroying what no longer exists succeeds, so GC may repeat it.
	Destroy(gpu, gi, ci int) error
	// Instances lists every instance on the node, ordered by GPU and GI.
	Instances() ([]Instance, error)
}

// PlacementOf converts a backend instance to the allocator's placement, for
// reconciling the node's real instances with the ledger.
func PlacementOf(inst Instance, tenant, owner string) Placement {
	return Placement{GPU: inst.GPU, Profile: inst.Profile, Start: inst.Start, Size: inst.Size, Tenant: tenant, Owner: owner}
}

// Reconcile compares the instances a backend lists with the placements the
// ledger holds, matching them by GPU, profile and start. Orphans are
// instances no placement accounts for (a crash after creation, or a
// placement released while its destroy failed): GC destroys them. Missing
// are placements without a complete instance (a crash before creation):
// GC releases or re-creates them. Whole-GPU placements have no instance and
// are never missing.
func Reconcile(instances []Instance, placements []Placement) (orphans []Instance, missing []Placement) {
	type spot struct {
		gpu, start int
		profile    string
	}
	held := map[spot]bool{}
	for _, p := range placements {
		if !p.Whole() {
			held[spot{p.GPU, p.Start, p.Profile}] = true
		}
	}
	complete := map[spot]bool{}
	for _, inst := range instances {
		s := spot{inst.GPU, inst.Start, inst.Profile}
		if !held[s] || inst.CI < 0 {
			orphans = append(orphans, inst)
			continue
		}
		complete[s] = true
	}
	for _, p := range placements {
		if !p.Whole() && !complete[spot{p.GPU, p.Start, p.Profile}] {
			missing = append(missing, p)
		}
	}
	return orphans, missing
}
