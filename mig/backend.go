package mig

import (
	"errors"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var (
	// ErrMIGDisabled means the GPU is not in MIG mode. The backend never
	// turns MIG mode on unless NVMLOptions.EnableMIG says so.
	ErrMIGDisabled = errors.New("MIG mode disabled")
	// ErrGeometryMismatch means NVML reports a profile or placement that
	// differs from the hardware geometry this package knows.
	ErrGeometryMismatch = errors.New("MIG geometry mismatch")
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

// NVMLOptions configure NewNVMLBackend.
type NVMLOptions struct {
	// EnableMIG turns MIG mode on for GPUs where it is off. Off by default:
	// toggling MIG needs an idle GPU (often a reset) and is an operator's
	// decision, not a side effect of starting a pod.
	EnableMIG bool
}

type nvmlGPU struct {
	info  GPUInfo
	dev   nvml.Device
	model *GPUModel
	// profiles holds NVML's own profile info by model profile index, with
	// the profile ID read from NVML; a zero SliceCount marks a profile
	// this driver does not offer.
	profiles []nvml.GpuInstanceProfileInfo
}

// NVMLBackend is the Backend over an nvml.Interface: real NVML
// (nvml.New()) or a MockNode's Interface.
type NVMLBackend struct {
	lib  nvml.Interface
	gpus []nvmlGPU
}

var _ Backend = (*NVMLBackend)(nil)

func nvmlErr(what string, ret nvml.Return) error {
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
		return fmt.Errorf("%w: %s: nvml: %w", ErrInsufficientResources, what, ret)
	}
	return fmt.Errorf("%s: nvml: %w", what, ret)
}

// NewNVMLBackend initialises NVML, discovers the GPUs and reads and checks
// every MIG profile against the hardware geometry.
func NewNVMLBackend(lib nvml.Interface, opts NVMLOptions) (*NVMLBackend, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, nvmlErr("init", ret)
	}
	b := &NVMLBackend{lib: lib}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		lib.Shutdown()
		return nil, nvmlErr("device count", ret)
	}
	for i := 0; i < n; i++ {
		g, err := openGPU(lib, i, opts)
		if err != nil {
			lib.Shutdown()
			return nil, err
		}
		b.gpus = append(b.gpus, g)
	}
	return b, nil
}

func openGPU(lib nvml.Interface, i int, opts NVMLOptions) (nvmlGPU, error) {
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nvmlGPU{}, nvmlErr(fmt.Sprintf("gpu %d", i), ret)
	}
	g := nvmlGPU{dev: dev, info: GPUInfo{Index: i}}
	var mem nvml.Memory
	for _, step := range []struct {
		what string
		call func() nvml.Return
	}{
		{"name", func() (r nvml.Return) { g.info.Name, r = dev.GetName(); return }},
		{"uuid", func() (r nvml.Return) { g.info.UUID, r = dev.GetUUID(); return }},
		{"minor", func() (r nvml.Return) { g.info.Minor, r = dev.GetMinorNumber(); return }},
		{"memory", func() (r nvml.Return) { mem, r = dev.GetMemoryInfo(); return }},
	} {
		if ret := step.call(); ret != nvml.SUCCESS {
			return g, nvmlErr(fmt.Sprintf("gpu %d %s", i, step.what), ret)
		}
	}
	model, err := ModelForDevice(g.info.Name, mem.Total/(1024*1024))
	if err != nil {
		return g, fmt.Errorf("gpu %d: %w", i, err)
	}
	g.model, g.info.Model = model, model.Name
	current, _, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return g, nvmlErr(fmt.Sprintf("gpu %d mig mode", i), ret)
	}
	if current != nvml.DEVICE_MIG_ENABLE && opts.EnableMIG {
		if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			return g, nvmlErr(fmt.Sprintf("gpu %d enable MIG", i), ret)
		}
		if current, _, ret = dev.GetMigMode(); ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
			return g, fmt.Errorf("gpu %d: MIG mode is pending: the GPU needs a reset", i)
		}
	}
	g.info.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	if !g.info.MIGEnabled {
		return g, nil
	}
	g.profiles = make([]nvml.GpuInstanceProfileInfo, len(model.Profiles))
	for pi := range model.Profiles {
		p := &model.Profiles[pi]
		info, ret := dev.GetGpuInstanceProfileInfo(p.NVMLProfile)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue // this driver does not offer the profile
		}
		if ret != nvml.SUCCESS {
			return g, nvmlErr(fmt.Sprintf("gpu %d profile %s", i, p.Name), ret)
		}
		if err := checkProfile(p, info, dev); err != nil {
			return g, fmt.Errorf("gpu %d (%s): %w", i, model.Name, err)
		}
		g.profiles[pi] = info
	}
	return g, nil
}

// checkProfile compares what NVML reports with the geometry.
func checkProfile(p *Profile, info nvml.GpuInstanceProfileInfo, dev nvml.Device) error {
	if int(info.SliceCount) != p.Compute || int(info.InstanceCount) != p.Instances {
		return fmt.Errorf("%w: %s: nvml reports %d slices x %d instances, hardware has %d x %d",
			ErrGeometryMismatch, p.Name, info.SliceCount, info.InstanceCount, p.Compute, p.Instances)
	}
	if media := info.JpegCount > 0 && info.OfaCount > 0; media != p.Media {
		return fmt.Errorf("%w: %s: nvml media engines %v, want %v", ErrGeometryMismatch, p.Name, media, p.Media)
	}
	placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return nvmlErr(p.Name+" placements", ret)
	}
	for _, pl := range placements {
		if int(pl.Size) != p.Slots || !p.ValidStart(int(pl.Start)) {
			return fmt.Errorf("%w: %s: nvml placement {%d}:%d, hardware allows %v:%d",
				ErrGeometryMismatch, p.Name, pl.Start, pl.Size, p.Starts, p.Slots)
		}
	}
	return nil
}

// Close shuts NVML down.
func (b *NVMLBackend) Close() error {
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return nvmlErr("shutdown", ret)
	}
	return nil
}

// GPUs lists the node's GPUs.
func (b *NVMLBackend) GPUs() ([]GPUInfo, error) {
	out := make([]GPUInfo, len(b.gpus))
	for i, g := range b.gpus {
		out[i] = g.info
	}
	return out, nil
}

// AllocatorGPUs lists the GPUs in the allocator's terms; GPUs with MIG
// mode off are marked NoMIG and only take whole-GPU requests.
func (b *NVMLBackend) AllocatorGPUs() []GPU {
	out := make([]GPU, len(b.gpus))
	for i, g := range b.gpus {
		out[i] = GPU{Index: g.info.Index, Model: g.info.Model, NoMIG: !g.info.MIGEnabled}
	}
	return out
}

func (b *NVMLBackend) gpu(i int) (*nvmlGPU, error) {
	if i < 0 || i >= len(b.gpus) {
		return nil, fmt.Errorf("gpu %d: not on this node (%d GPUs)", i, len(b.gpus))
	}
	return &b.gpus[i], nil
}

// Create makes the GPU instance at the explicit placement, then a compute
// instance spanning it; if the compute instance fails the GPU instance is
// destroyed again.
func (b *NVMLBackend) Create(gpu int, profile string, start int) (Instance, error) {
	g, err := b.gpu(gpu)
	if err != nil {
		return Instance{}, err
	}
	if !g.info.MIGEnabled {
		return Instance{}, fmt.Errorf("gpu %d: %w", gpu, ErrMIGDisabled)
	}
	p, err := g.model.Profile(profile)
	if err != nil {
		return Instance{}, fmt.Errorf("gpu %d: %w", gpu, err)
	}
	info := g.profiles[p.index]
	if info.SliceCount == 0 {
		return Instance{}, fmt.Errorf("gpu %d: profile %s: not offered by this driver", gpu, p.Name)
	}
	what := fmt.Sprintf("gpu %d: create %s at %d", gpu, p.Name, start)
	gi, ret := g.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.Slots)})
	if ret != nvml.SUCCESS {
		return Instance{}, nvmlErr(what, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, nvmlErr(what+": gpu instance info", ret)
	}
	inst := Instance{GPU: gpu, GPUUUID: g.info.UUID, ParentMinor: g.info.Minor, Profile: p.Name,
		Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size), GI: int(giInfo.Id), CI: -1}
	rollback := func(err error) (Instance, error) {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return Instance{}, fmt.Errorf("%w (and destroying GPU instance %d: %w)", err, inst.GI, ret)
		}
		return Instance{}, err
	}
	ciProfile, ret := gi.GetComputeInstanceProfileInfo(p.ComputeProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return rollback(nvmlErr(what+": compute profile", ret))
	}
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return rollback(nvmlErr(what+": compute instance", ret))
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		ci.Destroy()
		return rollback(nvmlErr(what+": compute instance info", ret))
	}
	inst.CI = int(ciInfo.Id)
	uuids, err := b.migUUIDs(g)
	if err != nil {
		ci.Destroy()
		return rollback(err)
	}
	inst.UUID = uuids[[2]int{inst.GI, inst.CI}]
	if inst.UUID == "" {
		ci.Destroy()
		return rollback(fmt.Errorf("%s: no MIG device for GI %d CI %d", what, inst.GI, inst.CI))
	}
	return inst, nil
}

// migUUIDs maps (GI, CI) to MIG device UUIDs on a GPU.
func (b *NVMLBackend) migUUIDs(g *nvmlGPU) (map[[2]int]string, error) {
	max, ret := g.dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("gpu %d max MIG devices", g.info.Index), ret)
	}
	out := map[[2]int]string{}
	for i := 0; i < max; i++ {
		mdev, ret := g.dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("gpu %d MIG device %d", g.info.Index, i), ret)
		}
		gi, r1 := mdev.GetGpuInstanceId()
		ci, r2 := mdev.GetComputeInstanceId()
		id, r3 := mdev.GetUUID()
		if r1 != nvml.SUCCESS || r2 != nvml.SUCCESS || r3 != nvml.SUCCESS {
			return nil, fmt.Errorf("gpu %d MIG device %d: ids %v %v %v", g.info.Index, i, r1, r2, r3)
		}
		out[[2]int{gi, ci}] = id
	}
	return out, nil
}

// Destroy removes a compute instance and then its GPU instance.
func (b *NVMLBackend) Destroy(gpu, giID, ciID int) error {
	g, err := b.gpu(gpu)
	if err != nil {
		return err
	}
	gi, ret := g.dev.GetGpuInstanceById(giID)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil
	}
	if ret != nvml.SUCCESS {
		return nvmlErr(fmt.Sprintf("gpu %d GI %d", gpu, giID), ret)
	}
	if ciID >= 0 {
		ci, ret := gi.GetComputeInstanceById(ciID)
		switch ret {
		case nvml.SUCCESS:
			if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
				return nvmlErr(fmt.Sprintf("gpu %d GI %d destroy CI %d", gpu, giID, ciID), ret)
			}
		case nvml.ERROR_NOT_FOUND:
		default:
			return nvmlErr(fmt.Sprintf("gpu %d GI %d CI %d", gpu, giID, ciID), ret)
		}
	}
	ret = gi.Destroy()
	switch ret {
	case nvml.SUCCESS, nvml.ERROR_NOT_FOUND:
		return nil
	case nvml.ERROR_IN_USE:
		if ciID >= 0 {
			return nil // other compute instances remain in the GPU instance
		}
	}
	return nvmlErr(fmt.Sprintf("gpu %d destroy GI %d", gpu, giID), ret)
}

// Instances lists every GPU instance and its compute instances.
func (b *NVMLBackend) Instances() ([]Instance, error) {
	var out []Instance
	for gidx := range b.gpus {
		g := &b.gpus[gidx]
		if !g.info.MIGEnabled {
			continue
		}
		uuids, err := b.migUUIDs(g)
		if err != nil {
			return nil, err
		}
		for pi := range g.model.Profiles {
			info := g.profiles[pi]
			if info.SliceCount == 0 {
				continue
			}
			gis, ret := g.dev.GetGpuInstances(&info)
			if ret != nvml.SUCCESS {
				return nil, nvmlErr(fmt.Sprintf("gpu %d list %s", g.info.Index, g.model.Profiles[pi].Name), ret)
			}
			for _, gi := range gis {
				insts, err := listGI(g, &g.model.Profiles[pi], gi, uuids)
				if err != nil {
					return nil, err
				}
				out = append(out, insts...)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, c := out[i], out[j]
		if a.GPU != c.GPU {
			return a.GPU < c.GPU
		}
		if a.GI != c.GI {
			return a.GI < c.GI
		}
		return a.CI < c.CI
	})
	return out, nil
}

func listGI(g *nvmlGPU, p *Profile, gi nvml.GpuInstance, uuids map[[2]int]string) ([]Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("gpu %d gpu instance info", g.info.Index), ret)
	}
	base := Instance{GPU: g.info.Index, GPUUUID: g.info.UUID, ParentMinor: g.info.Minor, Profile: p.Name,
		Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size), GI: int(giInfo.Id), CI: -1}
	var out []Instance
	for _, ciEnum := range []int{nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE} {
		ciProfile, ret := gi.GetComputeInstanceProfileInfo(ciEnum, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("gpu %d GI %d compute profile", g.info.Index, base.GI), ret)
		}
		cis, ret := gi.GetComputeInstances(&ciProfile)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("gpu %d GI %d compute instances", g.info.Index, base.GI), ret)
		}
		for _, ci := range cis {
			ciInfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, nvmlErr(fmt.Sprintf("gpu %d GI %d compute instance info", g.info.Index, base.GI), ret)
			}
			inst := base
			inst.CI = int(ciInfo.Id)
			inst.UUID = uuids[[2]int{inst.GI, inst.CI}]
			out = append(out, inst)
		}
	}
	if len(out) == 0 {
		out = append(out, base)
	}
	return out, nil
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
		if p.Profile != WholeGPUProfile {
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
		if p.Profile != WholeGPUProfile && !complete[spot{p.GPU, p.Start, p.Profile}] {
			missing = append(missing, p)
		}
	}
	return orphans, missing
}
