package policy

import (
	"context"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
	opts.PlanCacheDir = filepath.Join(t.TempDir(), "cache")
	if _, hit := openCached(t, opts); hit {
		t.Fatal("the first open hit an empty cache")
	}
	entries, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*"))
	if len(entries) != 1 {
		t.Fatalf("cache holds %v, want one entry", entries)
	}
	for path, want := range map[string]os.FileMode{opts.PlanCacheDir: 0o700, entries[0]: 0o600} {
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
		"entry of another format": {change: func(t *testing.T, _ *Options, entry string) {
			rewriteEntry(t, entry, func(ent *planCacheEntry) { ent.Format = "bulkhead-plan-cache/1" })
		}},
		"entry whose program is cut short, under a digest that matches": {change: func(t *testing.T, _ *Options, entry string) {
			rewriteEntry(t, entry, func(ent *planCacheEntry) { ent.Decision = ent.Decision[:len(ent.Decision)/2] })
		}},
		"entry whose data is not a value, under a digest that matches": {change: func(t *testing.T, _ *Options, entry string) {
			rewriteEntry(t, entry, func(ent *planCacheEntry) { ent.Data = []byte{0xff} })
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
			opts.PlanCacheDir = filepath.Join(t.TempDir(), "cache")
			openCached(t, opts)
			entries, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*"))
			if len(entries) != 1 {
				t.Fatalf("cache holds %v, want one entry", entries)
			}
			tc.change(t, &opts, entries[0])
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
// under a digest that matches.
func rewriteEntry(t *testing.T, path string, edit func(*planCacheEntry)) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ent, err := unmarshalPlanCacheEntry(raw)
	if err != nil {
		t.Fatal(err)
	}
	edit(ent)
	if raw, err = ent.marshal(); err != nil {
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

// FuzzPlanCacheEntry: whatever an entry holds under a digest that matches
// (what another build wrote, say), reading it is an error or a snapshot,
// never a panic; an entry whose digest does not match is never read. The
// seed is the default bundle's entry.
func FuzzPlanCacheEntry(f *testing.F) {
	opts := signedDefaultOptions(f)
	opts.PlanCacheDir = filepath.Join(f.TempDir(), "cache")
	e, err := Open(context.Background(), opts)
	if err != nil {
		f.Fatal(err)
	}
	e.Close()
	entries, _ := filepath.Glob(filepath.Join(opts.PlanCacheDir, "plan-*"))
	if len(entries) != 1 {
		f.Fatalf("cache holds %v, want one entry", entries)
	}
	raw, err := os.ReadFile(entries[0])
	if err != nil {
		f.Fatal(err)
	}
	ent, err := unmarshalPlanCacheEntry(raw)
	if err != nil {
		f.Fatal(err)
	}
	c := &planCache{key: ent.Key}
	f.Add(raw[sha256.Size:])
	f.Fuzz(func(t *testing.T, body []byte) {
		sum := sha256.Sum256(body)
		raw := append(sum[:], body...)
		_, _ = c.decode(raw)
		raw[0] ^= 1
		if _, err := c.decode(raw); err == nil {
			t.Fatal("an entry whose digest does not match was read")
		}
	})
}
