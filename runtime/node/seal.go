package node

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/bulkhead-runtime/bulkhead/internal/nodekey"
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
// creating the node key when it does not exist yet, as the policy engine
// does for its plan cache; nodekey refuses a key that others may read or
// replace.
func loadRecordKey(path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("node key %q: must be an absolute path (policy.plan_cache_key, or beside ledger_path)", path)
	}
	key, err := nodekey.Load(path, nodekey.Options{TempPattern: ".node-key-*"})
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(recordKeyLabel))
	return m.Sum(nil), nil
}
