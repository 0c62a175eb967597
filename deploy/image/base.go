package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Base is the image every Bulkhead image starts from: one layer with
// busybox's applets (the installer's sh, cmp, sed, nsenter; the agent
// container's wait loop), the C library the agent's cgo build and NVML
// need, and a passwd with root and nonroot (65532).
type Base struct {
	// Image is the base image; its digest is what the lock pins.
	Image v1.Image
	// Created is its time, the newest of its files: the Debian packages'
	// own, never the build's.
	Created time.Time
	// Description names the packages, for the images' history.
	Description string
}

// Digest is the base image's manifest digest.
func (b Base) Digest() (v1.Hash, error) { return b.Image.Digest() }

// PATH is the images' search path.
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// NewBase makes the base image from files; created is the config's time.
func NewBase(files []File, created time.Time, description string) (Base, error) {
	layer, err := newLayer(files)
	if err != nil {
		return Base{}, fmt.Errorf("base layer: %w", err)
	}
	img, err := mutate.Append(ociEmpty(), mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: description,
			Comment:   "deploy/image/base.lock",
		},
	})
	if err != nil {
		return Base{}, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return Base{}, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: created}
	cfg.Config.Env = []string{"PATH=" + PATH}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return Base{}, err
	}
	return Base{Image: img, Created: created, Description: description}, nil
}

// ociEmpty is an empty image with OCI media types: what containerd and
// the OCI layout expect, where go-containerregistry defaults to Docker's.
func ociEmpty() v1.Image {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON)
}

// DebDir is where `make images` keeps the pinned .debs: TOOLS_DIR/debs,
// TOOLS_DIR being ~/.cache/bulkhead/tools unless set, as the Makefile has it.
func DebDir() string {
	if d := os.Getenv("TOOLS_DIR"); d != "" {
		return filepath.Join(d, "debs")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache/bulkhead/tools/debs")
}

// LoadBase makes the base from the lock's .debs in debDir (fetched with
// `apt-get download` when fetch is set and one is missing), each checked
// against its pinned sha256, and refuses a base whose digest is not the
// lock's.
func LoadBase(lock Lock, debDir string, fetch bool) (Base, error) {
	var files []File
	var names []string
	seen := map[string]bool{}
	for _, d := range lock.Debs {
		p := filepath.Join(debDir, d.FileName())
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) && fetch {
			if err := aptDownload(d, debDir); err != nil {
				return Base{}, err
			}
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return Base{}, fmt.Errorf("deb %s %s: %w (apt-get download %s=%s)", d.Package, d.Version, err, d.Package, d.Version)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != d.SHA256 {
			return Base{}, fmt.Errorf("deb %s: sha256 %s, the lock pins %s: not the pinned package", p, got, d.SHA256)
		}
		fs, err := debFiles(p)
		if err != nil {
			return Base{}, fmt.Errorf("deb %s: %w", p, err)
		}
		for _, f := range fs {
			if seen[f.Path] {
				if f.Mode.IsDir() {
					continue
				}
				return Base{}, fmt.Errorf("deb %s: %s is shipped by an earlier package too", p, f.Path)
			}
			seen[f.Path] = true
			files = append(files, f)
		}
		names = append(names, d.Package+" "+d.Version)
	}
	files, err := withApplets(files)
	if err != nil {
		return Base{}, err
	}
	created := newest(files)
	files = append(files, baseEtc(created)...)
	base, err := NewBase(files, created, "Debian "+strings.Join(names, ", "))
	if err != nil {
		return Base{}, err
	}
	digest, err := base.Digest()
	if err != nil {
		return Base{}, err
	}
	if err := checkBaseDigest(lock.BaseDigest, digest); err != nil {
		return Base{}, err
	}
	return base, nil
}

// checkBaseDigest refuses a base whose digest is not the pinned one.
func checkBaseDigest(pinned string, got v1.Hash) error {
	if pinned == got.String() {
		return nil
	}
	if pinned == "" {
		pinned = "none"
	}
	return fmt.Errorf("base image digest %s, the lock pins %s: the pinned .debs gave another base "+
		"(a change to deploy/image, or another Go release's gzip); if that is intended, set `base %s` in the lock", got, pinned, got)
}

func aptDownload(d Deb, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cmd := exec.Command("apt-get", "download", d.Package+":"+d.Arch+"="+d.Version)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s=%s: %v\n%s", d.Package, d.Version, err, out)
	}
	return nil
}

// debFiles is what a .deb installs, as dpkg-deb unpacks it, less its
// documentation (its copyright files stay), manual pages and gconv modules.
func debFiles(deb string) ([]File, error) {
	var stderr bytes.Buffer
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile: %v: %s", err, stderr.Bytes())
	}
	var files []File
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		p := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if p == "." || skipFromDeb(p) {
			continue
		}
		f := File{Path: p, ModTime: hdr.ModTime, Mode: fs.FileMode(hdr.Mode).Perm()}
		if hdr.Mode&0o1000 != 0 {
			f.Mode |= fs.ModeSticky
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			f.Mode |= fs.ModeDir
		case tar.TypeSymlink:
			f.Mode |= fs.ModeSymlink
			f.Link = hdr.Linkname
		case tar.TypeReg:
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s: tar type %q is not a file, directory or symlink", p, hdr.Typeflag)
		}
		files = append(files, f)
	}
	return files, nil
}

func skipFromDeb(p string) bool {
	switch {
	case strings.HasPrefix(p, "usr/share/doc/"):
		return path.Base(p) != "copyright" && strings.Count(p, "/") > 3
	case strings.HasPrefix(p, "usr/share/man/"), strings.HasPrefix(p, "usr/share/lintian/"),
		strings.HasPrefix(p, "usr/lib/x86_64-linux-gnu/gconv"):
		return true
	}
	return false
}

// withApplets adds a symlink to /bin/busybox for each of its applets, at
// the path `busybox --list-full` names, unless a package ships that path.
func withApplets(files []File) ([]File, error) {
	var bb *File
	have := map[string]bool{}
	for i := range files {
		have[files[i].Path] = true
		if files[i].Path == "bin/busybox" {
			bb = &files[i]
		}
	}
	if bb == nil {
		return nil, errors.New("base: no bin/busybox among the debs (busybox-static ships it)")
	}
	tmp, err := os.CreateTemp("", "busybox-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(bb.Data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o755)
	}
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(tmp.Name(), "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if have[applet] {
			continue
		}
		have[applet] = true
		files = append(files, File{Path: applet, Mode: fs.ModeSymlink | 0o777, Link: "/bin/busybox", ModTime: bb.ModTime})
	}
	return files, nil
}

func newest(files []File) time.Time {
	var t time.Time
	for _, f := range files {
		if f.ModTime.After(t) {
			t = f.ModTime
		}
	}
	return t.UTC()
}

// baseEtc is what no package of the base ships: the users the images run
// as, the resolver order Go and glibc read, a /tmp and root's home.
func baseEtc(t time.Time) []File {
	text := func(p, s string) File { return File{Path: p, Mode: 0o644, Data: []byte(s), ModTime: t} }
	return []File{
		text("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/false\n"),
		text("etc/group", "root:x:0:\nnonroot:x:65532:\n"),
		text("etc/nsswitch.conf", "hosts: files dns\n"),
		{Path: "tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777, ModTime: t},
		{Path: "root", Mode: fs.ModeDir | 0o700, ModTime: t},
		{Path: "home/nonroot", Mode: fs.ModeDir | 0o700, UID: 65532, GID: 65532, ModTime: t},
	}
}
