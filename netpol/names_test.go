package netpol

import (
	"context"
	"net/netip"
	"strings"
	"testing"
)

// notLabels are tenant and tier names that are not DNS-1123 labels, with
// what the refusal says. "agents\x00" is the name that read as "agents" in
// the NUL-padded name maps and got that tenant's fence identity (issue 24,
// hole 5).
var notLabels = []struct{ name, says string }{
	{"agents\x00", `"agents\x00" holds "\x00" at byte 6`},
	{"agents\x00\x00", `holds "\x00" at byte 6`},
	{"Agents", `"Agents" holds "A" at byte 0`},
	{"a_b", `"a_b" holds "_" at byte 1`},
	{"agents.", `holds "." at byte 6`},
	{"-agents", "starts or ends with '-'"},
	{strings.Repeat("a", 64), "is 64 bytes"},
	{"", "is empty"},
}

func TestEndpointNamesAreLabels(t *testing.T) {
	base := Endpoint{SandboxID: "s", Ifindex: 3, Tenant: "agents", Tier: "untrusted", IPv4: netip.MustParseAddr("10.1.2.3")}
	if err := base.validate(); err != nil {
		t.Fatal(err)
	}
	long := base
	long.Tenant, long.Tier = strings.Repeat("a", 63), strings.Repeat("t", 63)
	if err := long.validate(); err != nil {
		t.Errorf("63-byte labels: %v", err)
	}
	for _, bad := range notLabels {
		for field, set := range map[string]func(*Endpoint){
			"Tenant": func(e *Endpoint) { e.Tenant = bad.name },
			"Tier":   func(e *Endpoint) { e.Tier = bad.name },
		} {
			e := base
			set(&e)
			if err := e.validate(); err == nil || !strings.Contains(err.Error(), "endpoint s: "+field+" ") || !strings.Contains(err.Error(), bad.says) {
				t.Errorf("%s %q: validate = %v, want an error naming %s and saying %q", field, bad.name, err, field, bad.says)
			}
		}
	}
}

func TestClusterNamesAreLabels(t *testing.T) {
	for _, bad := range notLabels {
		for _, tc := range []struct {
			what string
			c    ClusterConfig
		}{
			{"Cluster.SharedServices tier", ClusterConfig{SharedServices: map[string][]netip.Prefix{bad.name: nil}}},
			{"Cluster.RemoteTenants[0].Tenant", ClusterConfig{RemoteTenants: []TenantRange{{Tenant: bad.name, Prefix: netip.MustParsePrefix("10.9.0.0/16")}}}},
		} {
			opts := Options{PinDir: "/sys/fs/bpf/x", LockPath: "/run/x.lock", Cluster: &tc.c}
			if err := opts.validate(); err == nil || !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), bad.says) {
				t.Errorf("%s %q: validate = %v, want an error naming the field and saying %q", tc.what, bad.name, err, bad.says)
			}
		}
	}
}

// TestRegisterRefusesNameAliases drives Register on a real fence: a pod
// registered as "agents\x00" (or any name that is not a label) is refused
// with an error naming the name, the fence holds nothing of it, and its
// TCP does not reach the pod of tenant agents, as it did when the
// NUL-padded name map gave it agents' identity.
func TestRegisterRefusesNameAliases(t *testing.T) {
	n := newTestNet(t)
	ctx := context.Background()
	a1, x1 := n.addPod("a1", 1), n.addPod("x1", 2)
	m := n.open(ctx, nil)
	defer m.Close()
	if err := m.Register(ctx, n.endpoint(a1, "agents", nil)); err != nil {
		t.Fatal(err)
	}
	err := m.Register(ctx, n.endpoint(x1, "agents\x00", nil))
	if want := `Tenant "agents\x00" holds "\x00" at byte 6`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Register(tenant %q) = %v, want a refusal containing %s", "agents\x00", err, want)
	}
	// Refused, x1 is no tenant's: the cluster rule drops its traffic.
	n.enter()
	if n.reach(x1, a1, probeTCP, silenceWait) {
		t.Error(`TCP from the pod registered as "agents\x00" reaches agents' pod`)
	}
	for _, bad := range notLabels {
		err := m.Register(ctx, n.endpoint(x1, bad.name, nil))
		if err == nil || !strings.Contains(err.Error(), "Tenant ") || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("Register(tenant %q) = %v, want a refusal saying %q", bad.name, err, bad.says)
		}
		err = m.Register(ctx, n.endpoint(x1, "xenon", func(e *Endpoint) { e.Tier = bad.name }))
		if err == nil || !strings.Contains(err.Error(), "Tier ") || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("Register(tier %q) = %v, want a refusal saying %q", bad.name, err, bad.says)
		}
	}
	eps, err := m.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 1 || eps[0].Tenant != "agents" {
		t.Errorf("endpoints after the refusals: %+v, want agents' pod only", eps)
	}
	if _, err := m.Stats("agents\x00"); err == nil || !strings.Contains(err.Error(), `"agents\x00" holds "\x00"`) {
		t.Errorf(`Stats("agents\x00") = %v, want a refusal, not agents' counters`, err)
	}
}
