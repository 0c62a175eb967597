package policy

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVerifySignatureAgreesWithReader: what a plan cache hit checks
// (verifySignature) accepts a bundle exactly when readBundleFrom, OPA's
// reader with verification, does, for the signed default bundle and
// tampered copies of it.
func TestVerifySignatureAgreesWithReader(t *testing.T) {
	tests := map[string]struct {
		// tamper changes the signed tarball; opts may change too.
		tamper func(t *testing.T, opts *Options)
		valid  bool
	}{
		"signed": {tamper: func(*testing.T, *Options) {}, valid: true},
		"data.json reformatted (signed as canonical JSON)": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, "data.json", func(b []byte) []byte { return append([]byte(" \n"), b...) })
		}, valid: true},
		"module changed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, "runtime.rego", func(b []byte) []byte { return append(b, '\n') })
		}},
		"manifest changed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, ".manifest", func(b []byte) []byte { return bytes.Replace(b, []byte(`"revision":"`), []byte(`"revision":"x`), 1) })
		}},
		"data.json changed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, "data.json", func(b []byte) []byte {
				return bytes.Replace(b, []byte(`"allow_privileged":false`), []byte(`"allow_privileged":true`), 1)
			})
		}},
		"unsigned file added": {tamper: func(t *testing.T, opts *Options) {
			addToTar(t, opts.BundlePath, "/extra.rego", "package bulkhead.extra\n")
		}},
		"unsigned patch file added": {tamper: func(t *testing.T, opts *Options) {
			addToTar(t, opts.BundlePath, "/patch.json", `{"data": [{"op": "upsert", "path": "/x", "value": 1}]}`)
		}},
		"second signatures file": {tamper: func(t *testing.T, opts *Options) {
			raw := fileInTar(t, opts.BundlePath, ".signatures.json")
			addToTar(t, opts.BundlePath, "/sub/.signatures.json", string(raw))
		}},
		"signed file removed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, "runtime.rego", nil)
		}},
		"signatures file removed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, ".signatures.json", nil)
		}},
		"signature changed": {tamper: func(t *testing.T, opts *Options) {
			editTar(t, opts.BundlePath, ".signatures.json", func(b []byte) []byte {
				i := bytes.LastIndexByte(b, '"') - 5
				b[i] = map[bool]byte{true: 'A', false: 'B'}[b[i] != 'A']
				return b
			})
		}},
		"other scope": {tamper: func(t *testing.T, opts *Options) { opts.Scope = "another-cluster" }},
		"other key": {tamper: func(t *testing.T, opts *Options) {
			opts.Keys[opts.KeyID] = newKeyPair(t, t.TempDir(), "other").pubPath
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opts := signedDefaultOptions(t)
			tc.tamper(t, &opts)
			vc, err := opts.verificationConfig()
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(opts.BundlePath)
			if err != nil {
				t.Fatal(err)
			}
			_, _, readErr := readBundleFrom(opts.BundlePath, raw, vc, opts.bundleLimits())
			verifyErr := verifySignature(raw, vc, opts.bundleLimits())
			if (readErr == nil) != tc.valid || (verifyErr == nil) != tc.valid {
				t.Fatalf("OPA's reader: %v; verifySignature: %v; want valid %v", readErr, verifyErr, tc.valid)
			}
		})
	}
}

// editTar replaces the file of the tarball at path whose name ends in
// name by edit's result, or drops it when edit is nil.
func editTar(t *testing.T, path, name string, edit func([]byte) []byte) {
	t.Helper()
	found := false
	rewriteTarFiles(t, path, func(files []tarFile) []tarFile {
		var out []tarFile
		for _, f := range files {
			if filepath.Base(f.name) == name {
				found = true
				if edit == nil {
					continue
				}
				before := string(f.content)
				if f.content = edit(f.content); string(f.content) == before {
					t.Fatalf("editing %s changed nothing", f.name)
				}
			}
			out = append(out, f)
		}
		return out
	})
	if !found {
		t.Fatalf("%s holds no %s", path, name)
	}
}

// addToTar adds a file to the tarball at path.
func addToTar(t *testing.T, path, name, content string) {
	t.Helper()
	rewriteTarFiles(t, path, func(files []tarFile) []tarFile {
		return append(files, tarFile{name: name, content: []byte(content)})
	})
}

// fileInTar is the content of the file of the tarball at path whose name
// ends in name.
func fileInTar(t *testing.T, path, name string) []byte {
	t.Helper()
	var content []byte
	rewriteTarFiles(t, path, func(files []tarFile) []tarFile {
		for _, f := range files {
			if strings.HasSuffix(f.name, name) {
				content = f.content
			}
		}
		return files
	})
	return content
}

// FuzzVerifySignature: whatever archive a bundle file holds, the check a
// plan cache hit runs returns an error or accepts it, never panics, and
// never accepts what OPA's reader with verification refuses. The input is
// the archive's tar stream (gzipped here, so that mutations reach the tar
// and the files rather than die on the gzip checksum); the seed is the
// signed default bundle's.
func FuzzVerifySignature(f *testing.F) {
	opts := signedDefaultOptions(f)
	vc, err := opts.verificationConfig()
	if err != nil {
		f.Fatal(err)
	}
	raw, err := os.ReadFile(opts.BundlePath)
	if err != nil {
		f.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		f.Fatal(err)
	}
	tarStream, err := io.ReadAll(zr)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tarStream)
	lim := opts.bundleLimits()
	f.Fuzz(func(t *testing.T, tarStream []byte) {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(tarStream)
		zw.Close()
		if verifySignature(gz.Bytes(), vc, lim) != nil {
			return
		}
		if _, _, err := readBundleFrom(opts.BundlePath, gz.Bytes(), vc, lim); err != nil {
			t.Fatalf("verifySignature accepted an archive OPA's reader refuses: %v", err)
		}
	})
}
