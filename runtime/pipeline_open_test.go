package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	testnode "github.com/bulkhead-runtime/bulkhead/test/node"
)

// TestShimsSharePolicyPlanCache: the first shim to open a signed bundle
// leaves its compiled plan under the state directory; the next opens it
// from there (the entry is not rewritten) and decides as the first. Each
// open's stages reach the sandbox's start trace.
func TestShimsSharePolicyPlanCache(t *testing.T) {
	dir := t.TempDir()
	// Signed with the real opa, as deploy/ signs (skips without it), with
	// signedTenants; the others come from the unsigned data file, as on a
	// node.
	tarball, pubKey, err := testnode.SignBundle(dir, "../rego", signedTenants, testnode.BinDirs())
	if err != nil {
		t.Skip(err)
	}
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, []byte(testTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Netpol.Enabled = false // the fence needs root; test/e2e opens it
	cfg.Policy = config.PolicyConfig{Bundle: tarball, KeyFile: pubKey, KeyID: testnode.BundleKeyID, Scope: testnode.BundleScope, Data: tenants}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	in := policy.Input{Version: policy.ContractVersion, Kind: policy.KindSandbox, Namespace: "research",
		Pod: policy.Pod{Name: "p", UID: "u", RuntimeHandler: DefaultHandler}}
	var first policy.Decision
	var entry os.FileInfo
	for shim := range 2 {
		ctx, trace := starttrace.New(context.Background())
		_, eng, err := Open(ctx, cfg)
		if err != nil {
			t.Fatalf("shim %d: %v", shim, err)
		}
		entries, _ := filepath.Glob(filepath.Join(cfg.StateDir, PolicyCacheDir, "plan-*"))
		if len(entries) != 1 {
			t.Fatalf("shim %d: plan cache holds %v, want one entry", shim, entries)
		}
		st, err := os.Stat(entries[0])
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("shim %d: entry %v (%v), want mode 0600", shim, st, err)
		}
		if shim == 0 {
			entry = st
		} else if !os.SameFile(entry, st) || !st.ModTime().Equal(entry.ModTime()) {
			t.Fatalf("shim %d rewrote the entry instead of reading it", shim)
		}
		var names []string
		for _, s := range trace.Stages() {
			names = append(names, s.Name)
		}
		if got := strings.Join(names, " "); got != "open.ledger open.mig open.policy open.policy-wait" {
			t.Fatalf("shim %d: trace stages %q", shim, got)
		}
		d, err := eng.Decide(context.Background(), in)
		if err != nil || !d.Allow || d.Tenant != "research" {
			t.Fatalf("shim %d: decision %+v (%v), want research allowed", shim, d, err)
		}
		if shim == 0 {
			first = d
		} else if d.Revision != first.Revision || d.Runtime != first.Runtime || d.Tier != first.Tier {
			t.Fatalf("shim %d decided %+v, the first %+v", shim, d, first)
		}
	}
}
