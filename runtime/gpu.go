package runtime

import (
	"context"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// AnnotationGPUPlacement is the OCI annotation the shim sets on every
// container of a pod that holds a GPU: the placement it holds, e.g.
// "gpu1 3g.71gb start 4 size 4 (tenant training, owner <sandbox>)".
const AnnotationGPUPlacement = "bulkhead.dev/gpu-placement"

// setupGPU creates the MIG instance of a slice, writes the pod's CDI spec
// and injects the devices. The instance is recorded in the ledger before
// anything refers to it, so that a failure later is undone by releasing
// the reservation (which also removes the CDI spec).
func (p *Pipeline) setupGPU(ctx context.Context, res *node.Reservation, spec *specs.Spec) error {
	if res.GPU == nil {
		return nil
	}
	if err := p.fail(StepGPU); err != nil {
		return err
	}
	if !res.GPU.Whole() {
		in, err := p.node.Backend().Create(res.GPU.GPU, res.GPU.Profile, res.GPU.Start)
		if err != nil {
			return fmt.Errorf("gpu %d: create %s at %d: %w", res.GPU.GPU, res.GPU.Profile, res.GPU.Start, err)
		}
		res.Instance = &in
		if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
			return err
		}
	}
	if err := p.writeCDISpec(res); err != nil {
		return err
	}
	return p.InjectGPU(res, spec)
}

// gpuEdits are what a container of the pod needs for its GPU: the device
// id (the MIG instance's UUID, or the whole GPU's), the driver's control
// nodes and the device's own nodes and NVIDIA_VISIBLE_DEVICES. Device
// nodes exist only where the NVIDIA driver is loaded; the mock backend has
// none, and the container gets the id alone.
func (p *Pipeline) gpuEdits(res *node.Reservation) (id string, common, device inject.Edits, err error) {
	var info mig.GPUInfo
	infos, err := p.node.Backend().GPUs()
	if err != nil {
		return "", common, device, err
	}
	for _, g := range infos {
		if g.Index == res.GPU.GPU {
			info = g
		}
	}
	id = info.UUID
	if res.Instance != nil {
		id = res.Instance.UUID
	}
	device = inject.Edits{Env: []string{inject.VisibleDevicesEnv + "=" + id}}
	majors, err := inject.ParseProcDevices(p.procDevices())
	if err != nil || majors.Nvidia == 0 {
		return id, common, device, nil
	}
	common = inject.ControlEdits(majors)
	if res.Instance == nil {
		return id, common, inject.WholeGPUEdits(majors, info), nil
	}
	minors, err := inject.ParseMIGMinors(inject.DefaultMIGMinorsPath)
	if err != nil {
		return "", common, device, fmt.Errorf("gpu %d: %w", res.GPU.GPU, err)
	}
	if device, err = inject.MIGEdits(majors, minors, *res.Instance); err != nil {
		return "", common, device, err
	}
	return id, common, device, nil
}

// InjectGPU gives the container of spec the pod's GPU: the MIG instance's
// (or whole GPU's) UUID in NVIDIA_VISIBLE_DEVICES, its CDI name in CDI's
// annotation and, where the driver is loaded, its device nodes and cgroup
// rules. Every container of the pod gets it, the sandbox's at sandbox
// create and each other at its own.
func (p *Pipeline) InjectGPU(res *node.Reservation, spec *specs.Spec) error {
	if res == nil || res.GPU == nil {
		return nil
	}
	id, common, device, err := p.gpuEdits(res)
	if err != nil {
		return err
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	spec.Annotations[AnnotationGPUPlacement] = res.GPU.String()
	opts := []inject.SpecOpt{inject.WithVisibleDevices(id), inject.WithEdits(common.Merge(device))}
	if p.node.Config().MIG.CDISpecDir != "" {
		opts = append(opts, inject.WithCDIDevices(inject.CDIName(inject.CDIKind, id)))
	}
	return inject.ApplySpecOpts(spec, opts...)
}

// procDevices is where the driver's character-device majors are listed.
func (p *Pipeline) procDevices() string {
	if p.node.Config().MIG.Backend == "mock" {
		return "" // the mock has no driver; never pick up a real one
	}
	return "/proc/devices"
}

// writeCDISpec writes the CDI spec of the pod's GPU (kind bulkhead.dev/gpu,
// device named by its UUID) in mig.cdi_spec_dir, one file per sandbox.
func (p *Pipeline) writeCDISpec(res *node.Reservation) error {
	if p.node.Config().MIG.CDISpecDir == "" || res.GPU == nil {
		return nil
	}
	id, common, device, err := p.gpuEdits(res)
	if err != nil {
		return err
	}
	cs, err := inject.CDISpec(inject.CDIKind, common, map[string]inject.Edits{id: device})
	if err != nil {
		return fmt.Errorf("mig.cdi_spec_dir: %w", err)
	}
	if _, err := inject.WriteCDISpec(p.node.Config().MIG.CDISpecDir, res.SandboxID, cs); err != nil {
		return fmt.Errorf("mig.cdi_spec_dir: %w", err)
	}
	return nil
}
