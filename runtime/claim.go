package runtime

import (
	"context"
	"errors"
	"fmt"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// Rules of a claim refused by the node itself rather than by the policy.
const (
	// RulePlacementTaken refuses a claim whose allocated device overlaps a
	// slice the node already holds, or breaks a co-tenancy rule the
	// scheduler cannot see (exclusive_physical_gpu).
	RulePlacementTaken = "gpu.placement_taken"
	// RuleClaimMIGInSandbox refuses a claim for a MIG slice whose pod runs
	// where a slice cannot be used (gVisor): a claimed device is that
	// slice, so the annotation path's whole-GPU fallback does not apply.
	RuleClaimMIGInSandbox = "gpu.mig_in_gvisor"
)

// Claim is one DRA ResourceClaim's device as the node prepares it.
type Claim struct {
	// UID is the claim's UID: the ledger key of its reservation, the owner
	// of its CDI spec and its CDI device's name.
	UID string
	// Namespace and Name are the claim's; Namespace gives the tenant.
	Namespace, Name string
	// Pod is a pod the claim is reserved for ("" when none is known) and
	// Handler that pod's runtime handler ("" when it names no RuntimeClass).
	Pod, Handler string
	// Device is the allocated device's name in the node's pool.
	Device string
	// GPU, Profile and Start are the MIG placement the device stands for.
	GPU     int
	Profile string
	Start   int
}

// PrepareClaim judges claim c on this node as a pod's slice is judged (the
// policy with the tenant's usage, in one ledger transaction), reserves
// exactly the placement the scheduler allocated, creates its MIG instance
// and writes its CDI spec, and returns the CDI device id. Preparing a
// prepared claim returns the same id. A refusal (*RefusedError) or any
// failure leaves nothing behind: no reservation, instance or CDI spec.
func (p *Pipeline) PrepareClaim(ctx context.Context, c Claim) (string, error) {
	if p.node.Config().MIG.CDISpecDir == "" {
		return "", fmt.Errorf("claim %s/%s: mig.cdi_spec_dir is empty: a claimed device reaches its container only through a CDI spec", c.Namespace, c.Name)
	}
	res, err := p.reserveClaim(ctx, c)
	if err != nil {
		return "", err
	}
	// Prepared before: the instance and the spec may be gone since (the
	// node rebooted: MIG instances and /var/run/cdi do not survive it,
	// the ledger does). The ledger still holds the placement, so making
	// them again takes nothing from anyone.
	if res.Instance != nil {
		if ok, err := p.instanceExists(*res.Instance); err != nil {
			return "", fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
		} else if !ok {
			// Forget it first: its GI id may be another instance's now,
			// which a release must not destroy.
			res.Instance = nil
			if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
				return "", err
			}
		}
	}
	id, err := p.createClaim(res)
	if err != nil {
		if rerr := p.node.Release(ctx, c.UID); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return "", fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return id, nil
}

// reserveClaim judges and reserves c, or returns its reservation when c
// was reserved before.
func (p *Pipeline) reserveClaim(ctx context.Context, c Claim) (res *node.Reservation, err error) {
	who := &node.Sandbox{Namespace: c.Namespace, Name: claimWho(c)}
	refuse := func(d policy.Decision, rule, msg string) error {
		return &RefusedError{Namespace: c.Namespace, Pod: who.Name, Tenant: d.Tenant, Revision: d.Revision, Reasons: []policy.Reason{{Rule: rule, Message: msg}}}
	}
	err = p.node.Ledger().Update(func(tx *node.LedgerTx) error {
		old, err := tx.Get(c.UID)
		if err != nil {
			return err
		}
		if old != nil {
			if old.Claim == nil || old.Claim.Device != c.Device {
				return fmt.Errorf("claim %s/%s: ledger key %s already holds %s", c.Namespace, c.Name, c.UID, old.GPU)
			}
			res = old
			return nil
		}
		alloc, err := p.allocator(tx)
		if err != nil {
			return err
		}
		if alloc == nil {
			return refuse(policy.Decision{}, "gpu.none_on_node", "the claim's device is on this node, which has no GPUs")
		}
		in := policy.Input{
			Version: policy.ContractVersion, Kind: policy.KindSandbox, Namespace: c.Namespace,
			Pod:     policy.Pod{Name: c.Pod, RuntimeHandler: c.Handler},
			Request: policy.Request{GPU: &policy.GPURequest{Profile: c.Profile, Count: 1}},
			Node:    nodeInput(alloc, p.node.GPUs()),
		}
		d, undecided, err := p.decideWithUsage(ctx, tx, c.Namespace, &in)
		if err != nil {
			return err
		}
		if undecided != nil || !d.Allow {
			return refusal(who, d, undecided)
		}
		if mode, err := mig.SandboxGPUMode(d.Runtime, d.GPU.MIGInSandbox); err != nil || mode != mig.GPUModeMIG {
			msg := fmt.Sprintf("the pod runs under %s (handler %q), which cannot use the MIG slice %s the claim holds", d.Runtime, c.Handler, c.Profile)
			if err != nil {
				msg = err.Error()
			}
			return refuse(d, RuleClaimMIGInSandbox, msg)
		}
		isolation := mig.IsolationShared
		if d.GPU.ExclusivePhysicalGPU {
			isolation = mig.IsolationTenant
		}
		pl := mig.Placement{GPU: c.GPU, Profile: c.Profile, Start: c.Start, Tenant: d.Tenant, Owner: c.UID, Isolation: isolation}
		// The allocator restores every placement the ledger holds plus this
		// one: it refuses an overlap or a co-tenancy breach exactly as it
		// does when it places a pod's slice itself.
		held := alloc.Placements()
		check, err := mig.NewAllocator(p.node.GPUs(), append(held, pl), p.allocatorOptions()...)
		if err != nil {
			return refuse(d, RulePlacementTaken, fmt.Sprintf("device %s: %v", c.Device, err))
		}
		for _, q := range check.Placements() {
			if q.Owner == c.UID {
				pl = q // Size and Compute from the geometry
			}
		}
		res = &node.Reservation{
			SandboxID: c.UID, State: node.StateReserved, Tenant: d.Tenant, Tier: d.Tier,
			Namespace: c.Namespace, Pod: c.Pod, GPU: &pl,
			Claim: &node.ClaimRecord{Namespace: c.Namespace, Name: c.Name, Device: c.Device},
		}
		return tx.Put(res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// instanceExists reports whether the backend still has instance in.
func (p *Pipeline) instanceExists(in mig.Instance) (bool, error) {
	all, err := p.node.Backend().Instances()
	if err != nil {
		return false, fmt.Errorf("gpu: %w", err)
	}
	for _, o := range all {
		if o.GPU == in.GPU && o.GI == in.GI && o.CI == in.CI && o.UUID == in.UUID {
			return true, nil
		}
	}
	return false, nil
}

// claimWho names a claim in a refusal's "pod" place: the pod it is for
// when known.
func claimWho(c Claim) string {
	if c.Pod != "" {
		return c.Pod + " (claim " + c.Name + ")"
	}
	return "(claim " + c.Name + ")"
}

// createClaim creates the reserved slice's MIG instance (unless it exists)
// and (again) writes the claim's CDI spec, device named by the claim's UID so
// that a container runtime's cached spec of an earlier claim never
// matches; each is in the ledger before anything refers to it.
func (p *Pipeline) createClaim(res *node.Reservation) (string, error) {
	if res.Instance == nil {
		in, err := p.node.Backend().Create(res.GPU.GPU, res.GPU.Profile, res.GPU.Start)
		if err != nil {
			return "", fmt.Errorf("gpu %d: create %s at %d: %w", res.GPU.GPU, res.GPU.Profile, res.GPU.Start, err)
		}
		res.Instance = &in
		if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
			return "", err
		}
	}
	_, common, device, err := p.gpuEdits(res)
	if err != nil {
		return "", err
	}
	cs, err := inject.CDISpec(inject.CDIKind, common, map[string]inject.Edits{res.SandboxID: device})
	if err != nil {
		return "", fmt.Errorf("mig.cdi_spec_dir: %w", err)
	}
	if _, err := inject.WriteCDISpec(p.node.Config().MIG.CDISpecDir, res.SandboxID, cs); err != nil {
		return "", fmt.Errorf("mig.cdi_spec_dir: %w", err)
	}
	res.State = node.StateActive
	res.Claim.CDIDevice = inject.CDIName(inject.CDIKind, res.SandboxID)
	if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
		return "", err
	}
	return res.Claim.CDIDevice, nil
}

// UnprepareClaim releases what PrepareClaim made for the claim of UID uid
// (its MIG instance, CDI spec and reservation), reading it from the
// ledger, so it works after a restart. Unpreparing a claim the node does
// not hold succeeds.
func (p *Pipeline) UnprepareClaim(ctx context.Context, uid string) error {
	var res *node.Reservation
	if err := p.node.Ledger().View(func(tx *node.LedgerTx) error {
		var err error
		res, err = tx.Get(uid)
		return err
	}); err != nil {
		return err
	}
	if res == nil {
		return nil
	}
	if res.Claim == nil {
		return fmt.Errorf("claim %s: the ledger holds a sandbox under that key, not a claim", uid)
	}
	return p.node.Release(ctx, uid)
}
