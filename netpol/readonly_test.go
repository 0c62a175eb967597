package netpol

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
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

// TestReaderRemotePods: a reader lists the agent's remote pods as the
// Manager does, without its lock, and nothing else of the owner hashes.
func TestReaderRemotePods(t *testing.T) {
	f := newRemoteFixture(t, "untrusted")
	ctx := context.Background()
	pods := []RemotePod{
		{Addr: netip.MustParseAddr(remoteSame4), Tenant: "acme"},
		{Addr: netip.MustParseAddr(remoteSame6), Tenant: "acme"},
		{Addr: netip.MustParseAddr("10.7.0.6"), Tenant: "globex", AllowRDMA: true},
	}
	if err := f.m.SetRemote(ctx, pods); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReadOnly(f.m.opts.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.RemotePods()
	if err != nil {
		t.Fatal(err)
	}
	want, err := f.m.RemotePods()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || len(got) != len(pods) {
		t.Errorf("Reader.RemotePods = %v, want %v (the Manager's)", got, want)
	}
	if err := f.m.DeleteRemote(ctx, netip.MustParseAddr("10.7.0.6")); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.RemotePods(); len(got) != 2 {
		t.Errorf("after DeleteRemote the reader lists %v, want the two acme addresses", got)
	}
}
