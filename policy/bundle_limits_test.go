package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// bombTarball writes a .tar.gz of n files of size zero bytes each, plus a
// decision module: small on disk, n*size once inflated.
func bombTarball(t testing.TB, path string, n int, size int64) {
	t.Helper()
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(gz)
	add := func(name string, size int64, content []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if content != nil {
			if _, err := tw.Write(content); err != nil {
				t.Fatal(err)
			}
			return
		}
		zeros := make([]byte, 1<<20)
		for left := size; left > 0; left -= int64(len(zeros)) {
			if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("/decision.rego", 0, nil)
	mod := []byte("package bulkhead\ndecision := {}\n")
	add("/d.rego", int64(len(mod)), mod)
	for i := range n {
		add(fmt.Sprintf("/pad/%d/data.json", i), size, nil)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBundleBounds: a bundle past Options.MaxBundleBytes or MaxBundleFiles
// is refused before its signature is looked at, with an error naming the
// bound, and without holding what it inflates to.
func TestBundleBounds(t *testing.T) {
	dir := t.TempDir()
	ops := newKeyPair(t, dir, "ops")
	bomb := filepath.Join(dir, "bomb.tar.gz")
	bombTarball(t, bomb, 96, 1<<20) // 96 MiB of zeros, about 100 KB on disk
	many := filepath.Join(dir, "many.tar.gz")
	bombTarball(t, many, 40, 1)
	bigDir := writeBundleDir(t, map[string]string{"d.rego": "package bulkhead\ndecision := {}\n", "big.json": `{"x": "` + strings.Repeat("a", 4096) + `"}`})
	bigData := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(bigData, []byte(`{"bulkhead": {"tenants": {"a": "`+strings.Repeat("a", 8192)+`"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		opts        Options
		want        string
		maxAllocMiB uint64 // 0: not measured
	}{
		{name: "inflates past the default", opts: Options{BundlePath: bomb}, want: "inflates past MaxBundleBytes (33554432 bytes)", maxAllocMiB: 16},
		{name: "inflates past a configured bound", opts: Options{BundlePath: bomb, MaxBundleBytes: 1 << 20}, want: "inflates past MaxBundleBytes (1048576 bytes)"},
		{name: "compressed larger than the bound", opts: Options{BundlePath: bomb, MaxBundleBytes: 1 << 10}, want: "bomb.tar.gz is larger than MaxBundleBytes (1024 bytes)"},
		{name: "too many files", opts: Options{BundlePath: many, MaxBundleFiles: 10}, want: "more than MaxBundleFiles (10) files"},
		{name: "directory too large", opts: Options{BundlePath: bigDir, MaxBundleBytes: 1024}, want: "add up past MaxBundleBytes (1024 bytes)"},
		{name: "directory with too many files", opts: Options{BundlePath: bigDir, MaxBundleFiles: 1}, want: "more than MaxBundleFiles (1) files"},
		{name: "data file too large", opts: Options{BundlePath: bigDir, DataPath: bigData, MaxBundleBytes: 6000}, want: "tenants.json is larger than MaxBundleBytes (6000 bytes)"},
		{name: "within bounds", opts: Options{BundlePath: repoPath(t, "rego"), DataPath: repoPath(t, "rego/examples/tenants.demo.json")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quietLogger()
			signed := tc.opts
			signed.Keys, signed.KeyID, signed.Scope = map[string]string{"ops": ops.pubPath}, "ops", "cluster-a"
			for _, opts := range []Options{signed, withInsecure(tc.opts)} {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				e, err := Open(context.Background(), opts)
				runtime.ReadMemStats(&after)
				if tc.want == "" {
					if opts.InsecureSkipVerification && err != nil {
						t.Fatalf("Open: %v", err)
					}
					if e != nil {
						e.Close()
					}
					continue
				}
				if err == nil {
					e.Close()
					t.Fatalf("Open loaded the bundle; want %q", tc.want)
				}
				if !errors.Is(err, ErrBundleTooLarge) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "max_bundle_bytes") {
					t.Fatalf("Open: %v; want ErrBundleTooLarge with %q and the keys that set the bound", err, tc.want)
				}
				if got := (after.TotalAlloc - before.TotalAlloc) >> 20; tc.maxAllocMiB > 0 && got > tc.maxAllocMiB {
					t.Fatalf("refusing the bundle allocated %d MiB; want at most %d", got, tc.maxAllocMiB)
				}
			}
		})
	}
}

func withInsecure(o Options) Options {
	o.InsecureSkipVerification = true
	return o
}

func TestBundleBoundsValidation(t *testing.T) {
	dir := writeBundleDir(t, map[string]string{"d.rego": "package bulkhead\ndecision := {}\n"})
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{BundlePath: dir, InsecureSkipVerification: true, MaxBundleBytes: -1}, "MaxBundleBytes -1"},
		{Options{BundlePath: dir, InsecureSkipVerification: true, MaxBundleFiles: -2}, "MaxBundleFiles -2"},
	} {
		if _, err := Open(context.Background(), tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v) = %v; want %q", tc.opts, err, tc.want)
		}
	}
}
