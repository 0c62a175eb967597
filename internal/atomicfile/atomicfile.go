// Package atomicfile writes a file so that a reader (or a process that
// crashed mid-write and restarted) sees either its old content or its new
// one, never a part: the content goes to a temporary file beside it, is
// synced, then renamed over the path (Write) or linked to it when nothing
// is there yet (Create).
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path with mode perm, atomically, replacing what is
// there.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*", data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	return os.Rename(tmp, path)
}

// Create writes data to path with mode perm, atomically, unless something
// is at path already: then it leaves that in place and returns an error
// that errors.Is(err, fs.ErrExist) reports, so that of two concurrent
// creators the first wins and neither overwrites the other. tmpPattern
// names the temporary file beside path, as os.CreateTemp's pattern does.
func Create(path, tmpPattern string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(filepath.Dir(path), tmpPattern, data, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	return os.Link(tmp, path)
}

// writeTemp writes data with mode perm to a new file in dir named by
// pattern, synced and closed, and returns its name; on an error it leaves
// no file behind.
func writeTemp(dir, pattern string, data []byte, perm os.FileMode) (string, error) {
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	if err := fill(tmp, data, perm); err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return tmp.Name(), nil
}

// fill writes data to f, sets its mode to perm, syncs and closes it.
func fill(f *os.File, data []byte, perm os.FileMode) error {
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
