package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// RuleRuntimeMismatch refuses a pod whose decision names another runtime
// than the shim it reached runs (a handler registered with the wrong shim).
const RuleRuntimeMismatch = "runtime.handler_mismatch"

// reserve decides with the tenant's usage and reserves: policy, quota and
// GPU placement happen in one ledger transaction, so concurrent pods of a
// tenant cannot overrun its quota or double-book a slice. The policy is
// asked once: the usage is that of the tenant the policy in force gives
// the pod's namespace (asked once per namespace and policy, remembered),
// and a decision that names another tenant (the policy changed in
// between) is made again with its own tenant's usage.
func (p *Pipeline) reserve(ctx context.Context, sb *node.Sandbox, in policy.Input, a *Admission) error {
	return p.node.Ledger().Update(func(tx *node.LedgerTx) error {
		if old, err := tx.Get(sb.ID); err != nil {
			return err
		} else if old != nil {
			return fmt.Errorf("sandbox %s: already reserved (%s)", sb.ID, old.State)
		}
		alloc, err := p.allocator(tx)
		if err != nil {
			return err
		}
		in.Node = nodeInput(alloc, p.node.GPUs())
		// The node's name, as refusals and decision logs name it.
		in.Node.Name = p.nodeName
		d, undecided, err := p.decideWithUsage(ctx, tx, sb.Namespace, &in)
		if err != nil {
			return err
		}
		if undecided != nil || !d.Allow {
			return refusal(sb, d, undecided)
		}
		// The policy picks the runtime from the handler; this shim runs
		// one runtime and starts nothing in another.
		if d.Runtime != sb.Runtime {
			return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: []policy.Reason{{
				Rule:    RuleRuntimeMismatch,
				Message: fmt.Sprintf("handler %q runs %s here, but the policy chose runtime %q for it (data.bulkhead.handlers)", sb.Handler, sb.Runtime, d.Runtime),
			}}}
		}
		res := &node.Reservation{
			SandboxID: sb.ID, State: node.StateReserved, Tenant: d.Tenant, Tier: d.Tier,
			Namespace: sb.Namespace, Pod: sb.Name, MemoryBytes: in.Request.MemoryBytes,
			ShimPID: sb.ShimPID, CreatedAt: sb.CreatedAt,
			// Pod.createSandbox sealed the record before it placed the pod.
			SealedRecord: true,
		}
		if in.Request.GPU != nil {
			pl, err := p.placeGPU(sb, d, in.Request.GPU, alloc)
			if err != nil {
				return err
			}
			res.GPU = &pl
		}
		if err := p.fail(StepReserve); err != nil {
			return err
		}
		if err := tx.Put(res); err != nil {
			return err
		}
		a.Decision, a.Reservation = d, res
		return nil
	})
}

// nodeInput describes the node's GPUs for the policy, from the backend's
// view of them (gpus: MIG mode as the hardware reports it) and the
// allocator's placements.
func nodeInput(alloc *mig.Allocator, gpus []mig.GPU) *policy.Node {
	n := &policy.Node{}
	if alloc == nil {
		return n
	}
	tenants := map[int][]string{}
	for _, pl := range alloc.Placements() {
		if !slices.Contains(tenants[pl.GPU], pl.Tenant) {
			tenants[pl.GPU] = append(tenants[pl.GPU], pl.Tenant)
		}
	}
	migEnabled := map[int]bool{}
	for _, g := range gpus {
		migEnabled[g.Index] = !g.NoMIG
	}
	for _, u := range alloc.Usage() {
		n.GPUs = append(n.GPUs, policy.NodeGPU{Index: u.Index, Model: u.Model, MIGEnabled: migEnabled[u.Index], FreeSlices: mig.ComputeSlices - u.Compute, Tenants: tenants[u.Index]})
	}
	return n
}

// allocator rebuilds the node's GPU allocator from the ledger; nil without GPUs.
func (p *Pipeline) allocator(tx *node.LedgerTx) (*mig.Allocator, error) {
	if len(p.node.GPUs()) == 0 {
		return nil, nil
	}
	placements, err := tx.Placements()
	if err != nil {
		return nil, err
	}
	alloc, err := mig.NewAllocator(p.node.GPUs(), placements, p.allocatorOptions()...)
	if err != nil {
		return nil, fmt.Errorf("ledger and GPU geometry disagree: %w", err)
	}
	return alloc, nil
}

// placeGPU picks a slice (or a whole GPU) as the decision allows.
func (p *Pipeline) placeGPU(sb *node.Sandbox, d policy.Decision, req *policy.GPURequest, alloc *mig.Allocator) (mig.Placement, error) {
	refuse := func(rule, msg string) error {
		return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: []policy.Reason{{Rule: rule, Message: msg}}}
	}
	if alloc == nil {
		return mig.Placement{}, refuse("gpu.none_on_node", "the pod asks for a GPU and this node has none")
	}
	if req.Count != 1 {
		return mig.Placement{}, refuse("gpu.count", fmt.Sprintf("%s %d: one GPU or slice per pod is supported", policy.AnnotationGPUCount, req.Count))
	}
	isolation := mig.IsolationShared
	if d.GPU.ExclusivePhysicalGPU {
		isolation = mig.IsolationTenant
	}
	mreq := mig.Request{Owner: sb.ID, Tenant: d.Tenant, Isolation: isolation}
	if req.Profile == policy.ProfileWhole {
		if !d.GPU.WholeGPU {
			return mig.Placement{}, refuse("gpu.whole_gpu_denied", fmt.Sprintf("tier %s may not have a whole GPU", d.Tier))
		}
		mreq.WholeGPU = true
	} else {
		// gVisor's nvproxy cannot expose MIG capability devices: apply the
		// policy's answer instead of starting a sandbox that cannot use its GPU.
		mode, err := mig.SandboxGPUMode(sb.Runtime, d.GPU.MIGInSandbox)
		if err != nil {
			return mig.Placement{}, refuse("gpu.mig_in_gvisor", err.Error())
		}
		if mode == mig.GPUModeWhole {
			mreq.WholeGPU = true
		} else {
			mreq.Profile = req.Profile
		}
	}
	pl, err := alloc.Allocate(mreq)
	if err != nil {
		if errors.Is(err, mig.ErrInsufficientResources) {
			return mig.Placement{}, refuse("gpu.insufficient_resources", err.Error())
		}
		return mig.Placement{}, err
	}
	return pl, nil
}

// allocatorOptions are the allocator's options for this node. On real
// GPUs (mig.backend = "nvml") the allocator is strict: a whole GPU only
// from a GPU whose MIG mode is off, since CUDA sees no device on a
// MIG-enabled GPU without MIG capabilities. The mock's GPUs are all in MIG
// mode, so a simulated node stays lenient to exercise gVisor's whole-GPU
// fallback.
func (p *Pipeline) allocatorOptions() []mig.Option {
	if p.node.Config().MIG.Backend == "nvml" {
		return []mig.Option{mig.WithStrictMIGMode()}
	}
	return nil
}

// decideWithUsage decides in with the usage the ledger (tx) holds for the
// tenant the policy in force gives namespace, asked once per namespace
// (p.tenants); a decision that names another tenant is decided again with
// that tenant's usage. undecided is why there is no decision (the tenant
// or the policy could not be asked: a refusal); err is the ledger's.
func (p *Pipeline) decideWithUsage(ctx context.Context, tx *node.LedgerTx, namespace string, in *policy.Input) (d policy.Decision, undecided, err error) {
	tenant, err := p.tenants.Tenant(ctx, namespace)
	if err != nil {
		return policy.Decision{}, err, nil
	}
	if in.Usage, err = tx.Usage(tenant); err != nil {
		return policy.Decision{}, nil, err
	}
	d, undecided = p.decider.Decide(ctx, *in)
	if undecided == nil && d.Tenant != tenant {
		if in.Usage, err = tx.Usage(d.Tenant); err != nil {
			return policy.Decision{}, nil, err
		}
		d, undecided = p.decider.Decide(ctx, *in)
	}
	return d, undecided, nil
}
