package netpol

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// TestDropStats: every named tenant is listed once, in order, with every
// reason present and each counter summed over CPUs; a Reader sees the same.
func TestDropStats(t *testing.T) {
	n := newTestNet(t) // root: a bpffs of its own
	ctx := context.Background()
	m := n.open(ctx, func(o *Options) {
		o.Cluster.RemoteTenants = []TenantRange{
			{Tenant: "red", Prefix: netip.MustParsePrefix("10.50.0.0/16")},
			{Tenant: "blue", Prefix: netip.MustParsePrefix("10.51.0.0/16")},
		}
	})
	defer m.Close()
	red, err := lookupID(m.dp.tenantIDs, "red")
	if err != nil || red == 0 {
		t.Fatalf("red has id %d (%v), want one", red, err)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perCPU := make([]uint64, cpus)
	var want uint64
	for i := range perCPU {
		perCPU[i] = uint64(i + 1)
		want += uint64(i + 1)
	}
	if err := m.dp.drops.Put(dropKey{Tenant: red, Reason: uint32(ReasonEgress)}, perCPU); err != nil {
		t.Fatal(err)
	}

	check := func(name string, got []Stats, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != 2 || got[0].Tenant != "blue" || got[1].Tenant != "red" {
			t.Fatalf("%s: tenants %+v, want blue then red", name, got)
		}
		for _, s := range got {
			for _, r := range Reasons() {
				n, ok := s.Drops[r]
				if !ok {
					t.Errorf("%s: %s has no %s counter", name, s.Tenant, r)
				}
				w := uint64(0)
				if s.Tenant == "red" && r == ReasonEgress {
					w = want
				}
				if n != w {
					t.Errorf("%s: %s %s = %d, want %d", name, s.Tenant, r, n, w)
				}
			}
		}
	}
	got, err := m.DropStats()
	check("Manager", got, err)

	r, err := OpenReadOnly(n.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err = r.DropStats()
	check("Reader", got, err)

	m.Close()
	if _, err := m.DropStats(); err == nil {
		t.Error("DropStats on a closed Manager succeeded")
	}
}
