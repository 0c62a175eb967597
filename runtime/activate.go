package runtime

import "github.com/bulkhead-runtime/bulkhead/runtime/node"

// activate marks the reservation active: the pod is placed.
func (p *Pipeline) activate(a *Admission) error {
	if err := p.fail(StepActive); err != nil {
		return err
	}
	a.Reservation.State = node.StateActive
	return p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(a.Reservation) })
}
