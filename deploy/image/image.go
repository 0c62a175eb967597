// Package image builds Bulkhead's three images without a container
// engine or a registry: bulkhead-webhook, bulkhead-node-agent and
// bulkhead-node-installer (`make images`, docs/release.md).
//
// The invariant: the same inputs give the same bytes. The inputs are the
// pinned Debian packages of the base layer (deploy/image/base.lock, by
// version and sha256, the base image by digest), the binaries (built with
// the pinned Go release and -trimpath, which Build checks), the version,
// commit and SOURCE_DATE_EPOCH. Nothing else is read: no clock, no file
// owner, mode or time of the build host, no map order. Layers are tars
// with sorted entries, fixed owners and modes, times from the packages or
// SOURCE_DATE_EPOCH; configs carry that time and OCI labels naming the
// version, commit, source and Go release.
//
// go-containerregistry assembles the images: the well-kept library behind
// crane, ko and kaniko, already used by test/images, that computes digests
// and manifests in memory from layer tars. Each image is written as an OCI
// image layout in a tar, which `ctr -n k8s.io images import` and `docker
// load` read.
package image

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Registry is the repository prefix of the images' names. No registry
// serves it: the archives are imported on the nodes (docs/release.md).
const Registry = "bulkhead.local"

// Source is the repository the images are built from (their
// org.opencontainers.image.source).
const Source = "https://github.com/bulkhead-runtime/bulkhead"

// The images.
const (
	Webhook   = "bulkhead-webhook"
	NodeAgent = "bulkhead-node-agent"
	Installer = "bulkhead-node-installer"
)

// HostBinaries are the binaries the installer copies to the host, where
// containerd runs them: they must run with whatever C library the host
// has, so each must be static or have its needs in host-needs.
var HostBinaries = []string{"containerd-shim-bulkhead-v1", "containerd-shim-bulkhead-runc-v1", "runsc", "runc"}

// Labels the images carry, beside org.opencontainers.image.*.
const (
	// LabelGoRelease is the Go release every Bulkhead binary was built with.
	LabelGoRelease = "dev.bulkhead.go.release"
)

// Spec is one image: what it adds to the base and how it runs.
type Spec struct {
	// Name is the image's name without registry or tag.
	Name string
	// Files is its layer over the base.
	Files []File
	// Entrypoint is the command the image runs.
	Entrypoint []string
	// User is "uid:gid".
	User string
}

// Meta is what every image says about its build.
type Meta struct {
	// Version is the release (`git describe --tags --always --dirty`),
	// also the images' tag.
	Version string
	// Revision is the commit.
	Revision string
	// Source is the repository's URL.
	Source string
	// GoRelease is the Go release the binaries were built with: Specs
	// refuses a binary of another.
	GoRelease string
	// Created is SOURCE_DATE_EPOCH: the commit's time.
	Created time.Time
}

func (m Meta) validate() error {
	var errs []error
	if m.Version == "" {
		errs = append(errs, errors.New("meta: Version is empty"))
	} else if _, err := name.NewTag(Registry + "/image:" + m.Version); err != nil {
		errs = append(errs, fmt.Errorf("meta: Version %q is not a valid image tag: %w", m.Version, err))
	}
	if m.Revision == "" {
		errs = append(errs, errors.New("meta: Revision is empty"))
	}
	if m.Source == "" {
		errs = append(errs, errors.New("meta: Source is empty"))
	}
	if !strings.HasPrefix(m.GoRelease, "go1.") {
		errs = append(errs, fmt.Errorf("meta: GoRelease %q is not a Go release (go1.N.M)", m.GoRelease))
	}
	if m.Created.IsZero() {
		errs = append(errs, errors.New("meta: Created is zero (SOURCE_DATE_EPOCH unset?)"))
	}
	return errors.Join(errs...)
}

// Ref is an image's full name, as the archive names it.
func (m Meta) Ref(image string) string { return Registry + "/" + image + ":" + m.Version }

// Labels are the labels (and manifest annotations) of image.
func (m Meta) Labels(image string, baseDigest v1.Hash) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       image,
		"org.opencontainers.image.version":     m.Version,
		"org.opencontainers.image.revision":    m.Revision,
		"org.opencontainers.image.source":      m.Source,
		"org.opencontainers.image.created":     m.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.base.digest": baseDigest.String(),
		LabelGoRelease:                         m.GoRelease,
	}
}

// Specs are the three images, from the binaries in binDir and the node
// installer script. Every binary must be a Go binary of meta.GoRelease;
// the host binaries' needs go into the installer image's host-needs.
func Specs(binDir, installScript string, meta Meta) ([]Spec, error) {
	t := meta.Created
	read := func(name string) ([]byte, error) {
		p := filepath.Join(binDir, name)
		rel, err := goRelease(p)
		if err != nil {
			return nil, err
		}
		if rel != meta.GoRelease {
			return nil, fmt.Errorf("%s: built with %s, the images need %s (GOTOOLCHAIN)", p, rel, meta.GoRelease)
		}
		return os.ReadFile(p)
	}
	exe := func(p string, data []byte) File { return File{Path: p, Mode: 0o755, Data: data, ModTime: t} }

	webhook, err := read("bulkhead-webhook")
	if err != nil {
		return nil, err
	}
	agent, err := read("bulkhead-agent")
	if err != nil {
		return nil, err
	}
	// The CLI beside the agent: `kubectl exec ... -c agent -- bulkhead node
	// status` shows an operator the node's state without a root login.
	cli, err := read("bulkhead")
	if err != nil {
		return nil, err
	}
	script, err := os.ReadFile(installScript)
	if err != nil {
		return nil, fmt.Errorf("installer script: %w", err)
	}
	installer := []File{exe("opt/bulkhead/installer/install.sh", script)}
	needs := map[string]Needs{}
	for _, b := range HostBinaries {
		data, err := read(b)
		if err != nil {
			return nil, err
		}
		if needs[b], err = ReadNeeds(filepath.Join(binDir, b)); err != nil {
			return nil, err
		}
		installer = append(installer, exe("opt/bulkhead/bin/"+b, data))
	}
	installer = append(installer, File{Path: "opt/bulkhead/bin/host-needs", Mode: 0o644, Data: hostNeedsFile(needs), ModTime: t})
	return []Spec{
		{
			Name:       Webhook,
			Files:      []File{exe("usr/local/bin/bulkhead-webhook", webhook)},
			Entrypoint: []string{"/usr/local/bin/bulkhead-webhook"},
			User:       "65532:65532",
		},
		{
			Name:       NodeAgent,
			Files:      []File{exe("usr/local/bin/bulkhead-agent", agent), exe("usr/local/bin/bulkhead", cli)},
			Entrypoint: []string{"/usr/local/bin/bulkhead-agent"},
			User:       "0:0",
		},
		{
			// The DaemonSet mounts deploy/node/install.sh from a ConfigMap
			// over the image's copy; the copy keeps the image usable alone.
			Name:       Installer,
			Files:      installer,
			Entrypoint: []string{"/bin/sh", "/opt/bulkhead/installer/install.sh"},
			User:       "0:0",
		},
	}, nil
}

// Build is the image of spec over base.
func Build(base Base, spec Spec, meta Meta) (v1.Image, error) {
	if err := meta.validate(); err != nil {
		return nil, err
	}
	baseDigest, err := base.Digest()
	if err != nil {
		return nil, err
	}
	layer, err := newLayer(spec.Files)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	img, err := mutate.Append(base.Image, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: meta.Created},
			CreatedBy: fmt.Sprintf("%s %s (make images)", spec.Name, meta.Version),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Created = v1.Time{Time: meta.Created}
	cfg.Config.Entrypoint = spec.Entrypoint
	cfg.Config.Cmd = nil
	cfg.Config.User = spec.User
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = meta.Labels(spec.Name, baseDigest)
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Name, err)
	}
	annotated, ok := mutate.Annotations(img, meta.Labels(spec.Name, baseDigest)).(v1.Image)
	if !ok {
		return nil, fmt.Errorf("%s: annotating the manifest", spec.Name)
	}
	return annotated, nil
}

// Options are the inputs of Run, `make images`' builder.
type Options struct {
	// Lock is deploy/image/base.lock.
	Lock string
	// DebDir holds the lock's .debs.
	DebDir string
	// Fetch runs `apt-get download` for a .deb missing from DebDir.
	Fetch bool
	// CheckBuildHost refuses a build host whose packages (the static
	// libraries runc links, the C compiler) are not the lock's.
	CheckBuildHost bool
	// BinDir holds the binaries (deploy/image/images.sh builds them).
	BinDir string
	// InstallScript is deploy/node/install.sh.
	InstallScript string
	// Out is the directory the archives are written to.
	Out string
	// Meta is what the images say about their build.
	Meta Meta
}

// Result is one image written.
type Result struct {
	// Name is the image's name, Ref its full name with tag.
	Name, Ref string
	// Digest is its manifest digest.
	Digest v1.Hash
	// Archive is the OCI layout tar it was written to.
	Archive string
}

// Run builds the three images into opts.Out, one OCI archive each, and a
// digests file naming each image's digest.
func Run(opts Options) ([]Result, error) {
	var errs []error
	for flag, v := range map[string]string{"Lock": opts.Lock, "DebDir": opts.DebDir, "BinDir": opts.BinDir, "InstallScript": opts.InstallScript, "Out": opts.Out} {
		if v == "" {
			errs = append(errs, fmt.Errorf("options: %s is empty", flag))
		}
	}
	errs = append(errs, opts.Meta.validate())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	lock, err := ReadLock(opts.Lock)
	if err != nil {
		return nil, err
	}
	if opts.CheckBuildHost {
		if err := CheckBuildHost(lock); err != nil {
			return nil, err
		}
	}
	base, err := LoadBase(lock, opts.DebDir, opts.Fetch)
	if err != nil {
		return nil, err
	}
	specs, err := Specs(opts.BinDir, opts.InstallScript, opts.Meta)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return nil, err
	}
	var results []Result
	var digests strings.Builder
	for _, spec := range specs {
		img, err := Build(base, spec, opts.Meta)
		if err != nil {
			return nil, err
		}
		r := Result{Name: spec.Name, Ref: opts.Meta.Ref(spec.Name), Archive: filepath.Join(opts.Out, spec.Name+".oci.tar")}
		if r.Digest, err = img.Digest(); err != nil {
			return nil, err
		}
		if err := WriteArchive(r.Archive, r.Ref, img); err != nil {
			return nil, err
		}
		results = append(results, r)
		fmt.Fprintf(&digests, "%s %s@%s\n", r.Name, r.Ref, r.Digest)
	}
	if err := os.WriteFile(filepath.Join(opts.Out, "digests.txt"), []byte(digests.String()), 0o644); err != nil {
		return nil, err
	}
	return results, nil
}

// CheckBuildHost compares the build host's packages with the lock's
// buildhost lines (dpkg-query).
func CheckBuildHost(lock Lock) error {
	var errs []error
	for _, p := range lock.BuildHost {
		out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", p.Package).Output()
		got := strings.TrimSpace(string(out))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("build host: %s %s is not installed (dpkg-query: %v)", p.Package, p.Version, err))
		case got != p.Version:
			errs = append(errs, fmt.Errorf("build host: %s is %s, the lock pins %s", p.Package, got, p.Version))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w\n(the binaries would differ from another build's: install the pinned versions, "+
			"or run with IMAGES_UNPINNED_BUILD_HOST=1 and expect other digests)", err)
	}
	return nil
}

// PrintResults writes one line an image: name, digest, archive.
func PrintResults(w io.Writer, results []Result) {
	for _, r := range results {
		fmt.Fprintf(w, "%-24s %s@%s  %s\n", r.Name, r.Ref, r.Digest, r.Archive)
	}
}
