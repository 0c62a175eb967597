// Package policytest builds policy bundles for tests the way a security
// team builds the one a node verifies (deploy/policy/build.sh): the default
// bundle's modules with the tenants signed into its data.json. A tenant
// whose tier keeps to signed tenants (trusted: no unsigned_tenants) can only
// come this way, never from the unsigned data file. No production binary
// imports it.
package policytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Edit changes a bundle's data (the document of data.json) before it is
// written, as a signer would: enforcement, a tier's settings.
type Edit func(data map[string]any)

// Enforcement sets data.bulkhead.enforcement (rule id -> "deny", "warn",
// ...): the setting only the signed bundle may carry.
func Enforcement(enforcement map[string]string) Edit {
	return func(data map[string]any) {
		data["bulkhead"].(map[string]any)["enforcement"] = enforcement
	}
}

// RegoDir is the repository's default bundle, rego/.
func RegoDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "rego")
}

// BundleWithTenants writes WriteBundle of RegoDir with tenantsJSON and
// edits into a fresh temporary directory, and returns that directory.
func BundleWithTenants(t testing.TB, tenantsJSON string, edits ...Edit) string {
	t.Helper()
	dir := t.TempDir()
	if err := WriteBundle(dir, RegoDir(), tenantsJSON, edits...); err != nil {
		t.Fatal(err)
	}
	return dir
}

// WriteBundle writes to dst, a directory, the bundle regoDir makes with
// tenantsJSON signed in: its Rego modules without their tests, its
// .manifest, and its data.json with data.bulkhead.tenants set to those of
// tenantsJSON, which has the data file's shape ({"bulkhead": {"tenants":
// {...}}}). edits then change the data in order.
func WriteBundle(dst, regoDir, tenantsJSON string, edits ...Edit) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	mods, err := filepath.Glob(filepath.Join(regoDir, "*.rego"))
	if err != nil {
		return err
	}
	for _, m := range mods {
		if strings.HasSuffix(m, "_test.rego") {
			continue
		}
		if err := copyFile(m, filepath.Join(dst, filepath.Base(m))); err != nil {
			return err
		}
	}
	if err := copyFile(filepath.Join(regoDir, ".manifest"), filepath.Join(dst, ".manifest")); err != nil {
		return err
	}
	var data, tenants map[string]any
	raw, err := os.ReadFile(filepath.Join(regoDir, "data.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(regoDir, "data.json"), err)
	}
	if err := json.Unmarshal([]byte(tenantsJSON), &tenants); err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	bh, _ := data["bulkhead"].(map[string]any)
	tb, _ := tenants["bulkhead"].(map[string]any)
	if bh == nil || tb == nil || tb["tenants"] == nil {
		return fmt.Errorf(`tenants: want {"bulkhead": {"tenants": {...}}}`)
	}
	bh["tenants"] = tb["tenants"]
	for _, edit := range edits {
		edit(data)
	}
	merged, err := json.Marshal(data)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dst, "data.json"), merged, 0o644)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
