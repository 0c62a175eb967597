package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

func TestLedgerReservationsAndUsage(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "sub", "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	gpu := &mig.Placement{GPU: 0, Profile: "3g.71gb", Start: 4, Size: 4, Compute: 3, Tenant: "a", Owner: "s2"}
	for _, r := range []*Reservation{
		{SandboxID: "s1", State: StateActive, Tenant: "a", MemoryBytes: 1 << 30},
		{SandboxID: "s2", State: StateReserved, Tenant: "a", MemoryBytes: 2 << 30, GPU: gpu},
		{SandboxID: "s3", State: StateActive, Tenant: "b"},
	} {
		if err := l.Update(func(tx *LedgerTx) error { return tx.Put(r) }); err != nil {
			t.Fatal(err)
		}
	}
	err = l.View(func(tx *LedgerTx) error {
		u, err := tx.Usage("a")
		if err != nil {
			return err
		}
		if u.Sandboxes != 2 || u.GPUSlices != 3 || u.MemoryBytes != 3<<30 {
			return fmt.Errorf("usage of a = %+v", u)
		}
		pls, err := tx.Placements()
		if err != nil || len(pls) != 1 || pls[0] != *gpu {
			return fmt.Errorf("placements = %+v, %v", pls, err)
		}
		r, err := tx.Get("s2")
		if err != nil || r == nil || r.State != StateReserved || r.UpdatedAt.IsZero() {
			return fmt.Errorf("get s2 = %+v, %v", r, err)
		}
		if r, _ := tx.Get("nope"); r != nil {
			return errors.New("get of a missing sandbox returned a reservation")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Update(func(tx *LedgerTx) error { return tx.Put(&Reservation{}) }); err == nil {
		t.Error("a reservation without sandbox id was accepted")
	}
	// A failing transaction changes nothing.
	boom := errors.New("boom")
	if err := l.Update(func(tx *LedgerTx) error {
		_ = tx.Delete("s1")
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("update error = %v", err)
	}
	_ = l.View(func(tx *LedgerTx) error {
		if r, _ := tx.Get("s1"); r == nil {
			t.Error("a rolled-back delete took effect")
		}
		return nil
	})
}

// Concurrent read-modify-write transactions never lose an update: each one
// holds the file lock for its whole duration.
func TestLedgerSerialisesTransactions(t *testing.T) {
	l, err := OpenLedger(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				err := l.Update(func(tx *LedgerTx) error {
					u, err := tx.Usage("t")
					if err != nil {
						return err
					}
					if u.Sandboxes >= 25 { // a quota of 25
						return nil
					}
					return tx.Put(&Reservation{SandboxID: fmt.Sprintf("w%d-%d", w, i), Tenant: "t", State: StateReserved})
				})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	_ = l.View(func(tx *LedgerTx) error {
		u, _ := tx.Usage("t")
		if u.Sandboxes != 25 {
			t.Errorf("quota of 25 under concurrency: %d reservations", u.Sandboxes)
		}
		return nil
	})
}
