package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// openCached opens opts and reports whether the bundle came from the plan
// cache.
func openCached(t *testing.T, opts Options) (*Engine, bool) {
	t.Helper()
	e, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e, e.active.Load().fromCache
}

// withPlanCache sets opts' plan cache directory and key in a fresh
// temporary directory, the key beside the cache as a node keeps it beside
// its ledger.
func withPlanCache(t testing.TB, opts *Options) {
	t.Helper()
	dir := t.TempDir()
	opts.PlanCacheDir = filepath.Join(dir, "cache")
	opts.PlanCacheKeyFile = filepath.Join(dir, "keys", "plan-cache.key")
}

// filledPlanCache is a closed engine of the signed default bundle whose open
// filled its plan cache, and the bytes of the cache's one entry.
func filledPlanCache(t testing.TB) (*Engine, []byte) {
	t.Helper()
	opts := signedDefaultOptions(t)
	withPlanCache(t, &opts)
	e, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	raw, err := os.ReadFile(onlyEntry(t, opts))
	if err != nil {
		t.Fatal(err)
	}
	return e, raw
}

// planCacheKey is the key opts' engine authenticates its entries with.
func planCacheKey(t testing.TB, opts Options) []byte {
	t.Helper()
	key, err := os.ReadFile(opts.PlanCacheKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// onlyEntry is the one entry of opts' plan cache.
func onlyEntry(t testing.TB, opts Options) string {
	t.Helper()
	entries, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*"))
	if len(entries) != 1 {
		t.Fatalf("cache holds %v, want one entry", entries)
	}
	return entries[0]
}

// sameDecision compares two decisions but for their ids.
func sameDecision(a, b Decision) bool {
	a.ID, b.ID = "", ""
	return reflect.DeepEqual(a, b)
}

// TestPlanCacheDecidesAsCompiled: the second open of a signed bundle reads
// the plan cache, and its decisions, its interpreter's answers and its
// decision log masks are those of the bundle compiled without a cache.
func TestPlanCacheDecidesAsCompiled(t *testing.T) {
	opts := signedDefaultOptions(t)
	compiled, _ := openCached(t, opts)
	withPlanCache(t, &opts)
	if _, hit := openCached(t, opts); hit {
		t.Fatal("the first open hit an empty cache")
	}
	entry := onlyEntry(t, opts)
	for path, want := range map[string]os.FileMode{
		opts.PlanCacheDir: 0o700, entry: 0o600, filepath.Dir(opts.PlanCacheKeyFile): 0o700, opts.PlanCacheKeyFile: 0o600,
	} {
		if st, err := os.Stat(path); err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: mode %v (%v), want %v", path, st.Mode().Perm(), err, want)
		}
	}
	cached, hit := openCached(t, opts)
	if !hit {
		t.Fatal("the second open did not read the cache")
	}
	if cached.Revision() != compiled.Revision() {
		t.Fatalf("revision %s from the cache, %s compiled", cached.Revision(), compiled.Revision())
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(16, 16))
	inputs := benchInputs()
	for range 300 {
		inputs = append(inputs, randomInput(r))
	}
	for i, in := range inputs {
		want, werr := compiled.Decide(ctx, in)
		got, gerr := cached.Decide(ctx, in)
		if (werr != nil) != (gerr != nil) || !sameDecision(got, want) {
			t.Fatalf("input %d: cached %+v (%v), compiled %+v (%v)", i, got, gerr, want, werr)
		}
		doc, err := toDoc(map[string]any{"input": in, "result": want})
		if err != nil {
			t.Fatal(err)
		}
		wm, werr := compiled.active.Load().maskValue(ctx, doc)
		gm, gerr := cached.active.Load().maskValue(ctx, doc)
		if (werr != nil) != (gerr != nil) || !reflect.DeepEqual(gm, wm) {
			t.Fatalf("input %d: mask cached %v (%v), compiled %v (%v)", i, gm, gerr, wm, werr)
		}
	}
	// Where a plan defers, OPA's interpreter decides: compiled from the
	// same bytes on first use, it answers as the compiled one does.
	snap := cached.active.Load()
	if snap.interp != nil {
		t.Fatal("a snapshot from the cache compiled its interpreter before it was needed")
	}
	for i, in := range inputs[:20] {
		want, werr := compiled.active.Load().evalTopdown(ctx, in.astValue())
		got, gerr := snap.evalTopdown(ctx, in.astValue())
		if (werr != nil) != (gerr != nil) || !sameValue(got, want) {
			t.Fatalf("input %d: interpreter from the cache %v (%v), compiled %v (%v)", i, got, gerr, want, werr)
		}
	}
}

// TestPlanCacheRefuses: what is not the verified bundle, or a cache that
// is not private, is never served from the cache.
func TestPlanCacheRefuses(t *testing.T) {
	tests := map[string]struct {
		// change alters the options, the bundle or the cache after an entry
		// was written for opts.
		change func(t *testing.T, opts *Options, entry string)
		// wantErr: Open must fail with this; empty: it must succeed
		// without reading the cache.
		wantErr string
	}{
		"tampered bundle": {change: func(t *testing.T, opts *Options, _ string) {
			rewriteTar(t, opts.BundlePath, func(name string, content []byte) []byte {
				if strings.HasSuffix(name, "runtime.rego") {
					return append(content, []byte("\n# tampered\n")...)
				}
				return content
			})
		}, wantErr: "digest mismatch"},
		"other scope": {change: func(t *testing.T, opts *Options, _ string) {
			opts.Scope = "another-cluster"
		}, wantErr: "scope"},
		"other data file": {change: func(t *testing.T, opts *Options, _ string) {
			p := filepath.Join(t.TempDir(), "tenants.json")
			if err := os.WriteFile(p, []byte(`{"bulkhead": {"tenants": {}}}`), 0o644); err != nil {
				t.Fatal(err)
			}
			opts.DataPath = p
		}},
		"entry readable by others": {change: func(t *testing.T, _ *Options, entry string) {
			if err := os.Chmod(entry, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		"directory writable by others": {change: func(t *testing.T, opts *Options, _ string) {
			if err := os.Chmod(opts.PlanCacheDir, 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		"entry is a symbolic link": {change: func(t *testing.T, _ *Options, entry string) {
			moved := entry + ".moved"
			if err := os.Rename(entry, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(moved, entry); err != nil {
				t.Fatal(err)
			}
		}},
		"truncated entry": {change: func(t *testing.T, _ *Options, entry string) {
			if err := os.Truncate(entry, 100); err != nil {
				t.Fatal(err)
			}
		}},
		"entry with a byte changed": {change: func(t *testing.T, _ *Options, entry string) {
			raw, err := os.ReadFile(entry)
			if err != nil {
				t.Fatal(err)
			}
			raw[len(raw)/2] ^= 0x40
			writeEntry(t, entry, raw)
		}},
		"entry of another format": {change: func(t *testing.T, opts *Options, entry string) {
			rewriteEntry(t, *opts, entry, func(ent *planCacheEntry) { ent.Format = "bulkhead-plan-cache/2" })
		}},
		"entry whose program is cut short, under a MAC that matches": {change: func(t *testing.T, opts *Options, entry string) {
			rewriteEntry(t, *opts, entry, func(ent *planCacheEntry) { ent.Decision = ent.Decision[:len(ent.Decision)/2] })
		}},
		"entry whose data is not a value, under a MAC that matches": {change: func(t *testing.T, opts *Options, entry string) {
			rewriteEntry(t, *opts, entry, func(ent *planCacheEntry) { ent.Data = []byte{0xff} })
		}},
		"entry under another node's key": {change: func(t *testing.T, opts *Options, entry string) {
			raw, err := os.ReadFile(entry)
			if err != nil {
				t.Fatal(err)
			}
			ent, err := unmarshalPlanCacheEntry(raw, planCacheKey(t, *opts))
			if err != nil {
				t.Fatal(err)
			}
			if raw, err = ent.marshal(bytes.Repeat([]byte{7}, planCacheKeySize)); err != nil {
				t.Fatal(err)
			}
			writeEntry(t, entry, raw)
		}},
		"key replaced": {change: func(t *testing.T, opts *Options, _ string) {
			if err := os.WriteFile(opts.PlanCacheKeyFile, bytes.Repeat([]byte{7}, planCacheKeySize), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		"entry of another bundle under this name": {change: func(t *testing.T, opts *Options, entry string) {
			other := *opts
			p := filepath.Join(t.TempDir(), "tenants.json")
			if err := os.WriteFile(p, []byte(`{"bulkhead": {"tenants": {}}}`), 0o644); err != nil {
				t.Fatal(err)
			}
			other.DataPath = p
			if _, err := Open(context.Background(), other); err != nil {
				t.Fatal(err)
			}
			matches, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*"))
			for _, m := range matches {
				if m != entry {
					if err := os.Rename(m, entry); err != nil {
						t.Fatal(err)
					}
				}
			}
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opts := signedDefaultOptions(t)
			withPlanCache(t, &opts)
			openCached(t, opts)
			tc.change(t, &opts, onlyEntry(t, opts))
			e, err := Open(context.Background(), opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer e.Close()
			if e.active.Load().fromCache {
				t.Fatal("served from the cache")
			}
		})
	}
}

// TestPlanCacheDirMustBeAbsolute: Options names the field.
func TestPlanCacheDirMustBeAbsolute(t *testing.T) {
	opts := signedDefaultOptions(t)
	opts.PlanCacheDir = "cache"
	if _, err := Open(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "Options.PlanCacheDir") {
		t.Fatalf("Open: %v, want an error naming Options.PlanCacheDir", err)
	}
}

// rewriteEntry changes the entry at path with edit and writes it back
// under a MAC that matches, as only a holder of opts' key can.
func rewriteEntry(t *testing.T, opts Options, path string, edit func(*planCacheEntry)) {
	t.Helper()
	key := planCacheKey(t, opts)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := unmarshalPlanCacheEntry(raw, key)
	if err != nil {
		t.Fatal(err)
	}
	edit(ent)
	if raw, err = ent.marshal(key); err != nil {
		t.Fatal(err)
	}
	writeEntry(t, path, raw)
}

func writeEntry(t *testing.T, path string, raw []byte) {
	t.Helper()
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// FuzzPlanCacheEntry: whatever an entry holds under a MAC that matches
// (what another build wrote, say), reading it is an error or a snapshot,
// never a panic; an entry whose MAC does not match is never read. The
// seed is the default bundle's entry.
func FuzzPlanCacheEntry(f *testing.F) {
	e, raw := filledPlanCache(f)
	key := planCacheKey(f, e.opts)
	ent, err := unmarshalPlanCacheEntry(raw, key)
	if err != nil {
		f.Fatal(err)
	}
	c := &planCache{key: ent.Key, secret: key}
	f.Add(raw[sha256.Size:])
	f.Fuzz(func(t *testing.T, body []byte) {
		raw := append(entryMAC(key, body), body...)
		_, _ = c.decode(raw)
		raw[0] ^= 1
		if _, err := c.decode(raw); err == nil {
			t.Fatal("an entry whose MAC does not match was read")
		}
	})
}

// untrustedHostPod is a privileged host-network pod of the untrusted tenant
// agents: the default bundle refuses it.
func untrustedHostPod() Input {
	in := agentPod()
	in.Request.GPU = nil
	in.Pod.HostNetwork = true
	in.Pod.Containers[0].Privileged = true
	return in
}

// permissiveEntry is the entry an attacker without the signing key can
// compile: opts' bundle with the untrusted tier opened to privileged
// host-network pods, loaded without verification, under the attacker's own
// plan cache key. It checks that this entry's engine admits
// untrustedHostPod.
func permissiveEntry(t *testing.T, opts Options) *planCacheEntry {
	t.Helper()
	evil := opts
	evil.BundlePath = filepath.Join(t.TempDir(), "evil.tar.gz")
	raw, err := os.ReadFile(opts.BundlePath)
	if err != nil {
		t.Fatal(err)
	}
	writeEntry(t, evil.BundlePath, raw)
	rewriteTar(t, evil.BundlePath, func(name string, content []byte) []byte {
		if !strings.HasSuffix(name, "data.json") {
			return content
		}
		var data map[string]any
		if err := json.Unmarshal(content, &data); err != nil {
			t.Fatal(err)
		}
		untrusted := data["bulkhead"].(map[string]any)["tiers"].(map[string]any)["untrusted"].(map[string]any)
		untrusted["allow_privileged"], untrusted["allow_host_namespaces"] = true, true
		if content, err = json.Marshal(data); err != nil {
			t.Fatal(err)
		}
		return content
	})
	evil.Keys, evil.KeyID, evil.Scope, evil.InsecureSkipVerification = nil, "", "", true
	withPlanCache(t, &evil)
	e, _ := openCached(t, evil)
	if d, err := e.Decide(context.Background(), untrustedHostPod()); err != nil || !d.Allow {
		t.Fatalf("the permissive bundle decided %+v (%v), want the pod admitted", d, err)
	}
	raw, err = os.ReadFile(onlyEntry(t, evil))
	if err != nil {
		t.Fatal(err)
	}
	ent, err := unmarshalPlanCacheEntry(raw, planCacheKey(t, evil))
	if err != nil {
		t.Fatal(err)
	}
	return ent
}

// logTo is a logger writing text lines to buf.
func logTo(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

// TestPlanCacheForgedEntryIsNotServed is the attack of issue 24 (hole 6):
// a writer of the state directory, who cannot read the node's plan cache
// key, replaces the entry of the signed bundle with the programs and data
// of a bundle that admits privileged host-network pods of the untrusted
// tier, keeping its name, format and revision, under the SHA-256 digest
// format 2 used (or an HMAC under a key of its own). The signed bundle
// still verifies; the next open must ignore the entry, say why, compile
// the bundle, refuse the pod and write an authentic entry back.
func TestPlanCacheForgedEntryIsNotServed(t *testing.T) {
	digests := map[string]func(body []byte) []byte{
		"SHA-256 as format 2": func(body []byte) []byte { sum := sha256.Sum256(body); return sum[:] },
		"HMAC under another key": func(body []byte) []byte {
			return entryMAC(bytes.Repeat([]byte{0}, planCacheKeySize), body)
		},
	}
	for name, digest := range digests {
		t.Run(name, func(t *testing.T) {
			opts := signedDefaultOptions(t)
			withPlanCache(t, &opts)
			first, _ := openCached(t, opts)
			ctx := context.Background()
			if d, err := first.Decide(ctx, untrustedHostPod()); err != nil || d.Allow {
				t.Fatalf("the signed bundle decided %+v (%v), want the pod refused", d, err)
			}
			entry := onlyEntry(t, opts)
			forged := permissiveEntry(t, opts)
			forged.Key = strings.TrimPrefix(filepath.Base(entry), "plan-")
			forged.Revision = first.Revision()
			raw, err := forged.marshal(nil)
			if err != nil {
				t.Fatal(err)
			}
			copy(raw, digest(raw[sha256.Size:]))
			writeEntry(t, entry, raw)

			var log bytes.Buffer
			opts.Logger = logTo(&log)
			e, hit := openCached(t, opts)
			d, err := e.Decide(ctx, untrustedHostPod())
			if hit || err != nil || d.Allow {
				t.Fatalf("after the forged entry: served from the cache %v, decided %+v (%v), want compiled and refused", hit, d, err)
			}
			if !strings.Contains(log.String(), "entry is not authentic") {
				t.Fatalf("the log does not say why the entry was not used:\n%s", log.String())
			}
			raw, err = os.ReadFile(entry)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := unmarshalPlanCacheEntry(raw, planCacheKey(t, opts)); err != nil {
				t.Fatalf("the forged entry was not written over: %v", err)
			}
		})
	}
}

// TestPlanCacheHitVerifiesSignature: even an entry that authenticates (its
// author holds the node's key) never stands in for the signature. The
// bundle is replaced by one that does not verify, and the entry of the
// signed bundle is put, authentic, under the replacement's name: the open
// must refuse the bundle, as it refuses it without a cache.
func TestPlanCacheHitVerifiesSignature(t *testing.T) {
	tests := map[string]struct {
		tamper  func(t *testing.T, opts Options)
		wantErr string
	}{
		"signature changed": {tamper: func(t *testing.T, opts Options) {
			rewriteTar(t, opts.BundlePath, func(name string, content []byte) []byte {
				if !strings.HasSuffix(name, ".signatures.json") {
					return content
				}
				var sigs struct {
					Signatures []string `json:"signatures"`
				}
				if err := json.Unmarshal(content, &sigs); err != nil || len(sigs.Signatures) != 1 {
					t.Fatalf("signatures %s (%v)", content, err)
				}
				jws := []byte(sigs.Signatures[0])
				i := len(jws) - 10 // inside the signature, base64url
				jws[i] = map[bool]byte{true: 'A', false: 'B'}[jws[i] != 'A']
				sigs.Signatures[0] = string(jws)
				out, _ := json.Marshal(sigs)
				return out
			})
		}, wantErr: "verify"},
		"module changed": {tamper: func(t *testing.T, opts Options) {
			rewriteTar(t, opts.BundlePath, func(name string, content []byte) []byte {
				if strings.HasSuffix(name, "workload.rego") {
					return append(content, []byte("\n# tampered\n")...)
				}
				return content
			})
		}, wantErr: "digest mismatch"},
		"signed by another key under the node's key id": {tamper: func(t *testing.T, opts Options) {
			dir := t.TempDir()
			kp := newKeyPair(t, dir, "attacker")
			src := filepath.Join(dir, "src")
			rewriteTar(t, opts.BundlePath, func(name string, content []byte) []byte {
				if !strings.HasSuffix(name, ".signatures.json") {
					p := filepath.Join(src, strings.TrimPrefix(name, "/"))
					if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(p, content, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				return content
			})
			buildBundle(t, src, opts.BundlePath, &kp, opts.KeyID, opts.Scope)
		}, wantErr: "verify"},
		"signature removed": {tamper: func(t *testing.T, opts Options) {
			rewriteTar(t, opts.BundlePath, func(name string, content []byte) []byte {
				if strings.HasSuffix(name, ".signatures.json") {
					return []byte(`{}`)
				}
				return content
			})
		}, wantErr: "signature"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opts := signedDefaultOptions(t)
			withPlanCache(t, &opts)
			openCached(t, opts)
			key := planCacheKey(t, opts)
			raw, err := os.ReadFile(onlyEntry(t, opts))
			if err != nil {
				t.Fatal(err)
			}
			ent, err := unmarshalPlanCacheEntry(raw, key)
			if err != nil {
				t.Fatal(err)
			}
			tc.tamper(t, opts)
			// The name the tampered bytes are cached under.
			e := &Engine{opts: opts, logger: quietLogger()}
			if e.vc, err = opts.verificationConfig(); err != nil {
				t.Fatal(err)
			}
			src, err := e.readSources()
			if err != nil {
				t.Fatal(err)
			}
			c := e.planCache(src)
			ent.Key = c.key
			if raw, err = ent.marshal(key); err != nil {
				t.Fatal(err)
			}
			writeEntry(t, c.path(), raw)

			e, err = Open(context.Background(), opts)
			if err == nil {
				e.Close()
				t.Fatalf("Open served the bundle (from the cache: %v), want it refused", e.active.Load().fromCache)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Open: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

// TestPlanCacheKey: the key is created when absent; a key in the cache
// directory is refused by Open, naming the field; a key that others may
// read or replace, or none, leaves the cache unused (logged), never
// trusted.
func TestPlanCacheKey(t *testing.T) {
	tests := map[string]struct {
		// prepare changes opts (cache and key in a fresh directory) before
		// the first open.
		prepare func(t *testing.T, opts *Options)
		// wantErr: Open must fail with this; empty: both opens succeed,
		// the second without the cache, and the log says why.
		wantErr string
	}{
		"no key file": {prepare: func(t *testing.T, opts *Options) {
			opts.PlanCacheKeyFile = ""
		}},
		"key inside the cache directory": {prepare: func(t *testing.T, opts *Options) {
			opts.PlanCacheKeyFile = filepath.Join(opts.PlanCacheDir, "keys", "plan-cache.key")
		}, wantErr: "Options.PlanCacheKeyFile"},
		"key directory is a link into the cache directory": {prepare: func(t *testing.T, opts *Options) {
			if err := os.MkdirAll(filepath.Join(opts.PlanCacheDir, "keys"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(opts.PlanCacheDir, "keys"), filepath.Dir(opts.PlanCacheKeyFile)); err != nil {
				t.Fatal(err)
			}
		}},
		"relative key path": {prepare: func(t *testing.T, opts *Options) {
			opts.PlanCacheKeyFile = "plan-cache.key"
		}, wantErr: "Options.PlanCacheKeyFile"},
		"key readable by the group": {prepare: func(t *testing.T, opts *Options) {
			writeKey(t, opts.PlanCacheKeyFile, bytes.Repeat([]byte{1}, planCacheKeySize), 0o640)
		}},
		"key readable by others": {prepare: func(t *testing.T, opts *Options) {
			writeKey(t, opts.PlanCacheKeyFile, bytes.Repeat([]byte{1}, planCacheKeySize), 0o604)
		}},
		"key directory writable by others": {prepare: func(t *testing.T, opts *Options) {
			writeKey(t, opts.PlanCacheKeyFile, bytes.Repeat([]byte{1}, planCacheKeySize), 0o600)
			if err := os.Chmod(filepath.Dir(opts.PlanCacheKeyFile), 0o777); err != nil {
				t.Fatal(err)
			}
		}},
		"key is a symbolic link": {prepare: func(t *testing.T, opts *Options) {
			other := filepath.Join(filepath.Dir(opts.PlanCacheKeyFile), "other.key")
			writeKey(t, other, bytes.Repeat([]byte{1}, planCacheKeySize), 0o600)
			if err := os.Symlink(other, opts.PlanCacheKeyFile); err != nil {
				t.Fatal(err)
			}
		}},
		"key too short": {prepare: func(t *testing.T, opts *Options) {
			writeKey(t, opts.PlanCacheKeyFile, []byte("secret"), 0o600)
		}},
		"key is a directory": {prepare: func(t *testing.T, opts *Options) {
			if err := os.MkdirAll(opts.PlanCacheKeyFile, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opts := signedDefaultOptions(t)
			withPlanCache(t, &opts)
			tc.prepare(t, &opts)
			var log bytes.Buffer
			opts.Logger = logTo(&log)
			for open := range 2 {
				e, err := Open(context.Background(), opts)
				if tc.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("Open: %v, want an error with %q", err, tc.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("open %d: %v", open, err)
				}
				e.Close()
				if e.active.Load().fromCache {
					t.Fatalf("open %d served from the cache", open)
				}
			}
			if entries, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*")); len(entries) != 0 {
				t.Fatalf("cache entries %v written without a usable key", entries)
			}
			if !strings.Contains(log.String(), "policy plan cache not used") {
				t.Fatalf("the log does not say why the cache was not used:\n%s", log.String())
			}
		})
	}
}

// TestPlanCacheKeyCreatedOnce: shims opening at once on a node without a
// key all end with the same key, whole.
func TestPlanCacheKeyCreatedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "keys", "plan-cache.key")
	const n = 8
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = loadPlanCacheKey(path, filepath.Join(dir, "cache")) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || len(keys[i]) != planCacheKeySize || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("opener %d: key %x (%v), opener 0: %x", i, keys[i], errs[i], keys[0])
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "keys", ".plan-cache-key-*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func writeKey(t *testing.T, path string, key []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, key, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// BenchmarkPlanCacheHit is what a shim's open spends on a plan cache hit
// beyond validating its options, before and after entries were
// authenticated (issue 24), in one run: "before" takes format 2's steps
// (fingerprint the files, read the bundle and the data file, name the
// entry, read it, check a SHA-256 digest of it, read its programs back),
// as Engine.load took them; "after" is the engine's
// hit as it is now: the same, plus reading the node's key, an HMAC in
// place of the digest, and the bundle's signature checked again
// (verifySignature, beside the read-back), and "verify" is that check
// alone. The three alternate within each iteration, so that a busy
// machine weighs on all alike; each reports its median wall time and its
// mean CPU time (the process's, so including the collector's) per open.
func BenchmarkPlanCacheHit(b *testing.B) {
	e, raw := filledPlanCache(b)
	opts := e.opts
	sum := sha256.Sum256(raw[sha256.Size:]) // the digest format 2 kept
	ctx := context.Background()
	steps := []struct {
		name string
		run  func() error
	}{
		{"before", func() error {
			_ = fingerprint(opts.BundlePath, opts.DataPath)
			src, err := e.readSources()
			if err != nil {
				return err
			}
			c := &planCache{dir: opts.PlanCacheDir, key: e.planCacheName(src), src: src}
			raw, err := c.read()
			if err != nil {
				return err
			}
			body := raw[sha256.Size:]
			if sha256.Sum256(body) != sum {
				return errors.New("digest mismatch")
			}
			ent, err := parsePlanCacheEntry(body)
			if err == nil {
				_, err = c.snapshotOf(ent)
			}
			return err
		}},
		{"after", func() error {
			snap, err := e.load(ctx)
			if err == nil && !snap.fromCache {
				err = errors.New("plan cache missed")
			}
			return err
		}},
		{"verify", func() error {
			src, err := e.readSources()
			if err == nil {
				err = verifySignature(src.raw, e.vc, opts.bundleLimits())
			}
			return err
		}},
	}
	wall := make([][]time.Duration, len(steps))
	cpu := make([]time.Duration, len(steps))
	for i := range b.N {
		for j := range steps {
			k := (i + j) % len(steps) // each goes first in turn
			cpu0, start := processCPU(), time.Now()
			if err := steps[k].run(); err != nil {
				b.Fatalf("%s: %v", steps[k].name, err)
			}
			wall[k] = append(wall[k], time.Since(start))
			cpu[k] += processCPU() - cpu0
		}
	}
	for k, step := range steps {
		slices.Sort(wall[k])
		b.ReportMetric(float64(wall[k][len(wall[k])/2].Microseconds())/1000, step.name+"-ms")
		b.ReportMetric(float64(cpu[k].Microseconds())/1000/float64(b.N), step.name+"-cpu-ms")
	}
}
