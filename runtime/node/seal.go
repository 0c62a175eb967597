package node

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// A sandbox record is sealed: whoever may write state_dir (the plan cache
// lives there too) must not be able to change what a pod was admitted as,
// since the record's namespace, UID, handler, annotations, decision and
// input are what the pod's later containers are judged by. The record's
// file begins with an HMAC-SHA256 of the rest of it under the node's
// record key:
//
//	{"mac":"<64 hex digits>",<the record's JSON, less its opening brace>
//
// so that the MAC covers the very bytes that are decoded, and a release
// that keeps no MAC still reads the record (it ignores "mac"). The record
// key is derived from the node key that authenticates the policy plan
// cache (config.Config.PlanCacheKeyPath: outside state_dir, root's alone),
// under a label of its own, so that no MAC of one is ever valid for the
// other.

// RuleRecordAuthentic names the rule a record breaks whose MAC is missing
// or does not match.
const RuleRecordAuthentic = "node.record_authentic"

// ErrRecordNotAuthentic is the error of a record whose MAC does not match:
// it was edited, damaged, written under another key, or is another
// sandbox's record.
var ErrRecordNotAuthentic = errors.New("not authentic: its HMAC-SHA256 under the node key does not match (edited, damaged, sealed under another key, or another sandbox's record)")

// ErrRecordUnsealed is the error of a record that carries no MAC: written
// by a release that sealed none, or stripped of its MAC.
var ErrRecordUnsealed = errors.New("carries no MAC (written by a release that sealed no record, or stripped of its MAC)")

// recordKeyLabel derives the record key from the node key.
const recordKeyLabel = "bulkhead/node/sandbox-record/v1"

// sealPrefix opens a sealed record; the MAC's hex digits and sealSep follow.
const (
	sealPrefix = `{"mac":"`
	sealSep    = `",`
)

// Bounds of the node key: the size of a key created here (the policy
// engine creates the same), the least and the most that is read.
const (
	nodeKeySize = 32
	nodeKeyMax  = 4096
)

// seal returns the file of a record whose JSON is body.
func seal(key, body []byte) ([]byte, error) {
	if len(body) < 2 || body[0] != '{' {
		return nil, errors.New("record is not a JSON object")
	}
	out := make([]byte, 0, len(sealPrefix)+2*sha256.Size+len(sealSep)+len(body))
	out = append(out, sealPrefix...)
	out = hex.AppendEncode(out, recordMAC(key, body))
	out = append(out, sealSep...)
	return append(out, body[1:]...), nil
}

// unseal returns the record's JSON from its file raw, authenticated under
// key: ErrRecordUnsealed when raw carries no MAC in front,
// ErrRecordNotAuthentic when its MAC does not match.
func unseal(key, raw []byte) ([]byte, error) {
	macEnd := len(sealPrefix) + 2*sha256.Size
	if !bytes.HasPrefix(raw, []byte(sealPrefix)) {
		return nil, ErrRecordUnsealed
	}
	if len(raw) < macEnd+len(sealSep) || !bytes.HasPrefix(raw[macEnd:], []byte(sealSep)) {
		return nil, ErrRecordNotAuthentic
	}
	mac := make([]byte, sha256.Size)
	if _, err := hex.Decode(mac, raw[len(sealPrefix):macEnd]); err != nil {
		return nil, ErrRecordNotAuthentic
	}
	body := append([]byte{'{'}, raw[macEnd+len(sealSep):]...)
	if !hmac.Equal(recordMAC(key, body), mac) {
		return nil, ErrRecordNotAuthentic
	}
	return body, nil
}

// recordMAC is the HMAC-SHA256 of a record's JSON under the record key.
func recordMAC(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return m.Sum(nil)
}

// loadRecordKey returns the record key derived from the node key at path,
// creating the node key (random bytes, 0600) when it does not exist yet, as
// the policy engine does for its plan cache. The key is refused unless its
// directory belongs to this process's user and nobody else may write it
// (who may write it may replace the key), and the file belongs to this
// user, is closed to everyone else and is no symbolic link.
func loadRecordKey(path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("node key %q: must be an absolute path (policy.plan_cache_key, or beside ledger_path)", path)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	if err := checkKeyDir(dir); err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	key, err := readNodeKey(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := createNodeKey(path); err != nil {
			return nil, fmt.Errorf("node key %s: create: %w", path, err)
		}
		key, err = readNodeKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("node key %s: %w", path, err)
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(recordKeyLabel))
	return m.Sum(nil), nil
}

// checkKeyDir refuses the key's directory dir, symbolic links resolved,
// unless it belongs to this process's user and is closed to writes from
// anyone else.
func checkKeyDir(dir string) error {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("%s: not a directory", resolved)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("directory %s: mode %v: others may write it, and so replace the key", resolved, st.Mode().Perm())
	case !ok || int(sys.Uid) != os.Geteuid():
		return fmt.Errorf("directory %s: not owned by uid %d", resolved, os.Geteuid())
	}
	return nil
}

// readNodeKey reads the key file at path, refusing a symbolic link, a file
// of another user or one open to group or others, and a size out of bounds.
func readNodeKey(path string) ([]byte, error) {
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
	case st.Size() < nodeKeySize || st.Size() > nodeKeyMax:
		return nil, fmt.Errorf("%d bytes, want %d to %d", st.Size(), nodeKeySize, nodeKeyMax)
	}
	key := make([]byte, st.Size())
	if _, err := io.ReadFull(f, key); err != nil {
		return nil, err
	}
	return key, nil
}

// createNodeKey writes a fresh random key to path unless a key is there
// already: written whole to a temporary file first and linked into place,
// so that a reader (a shim's policy engine) reads no key or all of it, and
// the first of two concurrent creators wins.
func createNodeKey(path string) error {
	key := make([]byte, nodeKeySize)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".node-key-*") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(key); err != nil {
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
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}
