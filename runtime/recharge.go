package runtime

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/log"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// Resource updates. containerd's CRI UpdateContainerResources (the
// kubelet's in-place resize, `crictl update`) reaches the shim as a task
// Update that carries the container's whole linux.resources; an update of
// a container not yet started only rewrites containerd's stored spec, which
// reaches the shim as that container's Create. Both are judged here against
// the tier and the ledger: the pod's memory charge (Reservation.MemoryBytes)
// is always at least the sum of its live containers' memory limits, and a
// change that would raise it is the pod admitted again at its new size.

// chargeAfter is the pod's memory charge once container id's memory limit
// is limit (0: none), given the pod's charge and its live containers'
// limits. A container already live moves the charge by its own change. A
// new one is part of the charge the pod was admitted with (the kubelet's
// io.kubernetes.cri.sandbox-memory is the sum of its containers' limits),
// so it raises the charge only past the sum of every live container's
// limit: what an update made before the container started, or a pod
// admitted without that annotation.
func chargeAfter(charge int64, limits map[string]node.ContainerLimits, id string, limit int64) int64 {
	sum := limit
	for c, l := range limits {
		if c != id {
			sum += l.MemoryBytes
		}
	}
	if old, live := limits[id]; live {
		return max(charge-old.MemoryBytes+limit, sum, 0)
	}
	return max(charge, sum)
}

// ResourceChange is a change of one container's resources as the pod's
// memory charge sees it.
type ResourceChange struct {
	// Container and Name are the container's id and name in its pod.
	Container, Name string
	// MemoryBytes is the container's memory limit after the change; 0 when
	// it has none.
	MemoryBytes int64
	// Charge is the pod's memory charge after the change (chargeAfter).
	Charge int64
}

// Recharge asks the policy once whether the pod of sandbox sb, admitted as
// a says, may make change ch, then has act make it and re-charges the pod.
//
// A change that raises the pod's charge is the pod admitted again at its
// new size (input kind sandbox, request.memory_bytes the new charge, usage
// the tenant's other pods), decided in the ledger transaction that writes
// the new charge before act runs, so that no concurrent pod of the tenant
// can take the same quota; if act fails the old charge is written back.
// Any other change is a container decision (kind container, the container
// with its limit after the change, 0 when it has none: a memory limit
// missing is judged as on its create), and a lower charge is written after
// act succeeded: a crash in between leaves the ledger charging too much,
// never too little. A refusal changes nothing.
func (p *Pipeline) Recharge(ctx context.Context, sb *node.Sandbox, a *Admission, ch ResourceChange, act func() error) error {
	before := a.Reservation.MemoryBytes
	if ch.Charge <= before {
		in := p.changeInput(a, ch)
		if d, err := p.decider.Decide(ctx, in); err != nil || !d.Allow {
			return refusal(sb, d, err)
		}
		if err := act(); err != nil {
			return err
		}
		if ch.Charge == before {
			return nil
		}
		return p.setCharge(sb, a, ch.Charge)
	}
	err := p.node.Ledger().Update(func(tx *node.LedgerTx) error {
		res, err := tx.Get(sb.ID)
		if err != nil {
			return err
		}
		if res == nil {
			return fmt.Errorf("sandbox %s: no reservation in the ledger to charge", sb.ID)
		}
		in := a.Input
		in.Kind = policy.KindSandbox
		// The pod asks for nothing new but memory: its GPU is placed and
		// the node's capacity is not asked again.
		in.Request = policy.Request{MemoryBytes: ch.Charge, RDMA: a.Input.Request.RDMA}
		in.Node = nil
		if in.Usage, err = tx.Usage(res.Tenant); err != nil {
			return err
		}
		// Usage does not count this pod: it is the one being admitted.
		in.Usage.Sandboxes--
		in.Usage.GPUSlices -= res.GPUSlices()
		in.Usage.MemoryBytes -= res.MemoryBytes
		d, err := p.decider.Decide(ctx, in)
		if err != nil || !d.Allow {
			return refusal(sb, d, err)
		}
		if d.Tenant != res.Tenant {
			// The usage above is the admitted tenant's: a decision for
			// another is no answer (a shim's bundle does not change while
			// it serves, so this is a bug, not a refusal).
			return fmt.Errorf("sandbox %s: the policy names tenant %q for a pod admitted as %q", sb.ID, d.Tenant, res.Tenant)
		}
		res.MemoryBytes = ch.Charge
		return tx.Put(res)
	})
	if err != nil {
		return err
	}
	a.Reservation.MemoryBytes = ch.Charge
	if err := act(); err != nil {
		if rerr := p.setCharge(sb, a, before); rerr != nil {
			log.G(ctx).WithError(rerr).Errorf("sandbox %s: charge back %d bytes after a failed change of container %s", sb.ID, before, ch.Container)
			return errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// setCharge writes the pod's memory charge to the ledger and to a.
func (p *Pipeline) setCharge(sb *node.Sandbox, a *Admission, charge int64) error {
	err := p.node.Ledger().Update(func(tx *node.LedgerTx) error {
		res, err := tx.Get(sb.ID)
		if err != nil || res == nil {
			return err
		}
		res.MemoryBytes = charge
		return tx.Put(res)
	})
	if err != nil {
		return fmt.Errorf("sandbox %s: charge %d bytes: %w", sb.ID, charge, err)
	}
	a.Reservation.MemoryBytes = charge
	return nil
}

// changeInput is the container decision for a change that does not raise
// the pod's charge: the pod's identity and host namespaces, and the
// container with its memory limit after the change.
func (p *Pipeline) changeInput(a *Admission, ch ResourceChange) policy.Input {
	s := a.Input
	return policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindContainer,
		Namespace: s.Namespace,
		Pod: policy.Pod{
			Name: s.Pod.Name, UID: s.Pod.UID, Annotations: s.Pod.Annotations, RuntimeHandler: s.Pod.RuntimeHandler,
			HostNetwork: s.Pod.HostNetwork, HostPID: s.Pod.HostPID, HostIPC: s.Pod.HostIPC,
			Containers: []policy.Container{{Name: ch.Name, MemoryBytes: ch.MemoryBytes}},
		},
	}
}
