package main

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

const demoTenants = "../../rego/examples/tenants.demo.json"

func writeJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "doc.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func agentInput(handler string) policy.Input {
	return policy.Input{
		Version: policy.ContractVersion, Kind: policy.KindAdmission, Namespace: "agents",
		Pod:     policy.Pod{Name: "a", RuntimeHandler: handler, Containers: []policy.Container{{Name: "main", Image: "r/a@sha256:00"}}},
		Request: policy.Request{MemoryBytes: 1 << 30},
	}
}

func TestPolicyEvalExitCodes(t *testing.T) {
	badField := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(badField, []byte(`{"version": "v1", "namespce": "agents"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"allow", []string{"--bundle", "../../rego", "--data", demoTenants, "--input", writeJSON(t, agentInput("bulkhead"))}, exitAllow, `"allow": true`, "NOT verified"},
		{"deny", []string{"--bundle", "../../rego", "--data", demoTenants, "--input", writeJSON(t, agentInput("runc"))}, exitDeny, `"rule": "runtime.runc_forbidden"`, ""},
		{"unknown input field", []string{"--bundle", "../../rego", "--input", badField}, exitError, "", `unknown field "namespce"`},
		{"missing bundle", []string{"--bundle", "/nonexistent", "--input", writeJSON(t, agentInput(""))}, exitError, "", "--bundle: stat /nonexistent"},
		{"no input flag", []string{"--bundle", "../../rego"}, exitUsage, "", "--input are required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := policyMain(append([]string{"eval"}, tt.args...), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout.String(), stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stdout %q / stderr %q lack %q / %q", stdout.String(), stderr.String(), tt.stdout, tt.stderr)
			}
		})
	}
}

func TestPolicyTestCommand(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := policyMain([]string{"test", "--threshold", "90", "../../rego"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "0 failed; line coverage") {
		t.Errorf("output %q", stdout.String())
	}
	failing := t.TempDir()
	if err := os.WriteFile(filepath.Join(failing, "x_test.rego"), []byte("package x_test\n\ntest_fails if false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := policyMain([]string{"test", failing}, &stdout, &stderr); code != exitError || !strings.Contains(stdout.String(), "FAIL data.x_test.test_fails") {
		t.Fatalf("failing bundle: exit %d\n%s", code, stdout.String())
	}
}

func TestPolicyVerify(t *testing.T) {
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	priv := filepath.Join(dir, "key.pem")
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := filepath.Join(dir, "pub.pem")
	claims := filepath.Join(dir, "claims.json")
	for path, content := range map[string][]byte{
		priv:   pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		pub:    pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}),
		claims: []byte(`{"scope": "prod"}`),
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := loader.NewFileLoader().AsBundle("../../rego")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.GenerateSignature(bundle.NewSigningConfig(priv, "RS256", claims), "sec", true); err != nil {
		t.Fatal(err)
	}
	signed := filepath.Join(dir, "bundle.tar.gz")
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).UseModulePath(true).Write(*b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(signed, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"valid", []string{"--bundle", signed, "--key", pub, "--key-id", "sec", "--scope", "prod"}, 0, "signature valid"},
		{"wrong scope", []string{"--bundle", signed, "--key", pub, "--key-id", "sec", "--scope", "dev"}, exitError, "scope mismatch"},
		{"no scope given", []string{"--bundle", signed, "--key", pub, "--key-id", "sec"}, exitError, "scope mismatch"},
		{"unsigned directory", []string{"--bundle", "../../rego", "--key", pub, "--key-id", "sec", "--scope", "prod"}, exitError, "missing .signatures.json"},
		{"missing key id", []string{"--bundle", signed, "--key", pub}, exitUsage, "required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := policyMain(append([]string{"verify"}, tt.args...), &stdout, &stderr)
			if code != tt.code || !strings.Contains(stdout.String()+stderr.String(), tt.want) {
				t.Fatalf("exit %d (want %d), output %q / %q, want %q", code, tt.code, stdout.String(), stderr.String(), tt.want)
			}
		})
	}
}
