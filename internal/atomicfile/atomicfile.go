// Package atomicfile writes a file so that a reader (or a process that
// crashed mid-write and restarted) sees either its old content or its new
// one, never a part: the content goes to a temporary file beside it, is
// synced, then renamed over the path.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path with mode perm, atomically.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
