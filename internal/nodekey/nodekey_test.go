package nodekey

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestLoadRefuses: a key that breaks the invariant is refused, named, and
// left as it was (never replaced by a fresh one).
func TestLoadRefuses(t *testing.T) {
	tests := map[string]struct {
		// prepare lays out the key at path (its directory exists, 0700).
		prepare func(t *testing.T, path string)
		// opts: nil loads with the options a caller would pass.
		opts    *Options
		wantErr string
	}{
		"symbolic link": {prepare: func(t *testing.T, path string) {
			other := filepath.Join(filepath.Dir(path), "other.key")
			writeKey(t, other, bytes.Repeat([]byte{1}, Size), 0o600)
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "symbolic link"},
		"mode 0644": {prepare: func(t *testing.T, path string) {
			writeKey(t, path, bytes.Repeat([]byte{1}, Size), 0o644)
		}, wantErr: "mode -rw-r--r--: must be closed to group and others"},
		"mode 0640": {prepare: func(t *testing.T, path string) {
			writeKey(t, path, bytes.Repeat([]byte{1}, Size), 0o640)
		}, wantErr: "must be closed to group and others"},
		"too short": {prepare: func(t *testing.T, path string) {
			writeKey(t, path, []byte("secret"), 0o600)
		}, wantErr: "6 bytes, want 32 to 4096"},
		"too long": {prepare: func(t *testing.T, path string) {
			writeKey(t, path, bytes.Repeat([]byte{1}, MaxSize+1), 0o600)
		}, wantErr: "4097 bytes, want 32 to 4096"},
		"a directory": {prepare: func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "not a regular file"},
		"directory writable by others": {prepare: func(t *testing.T, path string) {
			writeKey(t, path, bytes.Repeat([]byte{1}, Size), 0o600)
			if err := os.Chmod(filepath.Dir(path), 0o777); err != nil {
				t.Fatal(err)
			}
		}, wantErr: "others may write it, and so replace the key"},
		"caller's directory check": {prepare: func(t *testing.T, path string) {},
			opts:    &Options{TempPattern: ".node-key-*", CheckDir: func(dir string) error { return errors.New("not this one: " + filepath.Base(dir)) }},
			wantErr: "not this one: keys"},
		"no temporary file pattern": {prepare: func(t *testing.T, path string) {},
			opts: &Options{}, wantErr: "Options.TempPattern is not set"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "keys", "node.key")
			if err := os.Mkdir(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			tc.prepare(t, path)
			before, _ := os.Lstat(path)
			opts := Options{TempPattern: ".node-key-*"}
			if tc.opts != nil {
				opts = *tc.opts
			}
			key, err := Load(path, opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "node key "+path) {
				t.Fatalf("Load = %x, %v, want an error naming the key with %q", key, err, tc.wantErr)
			}
			after, _ := os.Lstat(path)
			if (before == nil) != (after == nil) || before != nil && !os.SameFile(before, after) {
				t.Fatalf("the refused key was replaced: %v, then %v", before, after)
			}
		})
	}
}

func TestLoadRefusesRelativePath(t *testing.T) {
	if _, err := Load("node.key", Options{TempPattern: ".node-key-*"}); err == nil || !strings.Contains(err.Error(), "must be an absolute path") {
		t.Fatalf("Load of a relative path: %v, want a refusal", err)
	}
}

// TestLoadReadsWhatItCreated: a missing key (and directory) is created,
// 0600, and read back the same the next time.
func TestLoadReadsWhatItCreated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "node.key")
	opts := Options{TempPattern: ".node-key-*"}
	first, err := Load(path, opts)
	if err != nil || len(first) != Size {
		t.Fatalf("Load = %x, %v, want a fresh key of %d bytes", first, err, Size)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("created key: %v (%v), want mode 0600", st, err)
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("created directory: %v (%v), want mode 0700", st, err)
	}
	again, err := Load(path, opts)
	if err != nil || !bytes.Equal(again, first) {
		t.Fatalf("second Load = %x, %v, want %x", again, err, first)
	}
}

// TestLoadConcurrentCreatorsAgree: creators racing on a node without a key
// all read the same key, whole, and leave no temporary file.
func TestLoadConcurrentCreatorsAgree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	path := filepath.Join(dir, "node.key")
	const n = 16
	keys := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { keys[i], errs[i] = Load(path, Options{TempPattern: ".node-key-*"}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || len(keys[i]) != Size || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("creator %d: key %x (%v), creator 0: %x", i, keys[i], errs[i], keys[0])
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("key directory holds %v, want the key alone", entries)
	}
}

func writeKey(t *testing.T, path string, key []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, key, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}
