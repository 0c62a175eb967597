package node

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// Signing identity of the bundles SignBundle builds, as deploy/ uses it.
const (
	BundleKeyID = "bulkhead"
	BundleScope = "bulkhead"
)

// SignBundle does what a security team does: it copies the Rego modules of
// regoDir (without tests), merges tenantsJSON into data.json
// (policytest.WriteBundle), and builds a
// bundle signed with a fresh RSA key through the real `opa build
// --signing-key`. It returns the bundle and the public key's path.
func SignBundle(dir, regoDir, tenantsJSON string, binDirs []string) (bundle, pubKey string, err error) {
	opa, err := lookPath("opa", binDirs)
	if err != nil {
		return "", "", fmt.Errorf("needs opa (make tools): %w", err)
	}
	src := filepath.Join(dir, "bundle-src")
	if err := policytest.WriteBundle(src, regoDir, tenantsJSON); err != nil {
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
