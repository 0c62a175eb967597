package image

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the layout's index that name the image on import:
// containerd takes the full name from the first, the OCI tag is the second.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// layoutTime is every entry's time in the archive: the archive is a
// container for blobs named by their digests, and its own entries must
// not vary either.
var layoutTime = time.Unix(0, 0).UTC()

// WriteArchive writes img as an OCI image layout in a tar at path
// (oci-layout, index.json naming ref, blobs/sha256/...), entries sorted,
// times and owners fixed. The file is replaced by rename.
func WriteArchive(path, ref string, img v1.Image) (err error) {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("archive %s: %w", path, err)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt,
			Size:      int64(len(manifest)),
			Digest:    digest,
			Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{
				annotationContainerdName: tag.Name(),
				annotationRefName:        tag.TagStr(),
			},
		}},
	})
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configDigest, err := img.ConfigName()
	if err != nil {
		return err
	}

	// Blobs by digest; a layer's content is read when it is written.
	type blob struct {
		size int64
		open func() (io.ReadCloser, error)
	}
	blobs := map[v1.Hash]blob{
		digest:       {int64(len(manifest)), bytesOpener(manifest)},
		configDigest: {int64(len(config)), bytesOpener(config)},
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		blobs[d] = blob{size, l.Compressed}
	}
	digests := make([]v1.Hash, 0, len(blobs))
	for d := range blobs {
		digests = append(digests, d)
	}
	sort.Slice(digests, func(i, j int) bool { return digests[i].String() < digests[j].String() })

	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	header := func(name string, typ byte, size int64, mode int64) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Size: size, Mode: mode, ModTime: layoutTime, Format: tar.FormatPAX})
	}
	write := func(name string, data []byte) error {
		if err := header(name, tar.TypeReg, int64(len(data)), 0o644); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := write("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := write("index.json", index); err != nil {
		return err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := header(dir, tar.TypeDir, 0, 0o755); err != nil {
			return err
		}
	}
	for _, d := range digests {
		b := blobs[d]
		if err := header("blobs/"+d.Algorithm+"/"+d.Hex, tar.TypeReg, b.size, 0o644); err != nil {
			return err
		}
		rc, err := b.open()
		if err != nil {
			return err
		}
		n, err := io.Copy(tw, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("blob %s: %w", d, err)
		}
		if n != b.size {
			return fmt.Errorf("blob %s: %d bytes, its descriptor says %d", d, n, b.size)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func bytesOpener(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}
