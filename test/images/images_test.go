package images

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func TestBuildWritesBothImages(t *testing.T) {
	if _, err := os.Stat(DefaultBusybox); err != nil {
		t.Skipf("needs Debian's busybox-static at %s: %v", DefaultBusybox, err)
	}
	out := filepath.Join(t.TempDir(), "images.tar")
	if err := Build(DefaultBusybox, out); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{PauseImage, WorkloadImage} {
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(out, &tag)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || len(cf.Config.Entrypoint) == 0 || cf.Config.Entrypoint[0] == "" {
			t.Errorf("%s: config %+v", ref, cf.Config)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: layers %d, %v", ref, len(layers), err)
		}
	}
	// Reproducible: a second build gives the same digests.
	out2 := filepath.Join(t.TempDir(), "images.tar")
	if err := Build(DefaultBusybox, out2); err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag(WorkloadImage)
	a, _ := tarball.ImageFromPath(out, &tag)
	b, _ := tarball.ImageFromPath(out2, &tag)
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digest changed between builds: %s vs %s", da, db)
	}
}

func TestBuildRefusesMissingBusybox(t *testing.T) {
	err := Build("/nonexistent/busybox", filepath.Join(t.TempDir(), "x.tar"))
	if err == nil {
		t.Fatal("expected an error for a missing busybox")
	}
}
