package policy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

func TestNamespaceTenant(t *testing.T) {
	e := openDefault(t)
	defer e.Close()
	ctx := context.Background()
	for ns, want := range map[string]string{
		"agents":      "agents",
		"kube-system": "platform", // a tenant may list several namespaces
		"nowhere":     "",
	} {
		got, rev, err := NamespaceTenant(ctx, e, ns)
		if err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		if got != want || rev != e.Revision() {
			t.Errorf("NamespaceTenant(%q) = %q, revision %q; want %q, revision %q", ns, got, rev, want, e.Revision())
		}
	}
}

// A namespace's grant is the decision for a pod there that asks for RDMA:
// the tiers that allow RDMA on the tenant's own VF grant it, the others
// and namespaces of no tenant do not.
func TestNamespaceGrant(t *testing.T) {
	e := openDefault(t)
	defer e.Close()
	ctx := context.Background()
	for ns, want := range map[string]NamespaceGrant{
		"agents":      {Tenant: "agents"},               // untrusted: rdma deny
		"research":    {Tenant: "research", RDMA: true}, // standard: own-vf
		"kube-system": {Tenant: "platform", RDMA: true}, // trusted: own-vf
		"nowhere":     {},
	} {
		got, rev, err := NamespaceGrantOf(ctx, e, ns)
		if err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		if got != want || rev != e.Revision() {
			t.Errorf("NamespaceGrantOf(%q) = %+v, revision %q; want %+v, revision %q", ns, got, rev, want, e.Revision())
		}
		c := NewNamespaceTenants(e)
		if g, err := c.Grant(ctx, ns); err != nil || g != want {
			t.Errorf("NamespaceTenants.Grant(%q) = %+v, %v; want %+v", ns, g, err, want)
		}
	}
}

// countingDecider counts decisions; with a revision it says which policy
// is in force.
type countingDecider struct {
	Decider
	n        atomic.Int32
	revision *atomic.Value
}

func (c *countingDecider) Decide(ctx context.Context, in Input) (Decision, error) {
	c.n.Add(1)
	return c.Decider.Decide(ctx, in)
}

type revisionDecider struct{ *countingDecider }

func (r revisionDecider) Revision() string { return r.revision.Load().(string) }

func TestNamespaceTenantsCache(t *testing.T) {
	e := openDefault(t)
	defer e.Close()
	ctx := context.Background()

	rev := &atomic.Value{}
	rev.Store("r1")
	withRev := &countingDecider{Decider: e, revision: rev}
	c := NewNamespaceTenants(revisionDecider{withRev})
	for range 3 {
		if got, err := c.Tenant(ctx, "research"); err != nil || got != "research" {
			t.Fatalf("Tenant(research) = %q, %v", got, err)
		}
	}
	if n := withRev.n.Load(); n != 1 {
		t.Errorf("%d decisions for one namespace under one revision, want 1", n)
	}
	if !c.Refresh() || c.Refresh() {
		t.Error("Refresh: want true on the first call, then false while the revision stays")
	}
	rev.Store("r2")
	if _, err := c.Tenant(ctx, "research"); err != nil {
		t.Fatal(err)
	}
	if n := withRev.n.Load(); n != 2 {
		t.Errorf("%d decisions after a new revision, want 2", n)
	}
	if !c.Refresh() {
		t.Error("Refresh after a new revision that Tenant saw first: want true")
	}

	plain := &countingDecider{Decider: e}
	c = NewNamespaceTenants(plain)
	for range 2 {
		if _, err := c.Tenant(ctx, "research"); err != nil {
			t.Fatal(err)
		}
	}
	if n := plain.n.Load(); n != 2 || !c.Refresh() {
		t.Errorf("a Decider that cannot tell its policy: %d decisions for 2 calls, want 2, and Refresh always true", n)
	}
}

// A reload of the data file alone moves a namespace without changing the
// bundle's revision: an Engine's answers are forgotten all the same.
func TestNamespaceTenantsEngineReload(t *testing.T) {
	ctx := context.Background()
	raw, err := os.ReadFile(repoPath(t, "rego/examples/tenants.demo.json"))
	if err != nil {
		t.Fatal(err)
	}
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tenants.json")
	write := func() {
		b, err := json.Marshal(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write()
	e, err := Open(ctx, Options{BundlePath: repoPath(t, "rego"), DataPath: path, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	c := NewNamespaceTenants(e)
	if got, err := c.Tenant(ctx, "lab"); err != nil || got != "" {
		t.Fatalf("Tenant(lab) before = %q, %v; want no tenant", got, err)
	}
	if !c.Refresh() || c.Refresh() {
		t.Fatal("Refresh: want true on the first call, then false while the engine keeps its policy")
	}
	research := data["bulkhead"].(map[string]any)["tenants"].(map[string]any)["research"].(map[string]any)
	research["namespaces"] = []any{"research", "lab"}
	write()
	before := e.Revision()
	if err := e.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if e.Revision() != before {
		t.Logf("revision changed too (%s -> %s)", before, e.Revision())
	}
	if !c.Refresh() {
		t.Error("Refresh after the engine reloaded: want true")
	}
	if got, err := c.Tenant(ctx, "lab"); err != nil || got != "research" {
		t.Errorf("Tenant(lab) after the reload = %q, %v; want research", got, err)
	}
}
