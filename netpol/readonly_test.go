package netpol

import (
	"context"
	"errors"
	"os"
	"testing"
)

// TestOpenReadOnly: a reader finds no fence where none is pinned and creates
// nothing; on a pinned fence it reads, and its handles refuse writes.
func TestOpenReadOnly(t *testing.T) {
	n := newTestNet(t) // root: a bpffs of its own
	if _, err := OpenReadOnly(n.pinDir); !errors.Is(err, ErrNoFence) {
		t.Fatalf("OpenReadOnly before any Open: %v, want ErrNoFence", err)
	}
	if _, err := os.Stat(n.pinDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenReadOnly created %s (%v)", n.pinDir, err)
	}
	m, err := Open(context.Background(), Options{PinDir: n.pinDir, LockPath: n.lock})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := OpenReadOnly(n.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	eps, err := r.Endpoints()
	if err != nil || len(eps) != 0 {
		t.Fatalf("Endpoints on an empty fence: %v, %v", eps, err)
	}
	if _, err := r.Stats("nobody"); !errors.Is(err, ErrUnknownTenant) {
		t.Fatalf("Stats of an unknown tenant: %v, want ErrUnknownTenant", err)
	}
	if err := r.dp.tenantIDs.Put(nameKey{}, uint32(1)); err == nil {
		t.Fatal("a read-only handle accepted a write")
	}
}
