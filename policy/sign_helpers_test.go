package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/loader"
)

// keyPair is an RSA key written as PEM files.
type keyPair struct {
	privPath, pubPath, pubPEM string
}

func newKeyPair(t testing.TB, dir, name string) keyPair {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	kp := keyPair{
		privPath: filepath.Join(dir, name+".key.pem"),
		pubPath:  filepath.Join(dir, name+".pub.pem"),
		pubPEM:   string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
	}
	priv := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	if err := os.WriteFile(kp.privPath, priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kp.pubPath, []byte(kp.pubPEM), 0o644); err != nil {
		t.Fatal(err)
	}
	return kp
}

// buildBundle writes srcDir as a .tar.gz bundle, signed by kp under keyID
// for scope when kp is not nil, using OPA's own bundle library.
func buildBundle(t testing.TB, srcDir, out string, kp *keyPair, keyID, scope string) {
	t.Helper()
	b, err := loader.NewFileLoader().AsBundle(srcDir)
	if err != nil {
		t.Fatal(err)
	}
	if kp != nil {
		claims := filepath.Join(filepath.Dir(out), "claims-"+keyID+".json")
		cb, _ := json.Marshal(map[string]string{"scope": scope})
		if err := os.WriteFile(claims, cb, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := b.GenerateSignature(bundle.NewSigningConfig(kp.privPath, "RS256", claims), keyID, true); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).UseModulePath(true).Write(*b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// rewriteTar copies the tarball at path, passing each file through edit.
func rewriteTar(t testing.TB, path string, edit func(name string, content []byte) []byte) {
	t.Helper()
	rewriteTarFiles(t, path, func(files []tarFile) []tarFile {
		for i, f := range files {
			files[i].content = edit(f.name, f.content)
		}
		return files
	})
}

// tarFile is one regular file of a tarball.
type tarFile struct {
	name    string
	content []byte
}

// rewriteTarFiles writes the tarball at path again with the regular files
// edit returns.
func rewriteTarFiles(t testing.TB, path string, edit func([]tarFile) []tarFile) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var files []tarFile
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			files = append(files, tarFile{h.Name, content})
		}
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	tw := tar.NewWriter(zw)
	for _, f := range edit(files) {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.content); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeBundleDir writes a directory bundle from file name to content.
func writeBundleDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// signedDefaultOptions builds the default bundle as deploy/ and the e2e
// nodes do (its modules without tests, .manifest, data.json with
// signedPlatform: demoBundle) as a tarball signed with a fresh key for
// scope "write", and returns the options a node opens it with: that key,
// the demo tenants as data file.
func signedDefaultOptions(t testing.TB) Options {
	t.Helper()
	dir := t.TempDir()
	kp := newKeyPair(t, dir, "node")
	src := demoBundle(t)
	tarball := filepath.Join(dir, "bundle.tar.gz")
	buildBundle(t, src, tarball, &kp, "node", "write")
	return Options{
		BundlePath: tarball, Keys: map[string]string{"node": kp.pubPath}, KeyID: "node", Scope: "write",
		DataPath: repoPath(t, "rego/examples/tenants.demo.json"), Logger: quietLogger(),
	}
}
