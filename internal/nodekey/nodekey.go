// Package nodekey loads the node key: the secret that authenticates what a
// node keeps on disk (the policy plan cache's entries, the sandbox records,
// each under a key of its own derived from it).
//
// Its invariant: the key file is the node's secret, so it is read only when
// it is a regular file owned by this process's uid, mode 0600 (closed to
// group and others), never a symbolic link, of Size to MaxSize bytes, in a
// directory that this uid owns and only it may write (who may write the
// directory may replace the key). When it does not exist it is created
// once, atomically: written whole beside the path and linked into place, so
// that a reader sees no key or all of it, and of two concurrent creators
// the first wins and both read its key.
package nodekey

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
)

// Bounds of the node key: the size of a key Load creates, the least and
// the most it reads.
const (
	Size    = 32
	MaxSize = 4096
)

// Options say what differs between the users of the node key.
type Options struct {
	// TempPattern names the temporary file a creator writes beside the
	// key (os.CreateTemp's pattern), so that one a crash leaves behind
	// says whose it is. Required.
	TempPattern string
	// CheckDir, when set, checks the key's directory further (its path
	// with symbolic links resolved), once it passed the checks of the
	// invariant and before the key is read or created; its error refuses
	// the key.
	CheckDir func(dir string) error
}

// Load returns the node key at path, creating it (Size random bytes, 0600)
// when it does not exist, under the package's invariant. Its errors name
// the key: "node key <path>: ...".
func Load(path string, opts Options) ([]byte, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("node key %q: must be an absolute path", path)
	}
	if opts.TempPattern == "" {
		return nil, fmt.Errorf("node key %s: Options.TempPattern is not set", path)
	}
	key, err := load(path, opts)
	if err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	return key, nil
}

func load(path string, opts Options) ([]byte, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	resolved, err := checkDir(dir)
	if err != nil {
		return nil, err
	}
	if opts.CheckDir != nil {
		if err := opts.CheckDir(resolved); err != nil {
			return nil, err
		}
	}
	key, err := read(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := create(path, opts.TempPattern); err != nil {
			return nil, fmt.Errorf("create: %w", err)
		}
		key, err = read(path)
	}
	return key, err
}

// checkDir refuses the key's directory dir, symbolic links resolved,
// unless it belongs to this process's user and is closed to writes from
// anyone else; it returns the resolved path.
func checkDir(dir string) (string, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return "", err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return "", fmt.Errorf("%s: not a directory", resolved)
	case st.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("key directory %s: mode %v: others may write it, and so replace the key", resolved, st.Mode().Perm())
	case !ok || int(sys.Uid) != os.Geteuid():
		return "", fmt.Errorf("key directory %s: not owned by uid %d", resolved, os.Geteuid())
	}
	return resolved, nil
}

// read reads the key file at path, refusing a symbolic link, a file of
// another user or one open to group or others, and a size out of bounds.
func read(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.Mode().IsRegular():
		return nil, errors.New("not a regular file")
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("mode %v: must be closed to group and others (0600)", st.Mode().Perm())
	case !ok || int(sys.Uid) != os.Geteuid():
		return nil, fmt.Errorf("not owned by uid %d", os.Geteuid())
	case st.Size() < Size || st.Size() > MaxSize:
		return nil, fmt.Errorf("%d bytes, want %d to %d", st.Size(), Size, MaxSize)
	}
	key := make([]byte, st.Size())
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, err
	}
	return key, nil
}

// create writes a fresh random key to path unless a key is there already
// (then the first creator won, and its key is the one to read).
func create(path, tmpPattern string) error {
	key := make([]byte, Size)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	if err := atomicfile.Create(path, tmpPattern, key, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}
