package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of a layer. Only what is set here reaches the tar:
// owner, mode and time are never read from the build host.
type File struct {
	// Path is slash-separated and relative to the image's root
	// ("usr/local/bin/bulkhead-webhook").
	Path string
	// Mode is the permission bits, with fs.ModeDir for a directory and
	// fs.ModeSymlink for a symbolic link.
	Mode fs.FileMode
	// UID and GID own the entry: 0, or 65532 for the webhook's nonroot.
	UID, GID int
	// Link is a symbolic link's target.
	Link string
	// Data is a regular file's content.
	Data []byte
	// ModTime is the entry's time: SOURCE_DATE_EPOCH for what Bulkhead
	// builds, the package's own time for what a .deb ships.
	ModTime time.Time
}

// layerTar writes files as one tar, reproducibly: entries sorted by path,
// missing parent directories added (0755, root, the child's time), PAX
// format without user or group names, access or change times.
func layerTar(files []File) ([]byte, error) {
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean(strings.TrimPrefix(f.Path, "/"))
		if p == "." || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("layer entry %q: not a path inside the image", f.Path)
		}
		f.Path = p
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("layer entry %q: given twice", p)
		}
		byPath[p] = f
	}
	for _, f := range files {
		for dir := path.Dir(path.Clean(strings.TrimPrefix(f.Path, "/"))); dir != "."; dir = path.Dir(dir) {
			if _, ok := byPath[dir]; !ok {
				byPath[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755, ModTime: f.ModTime}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := byPath[p]
		hdr := &tar.Header{
			Name:    p,
			Mode:    tarMode(f.Mode),
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: f.ModTime.UTC().Truncate(time.Second),
			Format:  tar.FormatPAX,
		}
		switch {
		case f.Mode.IsDir():
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case f.Mode&fs.ModeSymlink != 0:
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = f.Link
		case f.Mode.IsRegular():
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		default:
			return nil, fmt.Errorf("layer entry %q: mode %v is not a file, directory or symlink", p, f.Mode)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("layer entry %q: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("layer entry %q: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarMode is the tar header's mode: permission bits and the setuid,
// setgid and sticky bits in their Unix places.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// newLayer is an OCI layer (gzip) of files.
func newLayer(files []File) (v1.Layer, error) {
	b, err := layerTar(files)
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
