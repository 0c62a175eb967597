package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// signedTarball builds rego/ without its tests as a tarball signed for key
// id "bulkhead" and scope "bulkhead", as deploy/ does, and returns it and
// the public key's file.
func signedTarball(t *testing.T, dir string) (tarball, pubKey string) {
	t.Helper()
	src := filepath.Join(dir, "bundle-src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../rego/*.rego")
	files = append(files, "../rego/.manifest", "../rego/data.json")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.rego") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	priv, pubKey := filepath.Join(dir, "key"), filepath.Join(dir, "key.pub")
	claims := filepath.Join(dir, "claims.json")
	for path, content := range map[string][]byte{
		priv:   pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		pubKey: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}),
		claims: []byte(`{"scope": "bulkhead"}`),
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := loader.NewFileLoader().AsBundle(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.GenerateSignature(bundle.NewSigningConfig(priv, "RS256", claims), "bulkhead", true); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).UseModulePath(true).Write(*b); err != nil {
		t.Fatal(err)
	}
	tarball = filepath.Join(dir, "bundle.tar.gz")
	if err := os.WriteFile(tarball, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return tarball, pubKey
}

// TestShimsSharePolicyPlanCache: the first shim to open a signed bundle
// leaves its compiled plan under the state directory; the next opens it
// from there (the entry is not rewritten) and decides as the first. Each
// open's stages reach the sandbox's start trace.
func TestShimsSharePolicyPlanCache(t *testing.T) {
	dir := t.TempDir()
	tarball, pubKey := signedTarball(t, dir)
	tenants := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(tenants, []byte(testTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Netpol.Enabled = false // the fence needs root; test/e2e opens it
	cfg.Policy = PolicyConfig{Bundle: tarball, KeyFile: pubKey, KeyID: "bulkhead", Scope: "bulkhead", Data: tenants}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	in := policy.Input{Version: policy.ContractVersion, Kind: policy.KindSandbox, Namespace: "research",
		Pod: policy.Pod{Name: "p", UID: "u", RuntimeHandler: DefaultHandler}}
	var first policy.Decision
	var entry os.FileInfo
	for shim := range 2 {
		ctx, trace := withStartTrace(context.Background())
		c, err := OpenComponents(ctx, cfg, true)
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
		for _, s := range trace.stages {
			names = append(names, s.name)
		}
		if got := strings.Join(names, " "); got != "open.ledger open.mig open.policy open.policy-wait" {
			t.Fatalf("shim %d: trace stages %q", shim, got)
		}
		d, err := c.Decider.Decide(context.Background(), in)
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
