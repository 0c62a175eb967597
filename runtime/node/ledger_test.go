package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

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

// TestLedgerFormat: a new ledger records its format; one without a format
// (the releases before it) opens with its reservations and gets one; a
// newer format is refused by writers and readers alike, naming both.
func TestLedgerFormat(t *testing.T) {
	// seed writes a ledger as an older or newer release would have.
	seed := func(t *testing.T, format string) string {
		path := filepath.Join(t.TempDir(), "ledger.db")
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = db.Update(func(btx *bolt.Tx) error {
			b, err := btx.CreateBucket(bucketSandboxes)
			if err != nil {
				return err
			}
			if err := b.Put([]byte("sb-1"), []byte(`{"sandbox_id":"sb-1","state":"active","tenant":"agents"}`)); err != nil {
				return err
			}
			if format == "" {
				return nil
			}
			m, err := btx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return m.Put(keyFormat, []byte(format))
		})
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	format := func(t *testing.T, path string) string {
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var v string
		_ = db.View(func(btx *bolt.Tx) error {
			if m := btx.Bucket(bucketMeta); m != nil {
				v = string(m.Get(keyFormat))
			}
			return nil
		})
		return v
	}
	for _, tc := range []struct {
		name, seeded string
		wantErr      string // in OpenLedger's and View's errors; "" for none
		wantFormat   string
	}{
		{name: "no format: the releases before it", seeded: "", wantFormat: "1"},
		{name: "this format", seeded: "1", wantFormat: "1"},
		{name: "a newer release's", seeded: "2", wantErr: "holds format 2, this build knows formats up to 1", wantFormat: "2"},
		{name: "not a number", seeded: "two", wantErr: `format "two"`, wantFormat: "two"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := seed(t, tc.seeded)
			l, err := OpenLedger(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("OpenLedger: %v, want an error containing %q", err, tc.wantErr)
				}
				if tc.seeded == "2" && !errors.Is(err, ErrLedgerNewer) {
					t.Errorf("OpenLedger: %v, want ErrLedgerNewer", err)
				}
				l = &Ledger{path: path, timeout: time.Second}
				if err := l.View(func(*LedgerTx) error { return nil }); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("View: %v, want an error containing %q", err, tc.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("OpenLedger: %v", err)
				}
				err = l.View(func(tx *LedgerTx) error {
					r, err := tx.Get("sb-1")
					if err == nil && (r == nil || r.Tenant != "agents") {
						t.Errorf("the reservation written before: %+v, want tenant agents", r)
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := format(t, path); got != tc.wantFormat {
				t.Errorf("format recorded: %q, want %q", got, tc.wantFormat)
			}
		})
	}
	// A new ledger records its format at once.
	path := filepath.Join(t.TempDir(), "new.db")
	if _, err := OpenLedger(path); err != nil {
		t.Fatal(err)
	}
	if got := format(t, path); got != "1" {
		t.Errorf("a new ledger's format: %q, want 1", got)
	}
}
