package cluster

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/deploy/image"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// ImageTag is the tag of the images the test builds: the overlay points
// deploy/'s image names at Registry/NAME:ImageTag, as docs/release.md tells
// an operator to point them at a release's.
const ImageTag = "test-cluster"

// builtImage is one of deploy/image's images written as an OCI archive.
type builtImage struct {
	// Name is the name deploy/ uses (bulkhead-webhook), Ref the archive's
	// (bulkhead.local/bulkhead-webhook:test-cluster): Repository and Tag.
	Name, Ref, Repository, Tag string
	// Archive is the OCI layout tar `ctr images import` reads.
	Archive string
}

// buildImages builds the named images of deploy/image (`make images`' specs
// on its pinned Debian base, deploy/image/base.lock) around the binaries this
// test runs, into dir, one OCI archive each. The .debs of the base are read
// from TOOLS_DIR/debs (`make images` fetches them there; a missing one is
// fetched the same way). The images carry the binaries of `make build`, not
// `make images`' own static builds: what runs in the cluster is then the
// code under test, and the base has the C library a cgo build needs.
func buildImages(repo, dir string, names ...string) ([]builtImage, error) {
	bins, err := imageBinaries(filepath.Join(dir, "bin"))
	if err != nil {
		return nil, err
	}
	webhook := filepath.Join(bins, "bulkhead-webhook")
	bi, err := buildinfo.ReadFile(webhook)
	if err != nil {
		return nil, fmt.Errorf("images: %s: %w", webhook, err)
	}
	revision := "unknown"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	lock, err := image.ReadLock(filepath.Join(repo, "deploy/image/base.lock"))
	if err != nil {
		return nil, err
	}
	base, err := image.LoadBase(lock, image.DebDir(), true)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	meta := image.Meta{
		Version: ImageTag, Revision: revision, Source: image.Source,
		GoRelease: bi.GoVersion, Created: base.Created,
	}
	specs, err := image.Specs(bins, filepath.Join(repo, "deploy/node/install.sh"), meta)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	var out []builtImage
	for _, name := range names {
		var spec *image.Spec
		for i := range specs {
			if specs[i].Name == name {
				spec = &specs[i]
			}
		}
		if spec == nil {
			return nil, fmt.Errorf("images: deploy/image has no image %q", name)
		}
		img, err := image.Build(base, *spec, meta)
		if err != nil {
			return nil, err
		}
		b := builtImage{
			Name: name, Ref: meta.Ref(name), Repository: image.Registry + "/" + name, Tag: meta.Version,
			Archive: filepath.Join(dir, name+".oci.tar"),
		}
		if err := image.WriteArchive(b.Archive, b.Ref, img); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// imageBinaries links the binaries deploy/image's specs read into dir: the
// webhook and shims of `make build`, its mock-GPU agent and CLI (the nodes'
// mock GPUs need them), runsc and runc of `make tools`.
func imageBinaries(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	agent, err := node.AgentPath(node.BinDirs())
	if err != nil {
		return "", err
	}
	// The CLI of the same build, beside the agent.
	paths := map[string]string{"bulkhead-agent": agent, "bulkhead": filepath.Join(filepath.Dir(agent), "bulkhead")}
	for _, b := range append([]string{"bulkhead-webhook"}, image.HostBinaries...) {
		p, err := node.LookPath(b)
		if err != nil {
			return "", fmt.Errorf("images: needs %s (make build tools)", b)
		}
		paths[b] = p
	}
	for name, p := range paths {
		if err := os.Symlink(p, filepath.Join(dir, name)); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// importImage imports b into the node's containerd (namespace k8s.io, the
// CRI's) with ctr, as docs/release.md tells an operator, and returns once
// the CRI plugin knows it: a pod created before would try to pull it.
func importImage(ctx context.Context, w *Worker, b builtImage) error {
	ctr, err := node.LookPath("ctr")
	if err != nil {
		return fmt.Errorf("images: needs ctr (make tools)")
	}
	if out, err := exec.CommandContext(ctx, ctr, "--address", w.Node.Socket, "-n", "k8s.io", "images", "import", b.Archive).CombinedOutput(); err != nil {
		return fmt.Errorf("node %s: ctr images import %s: %v\n%s", w.Name, b.Archive, err, out)
	}
	return waitFor(ctx, nil, "image "+b.Ref+" on node "+w.Name, 30*time.Second, func(ctx context.Context) error {
		st, err := w.Node.Images.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: b.Ref}})
		if err != nil {
			return err
		}
		if st.GetImage() == nil {
			return fmt.Errorf("not seen by the CRI plugin")
		}
		return nil
	})
}
