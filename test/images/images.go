// Package images builds Bulkhead's local container images from Debian's
// busybox-static, because no registry is reachable from a test node: a pause
// image for sandboxes and a workload image with busybox's applets.
//
// go-containerregistry writes the images: it is the well-kept library behind
// crane, ko and kaniko, builds images entirely in memory from a layer tar,
// and writes the docker-archive format that `ctr images import` reads.
package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// References of the images Build writes.
const (
	PauseImage    = "bulkhead.local/pause:v1"
	WorkloadImage = "bulkhead.local/busybox:v1"
)

// DefaultBusybox is where Debian's busybox-static installs the binary.
const DefaultBusybox = "/bin/busybox"

// epoch makes the images reproducible: the same busybox gives the same digests.
var epoch = time.Unix(0, 0).UTC()

// File is an extra file for the workload image.
type File struct {
	// Path is where the file lands in the image, e.g. "bin/netprobe".
	Path string
	// Source is the file on the host.
	Source string
}

// Build writes both images into one docker-archive tar at out; extras are
// added to both.
func Build(busybox, out string, extras ...File) error {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return fmt.Errorf("busybox %s: %w (install Debian's busybox-static)", busybox, err)
	}
	applets, err := listApplets(busybox)
	if err != nil {
		return err
	}
	layerTar, err := busyboxLayer(bin, applets, extras)
	if err != nil {
		return err
	}
	pause, err := image(layerTar, []string{"/bin/busybox", "sleep", "2147483647"})
	if err != nil {
		return fmt.Errorf("pause image: %w", err)
	}
	workload, err := image(layerTar, []string{"/bin/sh"})
	if err != nil {
		return fmt.Errorf("workload image: %w", err)
	}
	refs := map[name.Reference]v1.Image{}
	for ref, img := range map[string]v1.Image{PauseImage: pause, WorkloadImage: workload} {
		tag, err := name.NewTag(ref)
		if err != nil {
			return err
		}
		refs[tag] = img
	}
	return tarball.MultiRefWriteToFile(out, refs)
}

// listApplets asks busybox which applets it has.
func listApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox %s --list: %w", busybox, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	sort.Strings(applets)
	return applets, nil
}

// busyboxLayer is a root filesystem with /bin/busybox, a symlink per applet
// and the directories programs expect.
func busyboxLayer(bin []byte, applets []string, extras []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, dir := range []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/", "var/", "root/"} {
		mode := int64(0o755)
		if dir == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, a := range applets {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, x := range extras {
		data, err := os.ReadFile(x.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", x.Path, err)
		}
		name := strings.TrimPrefix(x.Path, "/")
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
		"etc/group":    "root:x:0:\nnobody:x:65534:\n",
		"etc/hosts":    "127.0.0.1 localhost\n",
		"etc/hostname": "bulkhead\n",
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(files[n])), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func image(layerTar []byte, entrypoint []string) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = runtime.GOARCH
	cf.OS = "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{"PATH=/bin"}
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}
