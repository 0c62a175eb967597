// Package nvmlbackend is the mig.Backend over NVML: real NVML on a GPU node
// (nvml.New()) or the hardware-true mock of package mocknode. The same code
// runs on both.
//
// Invariant: the backend only ever acts on what the driver reports matches
// the hardware geometry of package mig. Profile IDs are read from NVML, never
// assumed; every profile's slices, instance limit, media engines and
// placements are checked at New, and a driver that disagrees fails with
// ErrGeometryMismatch instead of producing placements the hardware would
// refuse. MIG mode is read, and toggled only when Options.EnableMIG says so.
package nvmlbackend

import (
	"errors"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// ErrGeometryMismatch means NVML reports a profile or placement that
// differs from the hardware geometry package mig knows.
var ErrGeometryMismatch = errors.New("MIG geometry mismatch")

// Options configure New.
type Options struct {
	// EnableMIG turns MIG mode on for GPUs where it is off. Off by default:
	// toggling MIG needs an idle GPU (often a reset) and is an operator's
	// decision, not a side effect of starting a pod.
	EnableMIG bool
}

type nvmlGPU struct {
	info  mig.GPUInfo
	dev   nvml.Device
	model *mig.GPUModel
	// pending says why a GPU whose MIG mode change waits for a reset takes
	// no placement; "" when the current and pending modes agree.
	pending string
	// profiles holds NVML's own profile info by model profile index, with
	// the profile ID read from NVML; a zero SliceCount marks a profile
	// this driver does not offer.
	profiles []nvml.GpuInstanceProfileInfo
}

// Backend is the mig.Backend over an nvml.Interface: real NVML
// (nvml.New()) or a mocknode.Node's Interface.
type Backend struct {
	lib  nvml.Interface
	gpus []nvmlGPU
}

var _ mig.Backend = (*Backend)(nil)

func nvmlErr(what string, ret nvml.Return) error {
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
		return fmt.Errorf("%w: %s: nvml: %w", mig.ErrInsufficientResources, what, ret)
	}
	return fmt.Errorf("%s: nvml: %w", what, ret)
}

// New initialises NVML, discovers the GPUs and reads and checks
// every MIG profile against the hardware geometry.
func New(lib nvml.Interface, opts Options) (*Backend, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, nvmlErr("init", ret)
	}
	b := &Backend{lib: lib}
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

func openGPU(lib nvml.Interface, i int, opts Options) (nvmlGPU, error) {
	dev, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nvmlGPU{}, nvmlErr(fmt.Sprintf("gpu %d", i), ret)
	}
	g := nvmlGPU{dev: dev, info: mig.GPUInfo{Index: i}}
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
	model, err := mig.ModelForDevice(g.info.Name, mem.Total/(1024*1024))
	if err != nil {
		return g, fmt.Errorf("gpu %d: %w", i, err)
	}
	g.model, g.info.Model = model, model.Name
	current, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return g, nvmlErr(fmt.Sprintf("gpu %d mig mode", i), ret)
	}
	if current != nvml.DEVICE_MIG_ENABLE && pending != nvml.DEVICE_MIG_ENABLE && opts.EnableMIG {
		// The activation status says whether the driver could apply the
		// mode now; the modes read back below say what it did.
		if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			return g, nvmlErr(fmt.Sprintf("gpu %d enable MIG", i), ret)
		}
		if current, pending, ret = dev.GetMigMode(); ret != nvml.SUCCESS {
			return g, nvmlErr(fmt.Sprintf("gpu %d mig mode", i), ret)
		}
	}
	if current != pending {
		// Strict: real hardware applies a mode change only after a GPU
		// reset (or a VM reboot); until then neither mode can be trusted.
		g.info.MIGPending = true
		g.pending = fmt.Sprintf("MIG mode is %s, pending %s; reset the GPU (nvidia-smi -i %d -r) or set the mode back",
			migModeName(current), migModeName(pending), i)
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

func migModeName(mode int) string {
	switch mode {
	case nvml.DEVICE_MIG_ENABLE:
		return "enabled"
	case nvml.DEVICE_MIG_DISABLE:
		return "disabled"
	}
	return fmt.Sprintf("unknown (%d)", mode)
}

// checkProfile compares what NVML reports with the geometry.
func checkProfile(p *mig.Profile, info nvml.GpuInstanceProfileInfo, dev nvml.Device) error {
	if int(info.SliceCount) != p.Compute || int(info.InstanceCount) != p.Instances {
		return fmt.Errorf("%w: %s: nvml reports %d slices x %d instances, hardware has %d x %d",
			ErrGeometryMismatch, p.Name, info.SliceCount, info.InstanceCount, p.Compute, p.Instances)
	}
	if media := info.JpegCount > 0 && info.OfaCount > 0; media != p.MediaEngines {
		return fmt.Errorf("%w: %s: nvml media engines %v, want %v", ErrGeometryMismatch, p.Name, media, p.MediaEngines)
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
func (b *Backend) Close() error {
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return nvmlErr("shutdown", ret)
	}
	return nil
}

// GPUs lists the node's GPUs.
func (b *Backend) GPUs() ([]mig.GPUInfo, error) {
	out := make([]mig.GPUInfo, len(b.gpus))
	for i, g := range b.gpus {
		out[i] = g.info
	}
	return out, nil
}

// AllocatorGPUs lists the GPUs in the allocator's terms; GPUs with MIG
// mode off are marked NoMIG and only take whole-GPU requests, and a GPU
// whose MIG mode change waits for a reset is Unavailable.
func (b *Backend) AllocatorGPUs() []mig.GPU {
	out := make([]mig.GPU, len(b.gpus))
	for i, g := range b.gpus {
		out[i] = mig.GPU{Index: g.info.Index, Model: g.info.Model, NoMIG: !g.info.MIGEnabled}
		if g.pending != "" {
			out[i].Unavailable = mig.ErrMIGModePending.Error() + ": " + g.pending
		}
	}
	return out
}

// profileInfo is NVML's info for p; a zero SliceCount means the driver
// does not offer it.
func (g *nvmlGPU) profileInfo(p *mig.Profile) nvml.GpuInstanceProfileInfo {
	for i := range g.model.Profiles {
		if g.model.Profiles[i].Name == p.Name && i < len(g.profiles) {
			return g.profiles[i]
		}
	}
	return nvml.GpuInstanceProfileInfo{}
}

func (b *Backend) gpu(i int) (*nvmlGPU, error) {
	if i < 0 || i >= len(b.gpus) {
		return nil, fmt.Errorf("gpu %d: not on this node (%d GPUs)", i, len(b.gpus))
	}
	return &b.gpus[i], nil
}

// Create makes the GPU instance at the explicit placement, then a compute
// instance spanning it; if the compute instance fails the GPU instance is
// destroyed again.
func (b *Backend) Create(gpu int, profile string, start int) (mig.Instance, error) {
	g, err := b.gpu(gpu)
	if err != nil {
		return mig.Instance{}, err
	}
	if g.pending != "" {
		return mig.Instance{}, fmt.Errorf("gpu %d: %w: %s", gpu, mig.ErrMIGModePending, g.pending)
	}
	if !g.info.MIGEnabled {
		return mig.Instance{}, fmt.Errorf("gpu %d: %w", gpu, mig.ErrMIGDisabled)
	}
	p, err := g.model.Profile(profile)
	if err != nil {
		return mig.Instance{}, fmt.Errorf("gpu %d: %w", gpu, err)
	}
	info := g.profileInfo(p)
	if info.SliceCount == 0 {
		return mig.Instance{}, fmt.Errorf("gpu %d: profile %s: not offered by this driver", gpu, p.Name)
	}
	what := fmt.Sprintf("gpu %d: create %s at %d", gpu, p.Name, start)
	gi, ret := g.dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(start), Size: uint32(p.Slots)})
	if ret != nvml.SUCCESS {
		return mig.Instance{}, nvmlErr(what, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return mig.Instance{}, nvmlErr(what+": gpu instance info", ret)
	}
	inst := mig.Instance{GPU: gpu, GPUUUID: g.info.UUID, ParentMinor: g.info.Minor, Profile: p.Name,
		Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size), GI: int(giInfo.Id), CI: -1}
	rollback := func(err error) (mig.Instance, error) {
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return mig.Instance{}, fmt.Errorf("%w (and destroying GPU instance %d: %w)", err, inst.GI, ret)
		}
		return mig.Instance{}, err
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
func (b *Backend) migUUIDs(g *nvmlGPU) (map[[2]int]string, error) {
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
func (b *Backend) Destroy(gpu, giID, ciID int) error {
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
func (b *Backend) Instances() ([]mig.Instance, error) {
	var out []mig.Instance
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

func listGI(g *nvmlGPU, p *mig.Profile, gi nvml.GpuInstance, uuids map[[2]int]string) ([]mig.Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("gpu %d gpu instance info", g.info.Index), ret)
	}
	base := mig.Instance{GPU: g.info.Index, GPUUUID: g.info.UUID, ParentMinor: g.info.Minor, Profile: p.Name,
		Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size), GI: int(giInfo.Id), CI: -1}
	var out []mig.Instance
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
