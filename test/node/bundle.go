package node

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Signing identity of the bundles SignBundle builds, as deploy/ uses it.
const (
	BundleKeyID = "bulkhead"
	BundleScope = "bulkhead"
)

// SignBundle does what a security team does: it copies the Rego modules of
// regoDir (without tests), merges tenantsJSON into data.json, and builds a
// bundle signed with a fresh RSA key through the real `opa build
// --signing-key`. It returns the bundle and the public key's path.
func SignBundle(dir, regoDir, tenantsJSON string, binDirs []string) (bundle, pubKey string, err error) {
	opa, err := lookPath("opa", binDirs)
	if err != nil {
		return "", "", fmt.Errorf("needs opa (make tools): %w", err)
	}
	src := filepath.Join(dir, "bundle-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", "", err
	}
	mods, err := filepath.Glob(filepath.Join(regoDir, "*.rego"))
	if err != nil {
		return "", "", err
	}
	for _, m := range mods {
		if strings.HasSuffix(m, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(m)
		if err != nil {
			return "", "", err
		}
		if err := os.WriteFile(filepath.Join(src, filepath.Base(m)), b, 0o644); err != nil {
			return "", "", err
		}
	}
	manifest, err := os.ReadFile(filepath.Join(regoDir, ".manifest"))
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(src, ".manifest"), manifest, 0o644); err != nil {
		return "", "", err
	}
	var data, tenants map[string]any
	raw, err := os.ReadFile(filepath.Join(regoDir, "data.json"))
	if err != nil {
		return "", "", err
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		return "", "", fmt.Errorf("rego data.json: %w", err)
	}
	if err := json.Unmarshal([]byte(tenantsJSON), &tenants); err != nil {
		return "", "", fmt.Errorf("tenants: %w", err)
	}
	bh, _ := data["bulkhead"].(map[string]any)
	tb, _ := tenants["bulkhead"].(map[string]any)
	if bh == nil || tb == nil {
		return "", "", fmt.Errorf("tenants: want {\"bulkhead\": {\"tenants\": {...}}}")
	}
	bh["tenants"] = tb["tenants"]
	merged, err := json.Marshal(data)
	if err != nil {
		return "", "", err
	}
	if err := os.WriteFile(filepath.Join(src, "data.json"), merged, 0o644); err != nil {
		return "", "", err
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", err
	}
	priv := filepath.Join(dir, "signing-key.pem")
	if err := os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	pubKey = filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(pubKey, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		return "", "", err
	}
	claims := filepath.Join(dir, "claims.json")
	if err := os.WriteFile(claims, []byte(`{"scope": "`+BundleScope+`"}`), 0o644); err != nil {
		return "", "", err
	}
	bundle = filepath.Join(dir, "bundle.tar.gz")
	out, err := exec.Command(opa, "build", "--bundle", src, "--signing-key", priv, "--signing-alg", "RS256",
		"--verification-key-id", BundleKeyID, "--claims-file", claims, "--output", bundle).CombinedOutput()
	if err != nil {
		return "", "", fmt.Errorf("opa build: %v: %s", err, out)
	}
	return bundle, pubKey, nil
}

// EnforcingBundle copies the bundle directory regoDir to dst with
// data.bulkhead.enforcement set to enforcement (rule id -> "deny", "warn",
// ...): the setting only the signed bundle may carry, as a security team
// would change it. Tests open dst unverified.
func EnforcingBundle(dst, regoDir string, enforcement map[string]string) error {
	if err := os.CopyFS(dst, os.DirFS(regoDir)); err != nil {
		return err
	}
	path := filepath.Join(dst, "data.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var data map[string]map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if data["bulkhead"] == nil {
		return fmt.Errorf("%s: no bulkhead object", path)
	}
	data["bulkhead"]["enforcement"] = enforcement
	if raw, err = json.Marshal(data); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}
