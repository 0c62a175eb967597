package policytest_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

const trustedTenants = `{"bulkhead": {"tenants": {"platform": {"tier": "trusted", "namespaces": ["platform"]}}}}`

func open(t *testing.T, opts policy.Options) (*policy.Engine, error) {
	t.Helper()
	opts.InsecureSkipVerification = true
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := policy.Open(context.Background(), opts)
	if err == nil {
		t.Cleanup(func() { _ = e.Close() })
	}
	return e, err
}

// TestBundleWithTenantsSignsTheTenantsIn: a trusted tenant, which the
// unsigned data file may not name, loads from the bundle BundleWithTenants
// writes, with the default bundle's revision, and owns its namespace.
func TestBundleWithTenantsSignsTheTenantsIn(t *testing.T) {
	data := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(data, []byte(trustedTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open(t, policy.Options{BundlePath: policytest.RegoDir(), DataPath: data}); err == nil || !strings.Contains(err.Error(), "unsigned_tenants") {
		t.Fatalf("trusted tenant in the data file: Open = %v, want the refusal naming unsigned_tenants", err)
	}

	e, err := open(t, policy.Options{BundlePath: policytest.BundleWithTenants(t, trustedTenants)})
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision() != "bulkhead-default-1" {
		t.Errorf("revision %q, want the default bundle's .manifest", e.Revision())
	}
	d, err := e.Decide(context.Background(), policy.Input{
		Version: policy.ContractVersion, Kind: policy.KindSandbox, Namespace: "platform",
		Pod: policy.Pod{Name: "p", UID: "u", RuntimeHandler: "bulkhead-runc"},
	})
	if err != nil || d.Tenant != "platform" || d.Tier != "trusted" {
		t.Fatalf("decision %+v (%v), want tenant platform of tier trusted", d, err)
	}
}

// TestWriteBundle: the modules without their tests, the edits applied in
// order, and tenants of the data file's shape only.
func TestWriteBundle(t *testing.T) {
	dir := t.TempDir()
	second := func(data map[string]any) {
		data["bulkhead"].(map[string]any)["enforcement"].(map[string]string)["b"] = "warn"
	}
	if err := policytest.WriteBundle(dir, policytest.RegoDir(), trustedTenants, policytest.Enforcement(map[string]string{"a": "deny"}), second); err != nil {
		t.Fatal(err)
	}
	if tests, _ := filepath.Glob(filepath.Join(dir, "*_test.rego")); len(tests) != 0 {
		t.Errorf("tests copied: %v", tests)
	}
	if _, err := os.Stat(filepath.Join(dir, "decision.rego")); err != nil {
		t.Error(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "data.json"))
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Bulkhead struct {
			Tenants     map[string]any    `json:"tenants"`
			Enforcement map[string]string `json:"enforcement"`
		} `json:"bulkhead"`
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"a": "deny", "b": "warn"}; !reflect.DeepEqual(data.Bulkhead.Enforcement, want) {
		t.Errorf("enforcement %v, want %v", data.Bulkhead.Enforcement, want)
	}
	if len(data.Bulkhead.Tenants) != 1 || data.Bulkhead.Tenants["platform"] == nil {
		t.Errorf("tenants %v, want platform alone", data.Bulkhead.Tenants)
	}

	for _, bad := range []string{`{"platform": {"tier": "trusted"}}`, `{"bulkhead": {}}`, `[`} {
		if err := policytest.WriteBundle(t.TempDir(), policytest.RegoDir(), bad); err == nil || !strings.Contains(err.Error(), "tenants") {
			t.Errorf("tenants %s: err = %v, want one naming the tenants", bad, err)
		}
	}
}
