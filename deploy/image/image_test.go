package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func TestReadLock(t *testing.T) {
	const sum = "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744"
	for _, tc := range []struct {
		name, lock, wantErr string
	}{
		{name: "valid", lock: "# c\ndeb busybox-static 1:1.35.0-4 amd64 " + sum + "\nbuildhost gcc-12 12.2.0\nbase sha256:" + sum + "\n"},
		{name: "no deb", lock: "base sha256:" + sum + "\n", wantErr: "no deb"},
		{name: "short sha256", lock: "deb busybox-static 1 amd64 abc\n", wantErr: `sha256 "abc"`},
		{name: "missing field", lock: "deb busybox-static 1 " + sum + "\n", wantErr: "got 4 fields"},
		{name: "unknown directive", lock: "deb busybox-static 1 amd64 " + sum + "\nimage foo\n", wantErr: `unknown directive "image"`},
		{name: "base twice", lock: "deb b 1 amd64 " + sum + "\nbase sha256:" + sum + "\nbase sha256:" + sum + "\n", wantErr: "base given twice"},
		{name: "base not a digest", lock: "deb b 1 amd64 " + sum + "\nbase latest\n", wantErr: "want `base sha256:DIGEST`"},
		{name: "shell characters", lock: "deb b;rm 1 amd64 " + sum + "\n", wantErr: "unexpected characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "base.lock")
			if err := os.WriteFile(p, []byte(tc.lock), 0o644); err != nil {
				t.Fatal(err)
			}
			l, err := ReadLock(p)
			if tc.wantErr == "" {
				if err != nil || len(l.Debs) != 1 || l.Debs[0].FileName() != "busybox-static_1%3a1.35.0-4_amd64.deb" || l.BaseDigest != "sha256:"+sum {
					t.Fatalf("ReadLock = %+v, %v", l, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ReadLock error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestCheckedInLock reads deploy/image/base.lock: the build must be able to.
func TestCheckedInLock(t *testing.T) {
	l, err := ReadLock("base.lock")
	if err != nil {
		t.Fatal(err)
	}
	if l.BaseDigest == "" || !slices.ContainsFunc(l.Debs, func(d Deb) bool { return d.Package == "busybox-static" }) {
		t.Fatalf("base.lock: %+v: want busybox-static and a base digest", l)
	}
}

// TestLoadBaseMatchesLock builds the base from the pinned .debs, when they
// are in the tools cache, and checks the lock's digest is what they give.
func TestLoadBaseMatchesLock(t *testing.T) {
	debs := DebDir()
	l, err := ReadLock("base.lock")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range l.Debs {
		if _, err := os.Stat(filepath.Join(debs, d.FileName())); err != nil {
			t.Skipf("the pinned .debs are not in %s (make images fetches them): %v", debs, err)
		}
	}
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("no dpkg-deb: the .debs cannot be unpacked")
	}
	base, err := LoadBase(l, debs, false)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := base.Image.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("base layers: %d, %v", len(layers), err)
	}
	entries := layerEntries(t, layers[0])
	for p, want := range map[string]string{"bin/sh": "/bin/busybox", "usr/bin/nsenter": "/bin/busybox"} {
		if h := entries[p]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != want {
			t.Errorf("base: %s = %+v, want a symlink to %s", p, h, want)
		}
	}
	for _, p := range []string{"bin/busybox", "lib/x86_64-linux-gnu/libc.so.6", "etc/passwd", "tmp/"} {
		if entries[p] == nil {
			t.Errorf("base: no %s", p)
		}
	}
	// Another pin is refused, naming both digests.
	got, err := base.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkBaseDigest("sha256:"+strings.Repeat("0", 64), got); err == nil ||
		!strings.Contains(err.Error(), "base image digest "+got.String()+", the lock pins sha256:000") {
		t.Fatalf("another pinned digest: %v", err)
	}
	// So is a .deb that is not the pinned one.
	l.Debs[0].SHA256 = strings.Repeat("1", 64)
	if _, err := LoadBase(l, debs, false); err == nil || !strings.Contains(err.Error(), "not the pinned package") {
		t.Fatalf("LoadBase with another .deb sha256: %v", err)
	}
}

// testBinaries writes a small static Go binary of this test's Go release
// under the name of every binary the images carry: once for the package.
func testBinaries(t *testing.T) string {
	t.Helper()
	helloOnce.Do(func() { helloDir, helloErr = buildHello() })
	if errors.Is(helloErr, exec.ErrNotFound) {
		t.Skip("no go command on PATH: the test binary cannot be built")
	}
	if helloErr != nil {
		t.Fatal(helloErr)
	}
	return helloDir
}

var (
	helloOnce          sync.Once
	helloDir, helloTmp string
	helloErr           error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if helloTmp != "" {
		os.RemoveAll(helloTmp)
	}
	os.Exit(code)
}

func buildHello() (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	if helloTmp, err = os.MkdirTemp("", "bulkhead-image-test-"); err != nil {
		return "", err
	}
	hello := filepath.Join(helloTmp, "hello")
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", hello, "./testdata/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build testdata/hello: %v\n%s", err, out)
	}
	data, err := os.ReadFile(hello)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(helloTmp, "bin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	for _, name := range append([]string{"bulkhead-webhook", "bulkhead-agent", "bulkhead"}, HostBinaries...) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// testBase is a small base standing in for the Debian one.
func testBase(t *testing.T) Base {
	t.Helper()
	when := time.Date(2025, 4, 27, 8, 23, 0, 0, time.UTC)
	base, err := NewBase(append([]File{
		{Path: "bin/busybox", Mode: 0o755, Data: []byte("busybox"), ModTime: when},
		{Path: "bin/sh", Mode: fs.ModeSymlink | 0o777, Link: "/bin/busybox", ModTime: when},
	}, baseEtc(when)...), when, "test base")
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// build is one `make images` from the same inputs into a new directory:
// the digests and the archives' paths.
func build(t *testing.T, base Base, bin string, meta Meta) map[string]Result {
	t.Helper()
	specs, err := Specs(bin, "../node/install.sh", meta)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	results := map[string]Result{}
	for _, s := range specs {
		img, err := Build(base, s, meta)
		if err != nil {
			t.Fatal(err)
		}
		r := Result{Name: s.Name, Ref: meta.Ref(s.Name), Archive: filepath.Join(out, s.Name+".oci.tar")}
		if r.Digest, err = img.Digest(); err != nil {
			t.Fatal(err)
		}
		if err := WriteArchive(r.Archive, r.Ref, img); err != nil {
			t.Fatal(err)
		}
		results[s.Name] = r
	}
	return results
}

func testMeta() Meta {
	return Meta{
		Version:   "v0.9.0-3-gabcdef0",
		Revision:  "abcdef0123456789abcdef0123456789abcdef01",
		Source:    Source,
		GoRelease: runtime.Version(),
		Created:   time.Unix(1764800000, 0).UTC(),
	}
}

// TestImagesReproducible builds the three images twice, into two
// directories, from the same inputs: same digests, same archive bytes.
// Then it reads each archive as `ctr images import` would and checks the
// labels, the entrypoint and the layers' owners, modes and times.
func TestImagesReproducible(t *testing.T) {
	bin := testBinaries(t)
	base := testBase(t)
	meta := testMeta()
	first, second := build(t, base, bin, meta), build(t, base, bin, meta)
	if len(first) != 3 {
		t.Fatalf("%d images, want 3", len(first))
	}
	for name, a := range first {
		b := second[name]
		if a.Digest != b.Digest {
			t.Errorf("%s: digest %s, then %s from the same inputs", name, a.Digest, b.Digest)
		}
		da, _ := os.ReadFile(a.Archive)
		db, _ := os.ReadFile(b.Archive)
		if !bytes.Equal(da, db) {
			t.Errorf("%s: the two archives differ", name)
		}
	}
	baseDigest, err := base.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, user, entrypoint string
		files                  []string
	}{
		{Webhook, "65532:65532", "/usr/local/bin/bulkhead-webhook", []string{"usr/local/bin/bulkhead-webhook"}},
		{NodeAgent, "0:0", "/usr/local/bin/bulkhead-agent", []string{"usr/local/bin/bulkhead-agent", "usr/local/bin/bulkhead"}},
		{Installer, "0:0", "/bin/sh", []string{
			"opt/bulkhead/installer/install.sh", "opt/bulkhead/bin/host-needs", "opt/bulkhead/bin/runc",
			"opt/bulkhead/bin/runsc", "opt/bulkhead/bin/containerd-shim-bulkhead-v1", "opt/bulkhead/bin/containerd-shim-bulkhead-runc-v1",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := first[tc.name]
			layout := readArchive(t, r.Archive)
			if layout.digest != r.Digest || layout.name != Registry+"/"+tc.name+":"+meta.Version {
				t.Fatalf("index.json: %s named %q, want %s named %s", layout.digest, layout.name, r.Digest, meta.Ref(tc.name))
			}
			cf := layout.config
			want := map[string]string{
				"org.opencontainers.image.version":     meta.Version,
				"org.opencontainers.image.revision":    meta.Revision,
				"org.opencontainers.image.source":      meta.Source,
				"org.opencontainers.image.created":     "2025-12-03T22:13:20Z",
				"org.opencontainers.image.title":       tc.name,
				"org.opencontainers.image.base.digest": baseDigest.String(),
				LabelGoRelease:                         runtime.Version(),
			}
			for k, v := range want {
				if cf.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
				}
				if layout.manifest.Annotations[k] != v {
					t.Errorf("manifest annotation %s = %q, want %q", k, layout.manifest.Annotations[k], v)
				}
			}
			if !cf.Created.Equal(meta.Created) || cf.Config.User != tc.user || len(cf.Config.Entrypoint) == 0 || cf.Config.Entrypoint[0] != tc.entrypoint {
				t.Errorf("config: created %v, user %q, entrypoint %q", cf.Created, cf.Config.User, cf.Config.Entrypoint)
			}
			if cf.OS != "linux" || cf.Architecture != "amd64" || len(cf.RootFS.DiffIDs) != 2 {
				t.Errorf("config: %s/%s, %d layers, want linux/amd64 and 2", cf.OS, cf.Architecture, len(cf.RootFS.DiffIDs))
			}
			if len(layout.layers) != 2 || layout.layers[0] != baseLayerDigest(t, base) {
				t.Fatalf("layers %v: want the base's then the image's", layout.layers)
			}
			entries := layout.top
			for _, p := range tc.files {
				h := entries[p]
				if h == nil {
					t.Errorf("no %s in the image's layer", p)
					continue
				}
				if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || !h.ModTime.Equal(meta.Created) {
					t.Errorf("%s: uid %d gid %d uname %q time %v, want root and %v", p, h.Uid, h.Gid, h.Uname, h.ModTime, meta.Created)
				}
			}
			names := layout.topOrder
			if !slices.IsSorted(names) {
				t.Errorf("layer entries not sorted: %v", names)
			}
		})
	}
	// The installer image says what its host binaries need: nothing.
	specs, err := Specs(bin, "../node/install.sh", meta)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range specs[2].Files {
		if f.Path == "opt/bulkhead/bin/host-needs" {
			for _, b := range HostBinaries {
				if !strings.Contains(string(f.Data), "\n"+b+" static\n") {
					t.Errorf("host-needs does not say %s is static:\n%s", b, f.Data)
				}
			}
		}
	}
}

func TestBuildRefusesAnotherGoRelease(t *testing.T) {
	bin := testBinaries(t)
	meta := testMeta()
	meta.GoRelease = "go1.20.1"
	_, err := Specs(bin, "../node/install.sh", meta)
	if err == nil || !strings.Contains(err.Error(), "built with "+runtime.Version()+", the images need go1.20.1") {
		t.Fatalf("Specs with another Go release: %v", err)
	}
	meta = testMeta()
	meta.Version = "v1 with spaces"
	if _, err := Build(testBase(t), Spec{Name: Webhook}, meta); err == nil || !strings.Contains(err.Error(), "not a valid image tag") {
		t.Fatalf("Build with a bad version: %v", err)
	}
}

func TestReadNeeds(t *testing.T) {
	bin := testBinaries(t)
	n, err := ReadNeeds(filepath.Join(bin, "runc"))
	if err != nil || !n.Static {
		t.Fatalf("a CGO_ENABLED=0 Go binary: %+v, %v; want static", n, err)
	}
	ls := "/bin/ls"
	n, err = ReadNeeds(ls)
	if err != nil {
		t.Skipf("no dynamically linked %s to read: %v", ls, err)
	}
	if n.Static || !slices.ContainsFunc(n.Libraries["libc.so.6"], func(v string) bool { return strings.HasPrefix(v, "GLIBC_2.") }) {
		t.Fatalf("%s: %+v, want libc.so.6 with GLIBC_2.x versions", ls, n)
	}
	got := string(hostNeedsFile(map[string]Needs{"runc": n, "runsc": {Static: true}}))
	if !strings.Contains(got, "\nrunc needs libc.so.6 GLIBC_2.") || !strings.Contains(got, "\nrunsc static\n") {
		t.Fatalf("host-needs:\n%s", got)
	}
}

// TestInstallerChecksHostNeeds runs deploy/node/install.sh against a fake
// host whose libraries do or do not meet host-needs.
func TestInstallerChecksHostNeeds(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh on PATH")
	}
	for _, tc := range []struct {
		name, needs, wantErr string
		hostLibc             string // the host's libc.so.6, "" for none
	}{
		{name: "all static", needs: "runc static\nrunsc static\n", hostLibc: ""},
		{name: "glibc present", needs: "runc needs libc.so.6 GLIBC_2.2.5 GLIBC_2.34\n", hostLibc: "x\x00GLIBC_2.2.5\x00GLIBC_2.34\x00y"},
		{name: "glibc too old", needs: "runc needs libc.so.6 GLIBC_2.2.5 GLIBC_2.34\n", hostLibc: "x\x00GLIBC_2.2.5\x00GLIBC_2.3\x00", wantErr: "runc needs GLIBC_2.34 of libc.so.6; the host's /lib/x86_64-linux-gnu/libc-2.36.so lacks it"},
		{name: "libseccomp missing", needs: "runc needs libseccomp.so.2\n", hostLibc: "x", wantErr: "runc needs libseccomp.so.2, which the host lacks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, src := t.TempDir(), t.TempDir()
			write := func(p, content string) {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, b := range HostBinaries {
				write(filepath.Join(src, "bin", b), "#!/bin/true\n")
			}
			write(filepath.Join(src, "bin/host-needs"), "# test\n"+tc.needs)
			write(filepath.Join(src, "policy/bundle.tar.gz"), "bundle")
			write(filepath.Join(src, "policy-key/bundle.pem"), "key")
			if tc.hostLibc != "" {
				// As on Debian: a relative symlink to the real file.
				write(filepath.Join(host, "lib/x86_64-linux-gnu/libc-2.36.so"), tc.hostLibc)
				if err := os.Symlink("libc-2.36.so", filepath.Join(host, "lib/x86_64-linux-gnu/libc.so.6")); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("sh", "../node/install.sh", "once")
			cmd.Env = append(os.Environ(),
				"HOST_ROOT="+host,
				"BIN_SRC="+filepath.Join(src, "bin"),
				"CONFIG_SRC=../node/config.toml",
				"POLICY_SRC="+filepath.Join(src, "policy"),
				"POLICY_KEY_SRC="+filepath.Join(src, "policy-key"),
				"RESTART_CONTAINERD=",
				"CONTAINERD_VERSION_CMD=echo containerd v2.1.5",
				"READY_FILE="+filepath.Join(src, "ready"),
			)
			out, err := cmd.CombinedOutput()
			_, statErr := os.Stat(filepath.Join(host, "usr/local/bin/runsc"))
			if tc.wantErr == "" {
				if err != nil || statErr != nil {
					t.Fatalf("install.sh: %v, runsc installed: %v\n%s", err, statErr, out)
				}
				return
			}
			if err == nil || !strings.Contains(string(out), tc.wantErr) {
				t.Fatalf("install.sh: %v, want a failure saying %q\n%s", err, tc.wantErr, out)
			}
			if statErr == nil {
				t.Errorf("install.sh copied runsc to a host it refused")
			}
		})
	}
}

// archive is what readArchive found in an OCI layout tar.
type archive struct {
	digest   v1.Hash
	name     string
	manifest *v1.Manifest
	config   *v1.ConfigFile
	layers   []v1.Hash
	top      map[string]*tar.Header // the image's own (last) layer
	topOrder []string
}

// readArchive checks an archive's layout: oci-layout, an index.json with
// one OCI manifest named for containerd, every blob present under its
// digest with the size its descriptor gives, and reads it back.
func readArchive(t *testing.T, path string) archive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout = %q", files["oci-layout"])
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("index.json: %v", err)
	}
	if index.SchemaVersion != 2 || index.MediaType != types.OCIImageIndex || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %s", files["index.json"])
	}
	blob := func(d v1.Descriptor) []byte {
		b, ok := files["blobs/sha256/"+d.Digest.Hex]
		sum := sha256.Sum256(b)
		if !ok || int64(len(b)) != d.Size || hex.EncodeToString(sum[:]) != d.Digest.Hex {
			t.Fatalf("blob %s (%s): present %v, %d bytes of %d", d.Digest, d.MediaType, ok, len(b), d.Size)
		}
		return b
	}
	md := index.Manifests[0]
	a := archive{digest: md.Digest, name: md.Annotations[annotationContainerdName]}
	if md.MediaType != types.OCIManifestSchema1 || md.Annotations[annotationRefName] == "" {
		t.Fatalf("index manifest descriptor: %+v", md)
	}
	if err := json.Unmarshal(blob(md), &a.manifest); err != nil {
		t.Fatal(err)
	}
	if a.manifest.Config.MediaType != types.OCIConfigJSON {
		t.Fatalf("config media type %s", a.manifest.Config.MediaType)
	}
	if err := json.Unmarshal(blob(a.manifest.Config), &a.config); err != nil {
		t.Fatal(err)
	}
	for i, l := range a.manifest.Layers {
		if l.MediaType != types.OCILayer {
			t.Fatalf("layer %s: media type %s", l.Digest, l.MediaType)
		}
		b := blob(l)
		a.layers = append(a.layers, l.Digest)
		if i == len(a.manifest.Layers)-1 {
			a.top, a.topOrder = tarEntries(t, b)
		}
	}
	return a
}

func tarEntries(t *testing.T, gz []byte) (map[string]*tar.Header, []string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries, order
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name], order = h, append(order, h.Name)
	}
}

func layerEntries(t *testing.T, l v1.Layer) map[string]*tar.Header {
	t.Helper()
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := tarEntries(t, b)
	return entries
}

func baseLayerDigest(t *testing.T, b Base) v1.Hash {
	t.Helper()
	layers, err := b.Image.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("base layers: %d, %v", len(layers), err)
	}
	d, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestArchivesImportIntoContainerd imports the three archives with `ctr
// -n k8s.io images import` into a scratch containerd (root; containerd
// and ctr on PATH, as make test puts TOOLS_DIR/bin): each must come out
// under its name with the digest the build printed.
func TestArchivesImportIntoContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a scratch containerd")
	}
	containerd, err1 := exec.LookPath("containerd")
	ctr, err2 := exec.LookPath("ctr")
	if err1 != nil || err2 != nil {
		t.Skip("needs containerd and ctr on PATH (make tools-node)")
	}
	meta := testMeta()
	results := build(t, testBase(t), testBinaries(t), meta)
	dir, err := os.MkdirTemp("", "bulkhead-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "containerd.sock")
	config := `version = 3
root = "` + dir + `/root"
state = "` + dir + `/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri"]
[grpc]
  address = "` + sock + `"
[ttrpc]
  address = "` + sock + `.ttrpc"
`
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	daemon := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	daemon.Stdout, daemon.Stderr = &log, &log
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = daemon.Process.Kill(); _ = daemon.Wait() }()
	run := func(args ...string) (string, error) {
		out, err := exec.Command(ctr, append([]string{"-a", sock, "-n", "k8s.io"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// containerd is ready when ctr gets an answer: polled, not timed.
	for i := 0; ; i++ {
		if _, err := run("version"); err == nil {
			break
		} else if i == 300 {
			t.Fatalf("scratch containerd does not answer: %v\n%s", err, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, r := range results {
		if out, err := run("images", "import", r.Archive); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", r.Archive, err, out)
		}
	}
	out, err := run("images", "ls")
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	for _, r := range results {
		if !slices.ContainsFunc(strings.Split(out, "\n"), func(line string) bool {
			f := strings.Fields(line)
			return len(f) > 2 && f[0] == r.Ref && f[2] == r.Digest.String()
		}) {
			t.Errorf("after import, no %s with digest %s:\n%s", r.Ref, r.Digest, out)
		}
	}
}
