package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/bulkhead-runtime/bulkhead/mig/inject"
)

// Release undoes everything the ledger says sandbox id holds, in reverse:
// fence entry, MIG instance, CDI spec, reservation. Releasing twice is
// harmless. The sandbox's record is its owner's to remove.
func (n *Node) Release(ctx context.Context, id string) error {
	var res *Reservation
	if err := n.ledger.View(func(tx *LedgerTx) error {
		var err error
		res, err = tx.Get(id)
		return err
	}); err != nil {
		return err
	}
	var errs []error
	if n.fence != nil {
		if err := n.fence.Unregister(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("fence: %w", err))
		}
	}
	if res != nil && res.Instance != nil && n.backend != nil {
		if err := n.backend.Destroy(res.Instance.GPU, res.Instance.GI, res.Instance.CI); err != nil {
			errs = append(errs, fmt.Errorf("gpu %d gi %d: %w", res.Instance.GPU, res.Instance.GI, err))
		}
	}
	if err := n.removeCDISpec(id); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// Keep the reservation so a later GC pass retries.
		return fmt.Errorf("sandbox %s: release: %w", id, errors.Join(errs...))
	}
	return n.ledger.Update(func(tx *LedgerTx) error { return tx.Delete(id) })
}

// removeCDISpec removes sandbox id's CDI spec; removing none is no error.
func (n *Node) removeCDISpec(id string) error {
	if n.cfg.MIG.CDISpecDir == "" {
		return nil
	}
	if err := inject.RemoveCDISpec(n.cfg.MIG.CDISpecDir, inject.CDIKind, id); err != nil {
		return fmt.Errorf("mig.cdi_spec_dir: %w", err)
	}
	return nil
}
