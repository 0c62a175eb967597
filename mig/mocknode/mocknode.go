// Package mocknode simulates a node of MIG GPUs for tests and demos: go-nvml's
// DGX mock servers rewired to behave like hardware, so that the NVML backend
// (package nvmlbackend) runs the same code on it as on real GPUs.
//
// Invariant: the mock refuses what hardware refuses and reports what hardware
// reports. Placements are the hardware's, in 8 memory slots; profile IDs are
// the hardware's (not go-nvml's enum); overlapping, invalid or over-limit
// creations fail with ERROR_INSUFFICIENT_RESOURCES; a wrong placement size
// with ERROR_INVALID_ARGUMENT; destroying a GPU instance that still has
// compute instances, or changing MIG mode with instances, with ERROR_IN_USE;
// GetMigMode reports a changed mode as pending until the GPU is reset when
// the node is built with ResetRequired.
// It is test machinery: production code reaches it only through the shim's
// mig.backend = "mock" setting.
package mocknode

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
	"os"
	"sort"
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	nvmlmock "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// hardwareProfileIDs are the GPU-instance profile IDs real NVML reports, by
// the nvml.GPU_INSTANCE_PROFILE_* enum a profile is asked for with. go-nvml's
// mocks report the enum instead. Only the mock uses this table: the backend
// reads IDs from NVML.
var hardwareProfileIDs = map[int]uint32{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE:      19,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 20, // 1g+me
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 15, // 1g, double memory
	nvml.GPU_INSTANCE_PROFILE_2_SLICE:      14,
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      9,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE:      5,
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      0,
}

// Node is a simulated node of MIG GPUs built on go-nvml's DGX mock
// servers, rewired to behave like hardware: real placements in 8 memory
// slots, hardware profile IDs, ERROR_INSUFFICIENT_RESOURCES for overlapping or
// invalid placements, MIG device handles with UUIDs.
//
// With a state file (Open) the created instances live in that file
// under an exclusive flock, so several processes (one shim per pod, a GC
// pass) share one simulated node. Every NVML call re-reads the file.
type Node struct {
	model         *mig.GPUModel
	path          string // state file, "" keeps the state in memory
	server        *server.Server
	resetRequired bool // Options.ResetRequired

	mu  sync.Mutex // serialises this process's access to mem and the state file
	mem *mockState // the state when path == ""
}

type mockState struct {
	Model string    `json:"model"`
	GPUs  []mockGPU `json:"gpus"`
}

type mockGPU struct {
	UUID    string `json:"uuid"`
	MIGMode int    `json:"mig_mode"`
	// PendingMode is a MIG mode set but not yet applied (ResetRequired):
	// nil when none is pending.
	PendingMode *int     `json:"pending_mig_mode,omitempty"`
	GIs         []mockGI `json:"gpu_instances"`
}

type mockGI struct {
	ID        int      `json:"id"`
	ProfileID uint32   `json:"profile_id"`
	Start     int      `json:"start"`
	Size      int      `json:"size"`
	CIs       []mockCI `json:"compute_instances"`
}

type mockCI struct {
	ID        int    `json:"id"`
	ProfileID uint32 `json:"profile_id"`
	Start     int    `json:"start"`
	Size      int    `json:"size"`
	UUID      string `json:"uuid"`
}

// Options configure a new mock node.
type Options struct {
	// MIGDisabled starts the GPUs with MIG mode off (default on), to test
	// that the backend never toggles it on its own.
	MIGDisabled bool
	// ResetRequired makes a MIG mode change wait for Reset, as on a GPU
	// in use or under pass-through virtualization: SetMigMode succeeds with
	// activation status ERROR_RESET_REQUIRED and GetMigMode reports the new
	// mode as pending until then. Without it a change applies at once, as
	// on an idle bare-metal GPU the driver resets itself.
	ResetRequired bool
}

// New returns an in-memory mock node of n GPUs of a model.
func New(model string, n int, opts Options) (*Node, error) {
	node, st, err := newMockNode(model, n, opts)
	if err != nil {
		return nil, err
	}
	node.mem = st
	node.bind(st)
	return node, nil
}

// Open opens (or creates) a mock node whose state is kept in the
// JSON file at path, shared by every process that opens the same path. An
// existing file must describe the same model and GPU count.
func Open(path, model string, n int, opts Options) (*Node, error) {
	if path == "" {
		return nil, errors.New("mock node: path must not be empty")
	}
	node, fresh, err := newMockNode(model, n, opts)
	if err != nil {
		return nil, err
	}
	node.path = path
	var st *mockState
	err = node.withLock(syscall.LOCK_EX, func() error {
		data, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			st = fresh
			return node.write(st)
		case err != nil:
			return err
		}
		st = &mockState{}
		if err := json.Unmarshal(data, st); err != nil {
			return fmt.Errorf("mock node %s: %w", path, err)
		}
		if st.Model != node.model.Name || len(st.GPUs) != n {
			return fmt.Errorf("mock node %s: holds %d x %s, asked for %d x %s", path, len(st.GPUs), st.Model, n, node.model.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	node.bind(st)
	return node, nil
}

func newMockNode(model string, n int, opts Options) (*Node, *mockState, error) {
	m, err := mig.Model(model)
	if err != nil {
		return nil, nil, err
	}
	if n < 1 || n > 64 {
		return nil, nil, fmt.Errorf("mock node: gpus %d: must be 1..64", n)
	}
	var srv *server.Server
	switch m.Name {
	case "a100-40gb":
		srv = dgxa100.NewWithGPUs(gpus.Multiple(n, gpus.A100_SXM4_40GB)...)
	case "a100-80gb":
		srv = dgxa100.NewWithGPUs(gpus.Multiple(n, gpus.A100_SXM4_80GB)...)
	case "h100":
		srv = dgxh100.NewWithGPUs(gpus.Multiple(n, gpus.H100_SXM5_80GB)...)
	case "h200":
		srv = dgxh200.NewWithGPUs(gpus.Multiple(n, gpus.H200_SXM5_141GB)...)
	case "b200":
		srv = dgxb200.NewWithGPUs(gpus.Multiple(n, gpus.B200_SXM5_180GB)...)
	}
	st := &mockState{Model: m.Name}
	mode := nvml.DEVICE_MIG_ENABLE
	if opts.MIGDisabled {
		mode = nvml.DEVICE_MIG_DISABLE
	}
	for range n {
		st.GPUs = append(st.GPUs, mockGPU{UUID: "GPU-" + uuid.NewString(), MIGMode: mode})
	}
	return &Node{model: m, server: srv, resetRequired: opts.ResetRequired}, st, nil
}

// Interface is the node's NVML: pass it to nvmlbackend.New.
func (n *Node) Interface() nvml.Interface { return n.server }

// Reset resets GPU gpu as `nvidia-smi -r` (or a VM reboot) would: a
// pending MIG mode takes effect. Like the driver it refuses a GPU that
// still has MIG instances.
func (n *Node) Reset(gpu int) error {
	ret := n.do(true, func(st *mockState) nvml.Return {
		if gpu < 0 || gpu >= len(st.GPUs) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		g := &st.GPUs[gpu]
		if len(g.GIs) > 0 {
			return nvml.ERROR_IN_USE
		}
		if g.PendingMode != nil {
			g.MIGMode, g.PendingMode = *g.PendingMode, nil
		}
		return nvml.SUCCESS
	})
	if ret != nvml.SUCCESS {
		return fmt.Errorf("mock node: reset gpu %d: %w", gpu, ret)
	}
	return nil
}

// Model is the node's GPU model.
func (n *Node) Model() *mig.GPUModel { return n.model }

func (n *Node) withLock(how int, fn func() error) error {
	f, err := os.OpenFile(n.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("mock node lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		return fmt.Errorf("mock node lock %s: %w", f.Name(), err)
	}
	defer syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return fn()
}

// write replaces the state file atomically; the caller holds the lock.
func (n *Node) write(st *mockState) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(n.path, data, 0o600)
}

// do runs fn on the current state; a write also persists it. Errors reading
// or writing the state file surface as ERROR_UNKNOWN, like a driver fault.
func (n *Node) do(write bool, fn func(st *mockState) nvml.Return) nvml.Return {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.path == "" {
		return fn(n.mem)
	}
	how := syscall.LOCK_SH
	if write {
		how = syscall.LOCK_EX
	}
	ret := nvml.ERROR_UNKNOWN
	err := n.withLock(how, func() error {
		data, err := os.ReadFile(n.path)
		if err != nil {
			return err
		}
		st := &mockState{}
		if err := json.Unmarshal(data, st); err != nil {
			return err
		}
		ret = fn(st)
		if write && ret == nvml.SUCCESS {
			return n.write(st)
		}
		return nil
	})
	if err != nil {
		return nvml.ERROR_UNKNOWN
	}
	return ret
}

// shapeByID maps a hardware GPU-instance profile ID to its profile.
func (n *Node) shapeByID(id uint32) *mig.Profile {
	for i := range n.model.Profiles {
		if p := &n.model.Profiles[i]; hardwareProfileIDs[p.NVMLProfile] == id {
			return p
		}
	}
	return nil
}

func (n *Node) profileInfo(p *mig.Profile) nvml.GpuInstanceProfileInfo {
	media := uint32(0)
	if p.MediaEngines {
		media = 1
	}
	return nvml.GpuInstanceProfileInfo{
		Id:                  hardwareProfileIDs[p.NVMLProfile],
		IsP2pSupported:      1,
		SliceCount:          uint32(p.Compute),
		InstanceCount:       uint32(p.Instances),
		MultiprocessorCount: uint32(16 * p.Compute),
		CopyEngineCount:     uint32(p.Compute),
		DecoderCount:        uint32(p.Compute),
		JpegCount:           media,
		OfaCount:            media,
		MemorySizeMB:        uint64(n.model.MemoryGB) * 1024 * uint64(p.Slots) / mig.MemorySlots,
	}
}

// occupancy rebuilds the exact GPU state from the instances on it.
func (n *Node) occupancy(g *mockGPU) mig.Occupancy {
	var s mig.Occupancy
	for _, gi := range g.GIs {
		if p := n.shapeByID(gi.ProfileID); p != nil {
			s.Add(p, gi.Start)
		}
	}
	return s
}

// bind rewires every device of the wrapped go-nvml server.
func (n *Node) bind(st *mockState) {
	for i, d := range n.server.Devices {
		dev := d.(*server.Device)
		dev.UUID = st.GPUs[i].UUID
		n.bindDevice(i, dev)
	}
	n.server.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		var found nvml.Device
		ret := n.do(false, func(st *mockState) nvml.Return {
			for i, g := range st.GPUs {
				if g.UUID == id {
					found = n.server.Devices[i]
					return nvml.SUCCESS
				}
				for _, gi := range g.GIs {
					for _, ci := range gi.CIs {
						if ci.UUID == id {
							found = n.migDevice(i, gi, ci)
							return nvml.SUCCESS
						}
					}
				}
			}
			return nvml.ERROR_NOT_FOUND
		})
		return found, ret
	}
}

func (n *Node) bindDevice(idx int, d *server.Device) {
	d.GetMigModeFunc = func() (int, int, nvml.Return) {
		current, pending := 0, 0
		ret := n.do(false, func(st *mockState) nvml.Return {
			g := &st.GPUs[idx]
			current, pending = g.MIGMode, g.MIGMode
			if g.PendingMode != nil {
				pending = *g.PendingMode
			}
			return nvml.SUCCESS
		})
		return current, pending, ret
	}
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
			return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
		}
		activation := nvml.Return(nvml.SUCCESS)
		ret := n.do(true, func(st *mockState) nvml.Return {
			g := &st.GPUs[idx]
			if len(g.GIs) > 0 {
				return nvml.ERROR_IN_USE
			}
			switch {
			case !n.resetRequired:
				g.MIGMode, g.PendingMode = mode, nil
			case mode == g.MIGMode:
				g.PendingMode = nil // set back: nothing waits any more
			default:
				g.PendingMode = &mode
				activation = nvml.ERROR_RESET_REQUIRED
			}
			return nvml.SUCCESS
		})
		if ret != nvml.SUCCESS {
			return ret, ret
		}
		return ret, activation
	}
	d.GetGpuInstanceProfileInfoFunc = func(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if profile < 0 || profile >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		for i := range n.model.Profiles {
			if p := &n.model.Profiles[i]; p.NVMLProfile == profile {
				return n.profileInfo(p), nvml.SUCCESS
			}
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		p := n.shapeByID(info.Id)
		if p == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.GpuInstancePlacement
		for _, s := range p.Starts {
			out = append(out, nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.Slots)})
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
		p := n.shapeByID(info.Id)
		if p == nil {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		room := 0
		ret := n.do(false, func(st *mockState) nvml.Return {
			s := n.occupancy(&st.GPUs[idx])
			room = s.Room(p)
			return nvml.SUCCESS
		})
		return room, ret
	}
	create := func(info *nvml.GpuInstanceProfileInfo, placement *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		p := n.shapeByID(info.Id)
		if p == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if placement != nil && int(placement.Size) != p.Slots {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var gi mockGI
		ret := n.do(true, func(st *mockState) nvml.Return {
			g := &st.GPUs[idx]
			if g.MIGMode != nvml.DEVICE_MIG_ENABLE {
				return nvml.ERROR_NOT_SUPPORTED
			}
			s := n.occupancy(g)
			start := -1
			if placement != nil {
				start = int(placement.Start)
				if !s.Fits(p, start) {
					return nvml.ERROR_INSUFFICIENT_RESOURCES
				}
			} else {
				for _, c := range p.Starts {
					if s.Fits(p, c) {
						start = c
						break
					}
				}
				if start < 0 {
					return nvml.ERROR_INSUFFICIENT_RESOURCES
				}
			}
			gi = mockGI{ID: freeGIID(g, p), ProfileID: info.Id, Start: start, Size: p.Slots}
			g.GIs = append(g.GIs, gi)
			sort.Slice(g.GIs, func(i, j int) bool { return g.GIs[i].ID < g.GIs[j].ID })
			return nvml.SUCCESS
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.gpuInstance(idx, gi.ID), nvml.SUCCESS
	}
	d.CreateGpuInstanceWithPlacementFunc = create
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return create(info, nil)
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		var out []nvml.GpuInstance
		ret := n.do(false, func(st *mockState) nvml.Return {
			for _, gi := range st.GPUs[idx].GIs {
				if gi.ProfileID == info.Id {
					out = append(out, n.gpuInstance(idx, gi.ID))
				}
			}
			return nvml.SUCCESS
		})
		return out, ret
	}
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		ret := n.do(false, func(st *mockState) nvml.Return {
			if findGI(&st.GPUs[idx], id) == nil {
				return nvml.ERROR_NOT_FOUND
			}
			return nvml.SUCCESS
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.gpuInstance(idx, id), nvml.SUCCESS
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return mig.ComputeSlices, nvml.SUCCESS }
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		var found nvml.Device
		ret := n.do(false, func(st *mockState) nvml.Return {
			k := 0
			for _, gi := range st.GPUs[idx].GIs {
				for _, ci := range gi.CIs {
					if k == i {
						found = n.migDevice(idx, gi, ci)
						return nvml.SUCCESS
					}
					k++
				}
			}
			return nvml.ERROR_NOT_FOUND
		})
		return found, ret
	}
}

// freeGIID picks the lowest free GPU-instance ID; the full-GPU instance is 0.
func freeGIID(g *mockGPU, p *mig.Profile) int {
	if p.Slots == mig.MemorySlots {
		return 0
	}
	for id := 1; ; id++ {
		if findGI(g, id) == nil {
			return id
		}
	}
}

func findGI(g *mockGPU, id int) *mockGI {
	for i := range g.GIs {
		if g.GIs[i].ID == id {
			return &g.GIs[i]
		}
	}
	return nil
}

func findCI(gi *mockGI, id int) *mockCI {
	for i := range gi.CIs {
		if gi.CIs[i].ID == id {
			return &gi.CIs[i]
		}
	}
	return nil
}

// ciSizes are the compute-instance sizes by nvml.COMPUTE_INSTANCE_PROFILE_* enum.
var ciSizes = map[int]int{
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
	nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
	nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
	nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}

// gpuInstance is a handle to GPU instance id on GPU idx. Every call reads
// the node's current state, so a handle outlives process boundaries.
func (n *Node) gpuInstance(idx, id int) nvml.GpuInstance {
	h := &nvmlmock.GpuInstance{}
	dev := n.server.Devices[idx]
	withGI := func(write bool, fn func(gi *mockGI) nvml.Return) nvml.Return {
		return n.do(write, func(st *mockState) nvml.Return {
			gi := findGI(&st.GPUs[idx], id)
			if gi == nil {
				return nvml.ERROR_NOT_FOUND
			}
			return fn(gi)
		})
	}
	giCompute := func(gi *mockGI) int {
		if p := n.shapeByID(gi.ProfileID); p != nil {
			return p.Compute
		}
		return 0
	}
	h.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		var info nvml.GpuInstanceInfo
		ret := withGI(false, func(gi *mockGI) nvml.Return {
			info = nvml.GpuInstanceInfo{Device: dev, Id: uint32(gi.ID), ProfileId: gi.ProfileID,
				Placement: nvml.GpuInstancePlacement{Start: uint32(gi.Start), Size: uint32(gi.Size)}}
			return nvml.SUCCESS
		})
		return info, ret
	}
	h.GetComputeInstanceProfileInfoFunc = func(profile, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		size, ok := ciSizes[profile]
		if !ok {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		var info nvml.ComputeInstanceProfileInfo
		ret := withGI(false, func(gi *mockGI) nvml.Return {
			c := giCompute(gi)
			if size > c {
				return nvml.ERROR_NOT_SUPPORTED
			}
			info = nvml.ComputeInstanceProfileInfo{Id: uint32(profile), SliceCount: uint32(size),
				InstanceCount: uint32(c / size), MultiprocessorCount: uint32(16 * size)}
			return nvml.SUCCESS
		})
		return info, ret
	}
	ciPlacements := func(c, size int) []int {
		var out []int
		for s := 0; s+size <= c; s += size {
			out = append(out, s)
		}
		return out
	}
	h.GetComputeInstancePossiblePlacementsFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
		var out []nvml.ComputeInstancePlacement
		ret := withGI(false, func(gi *mockGI) nvml.Return {
			for _, s := range ciPlacements(giCompute(gi), int(info.SliceCount)) {
				out = append(out, nvml.ComputeInstancePlacement{Start: uint32(s), Size: info.SliceCount})
			}
			return nvml.SUCCESS
		})
		return out, ret
	}
	createCI := func(info *nvml.ComputeInstanceProfileInfo, placement *nvml.ComputeInstancePlacement) (nvml.ComputeInstance, nvml.Return) {
		size, ok := ciSizes[int(info.Id)]
		if !ok || (placement != nil && int(placement.Size) != size) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var ci mockCI
		ret := withGI(true, func(gi *mockGI) nvml.Return {
			var used uint8
			for _, c := range gi.CIs {
				used |= uint8(((1 << c.Size) - 1) << c.Start)
			}
			start := -1
			for _, s := range ciPlacements(giCompute(gi), size) {
				free := used&uint8(((1<<size)-1)<<s) == 0
				if placement != nil && int(placement.Start) == s {
					if !free {
						return nvml.ERROR_INSUFFICIENT_RESOURCES
					}
					start = s
					break
				}
				if placement == nil && free {
					start = s
					break
				}
			}
			if start < 0 {
				return nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			id := 0
			for findCI(gi, id) != nil {
				id++
			}
			ci = mockCI{ID: id, ProfileID: info.Id, Start: start, Size: size, UUID: "MIG-" + uuid.NewString()}
			gi.CIs = append(gi.CIs, ci)
			sort.Slice(gi.CIs, func(i, j int) bool { return gi.CIs[i].ID < gi.CIs[j].ID })
			return nvml.SUCCESS
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.computeInstance(idx, id, ci.ID, h), nvml.SUCCESS
	}
	h.CreateComputeInstanceWithPlacementFunc = createCI
	h.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		return createCI(info, nil)
	}
	h.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		var out []nvml.ComputeInstance
		ret := withGI(false, func(gi *mockGI) nvml.Return {
			for _, c := range gi.CIs {
				if c.ProfileID == info.Id {
					out = append(out, n.computeInstance(idx, id, c.ID, h))
				}
			}
			return nvml.SUCCESS
		})
		return out, ret
	}
	h.GetComputeInstanceByIdFunc = func(ciID int) (nvml.ComputeInstance, nvml.Return) {
		ret := withGI(false, func(gi *mockGI) nvml.Return {
			if findCI(gi, ciID) == nil {
				return nvml.ERROR_NOT_FOUND
			}
			return nvml.SUCCESS
		})
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return n.computeInstance(idx, id, ciID, h), nvml.SUCCESS
	}
	h.DestroyFunc = func() nvml.Return {
		return n.do(true, func(st *mockState) nvml.Return {
			g := &st.GPUs[idx]
			for i, gi := range g.GIs {
				if gi.ID != id {
					continue
				}
				if len(gi.CIs) > 0 {
					return nvml.ERROR_IN_USE
				}
				g.GIs = append(g.GIs[:i], g.GIs[i+1:]...)
				return nvml.SUCCESS
			}
			return nvml.ERROR_NOT_FOUND
		})
	}
	return h
}

func (n *Node) computeInstance(idx, giID, ciID int, gi nvml.GpuInstance) nvml.ComputeInstance {
	h := &nvmlmock.ComputeInstance{}
	h.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		var info nvml.ComputeInstanceInfo
		ret := n.do(false, func(st *mockState) nvml.Return {
			g := findGI(&st.GPUs[idx], giID)
			if g == nil {
				return nvml.ERROR_NOT_FOUND
			}
			c := findCI(g, ciID)
			if c == nil {
				return nvml.ERROR_NOT_FOUND
			}
			info = nvml.ComputeInstanceInfo{Device: n.server.Devices[idx], GpuInstance: gi, Id: uint32(c.ID), ProfileId: c.ProfileID,
				Placement: nvml.ComputeInstancePlacement{Start: uint32(c.Start), Size: uint32(c.Size)}}
			return nvml.SUCCESS
		})
		return info, ret
	}
	h.DestroyFunc = func() nvml.Return {
		return n.do(true, func(st *mockState) nvml.Return {
			g := findGI(&st.GPUs[idx], giID)
			if g == nil {
				return nvml.ERROR_NOT_FOUND
			}
			for i, c := range g.CIs {
				if c.ID == ciID {
					g.CIs = append(g.CIs[:i], g.CIs[i+1:]...)
					return nvml.SUCCESS
				}
			}
			return nvml.ERROR_NOT_FOUND
		})
	}
	return h
}

// migDevice is the MIG device handle of a compute instance.
func (n *Node) migDevice(idx int, gi mockGI, ci mockCI) nvml.Device {
	parent := n.server.Devices[idx]
	p := n.shapeByID(gi.ProfileID)
	name := "MIG"
	if p != nil {
		name = "MIG " + p.Name
	}
	h := &nvmlmock.Device{}
	h.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	h.GetUUIDFunc = func() (string, nvml.Return) { return ci.UUID, nvml.SUCCESS }
	h.GetNameFunc = func() (string, nvml.Return) { return name, nvml.SUCCESS }
	h.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	h.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return gi.ID, nvml.SUCCESS }
	h.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return ci.ID, nvml.SUCCESS }
	h.GetMinorNumberFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	return h
}
