package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/bulkhead-runtime/bulkhead/internal/nodekey"
	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// The plan cache (Options.PlanCacheDir) keeps what compiling a bundle
// produces for the plan evaluator: the programs of the decision and mask
// queries as irvm loaded them from OPA's plans (irvm's binary form of a
// Program), the bundle's data with the precomputed index, its revision. A
// process that opens the same bundle again reads them instead of parsing,
// compiling, planning and loading it (most of Open's cost; a Bulkhead shim
// opens the bundle once per pod).
//
// An entry is named by a digest of everything its content depends on: the
// bundle tarball's bytes and the data file's bytes as read, the
// verification config (key id, scope, every key and its algorithm, or
// verification off), the bundle bounds, the evaluator, the paths, and this
// binary (its build info and its file). It is written only after those
// very bytes were verified against that config, compiled, and the plan's
// probe decision matched OPA's interpreter. Another bundle, a changed byte,
// another key or scope is another name: a miss, verified and compiled in
// full.
//
// Whoever can write the directory can write an entry, and the programs in
// it decide every pod: a digest anyone can compute proves nothing. So an
// entry starts with an HMAC-SHA256 of the rest under the node's plan cache
// key (Options.PlanCacheKeyFile), a secret kept outside the cache
// directory, readable by this process's user alone: an entry that does not
// authenticate under it is a miss (logged, compiled, written again), and
// without a usable key the cache is neither read nor written. Even an
// entry that authenticates never stands in for the signature: a hit
// checks the bundle's signature again (verifySignature: OPA's signature
// and file digests, without parsing the modules), and a bundle that does
// not verify is a miss, refused as the compile refuses it. The directory
// and the entries must belong to this process's user and be closed to
// everyone else (0700, 0600), or the cache is not read.
//
// Decisions are identical with and without the cache: the same programs
// run on the same data. OPA's interpreter, which decides where a plan defers,
// is compiled from the same bytes on first use.

// planCacheFormat changes whenever what an entry holds or how the engine
// compiles and plans a bundle changes.
const planCacheFormat = "bulkhead-plan-cache/3"

// planCacheMaxEntry bounds an entry read back.
const planCacheMaxEntry = 256 << 20

// planCacheKeep is how many entries a directory keeps (the newest).
const planCacheKeep = 4

// planCacheEntry is one cache file (marshal).
type planCacheEntry struct {
	Format, Key, Revision string
	// Unmasked is the bundle's UnmaskedAnnotationsPath.
	Unmasked []string
	// Data is the data document with the index, in irvm's binary form of a
	// value (sets stay sets).
	Data []byte
	// Decision and Mask are the programs in irvm's binary form, Mask empty
	// when the bundle has no mask: reading them back runs neither OPA's IR
	// decoding nor irvm.Load's analyses.
	Decision, Mask []byte
}

// planCacheSections is how many sections an entry holds.
const planCacheSections = 7

// marshal is the entry's file: the HMAC-SHA256 of the rest under key,
// then each field in the order planCacheEntry declares them, as its length
// (a uvarint) and its bytes, Unmasked as JSON. The programs stay where they
// are in the file when it is read back (unmarshalPlanCacheEntry).
func (ent *planCacheEntry) marshal(key []byte) ([]byte, error) {
	unmasked, err := json.Marshal(ent.Unmasked)
	if err != nil {
		return nil, err
	}
	b := make([]byte, sha256.Size) // the MAC, once the rest is known
	for _, section := range [planCacheSections][]byte{
		[]byte(ent.Format), []byte(ent.Key), []byte(ent.Revision), unmasked, ent.Data, ent.Decision, ent.Mask,
	} {
		b = binary.AppendUvarint(b, uint64(len(section)))
		b = append(b, section...)
	}
	copy(b, entryMAC(key, b[sha256.Size:]))
	return b, nil
}

// entryMAC is the HMAC-SHA256 of an entry's body under the node's key.
func entryMAC(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return m.Sum(nil)
}

// errEntryNotAuthentic is the error of an entry whose MAC does not match.
var errEntryNotAuthentic = errors.New("entry is not authentic: its HMAC under the node's plan cache key does not match (damaged, written under another key, or not written by this node's engine)")

// unmarshalPlanCacheEntry reads back what marshal wrote under key, refusing
// an entry that does not authenticate before reading any of it; the
// entry's byte slices are raw's.
func unmarshalPlanCacheEntry(raw, key []byte) (*planCacheEntry, error) {
	if len(raw) < sha256.Size {
		return nil, errors.New("entry is truncated")
	}
	body := raw[sha256.Size:]
	if !hmac.Equal(entryMAC(key, body), raw[:sha256.Size]) {
		return nil, errEntryNotAuthentic
	}
	return parsePlanCacheEntry(body)
}

// parsePlanCacheEntry reads the sections of an entry's body, which must
// have been authenticated.
func parsePlanCacheEntry(rest []byte) (*planCacheEntry, error) {
	var sections [planCacheSections][]byte
	for i := range sections {
		n, size := binary.Uvarint(rest)
		if size <= 0 || n > uint64(len(rest)-size) {
			return nil, fmt.Errorf("entry is malformed: section %d", i)
		}
		sections[i], rest = rest[size:size+int(n)], rest[size+int(n):]
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("entry is malformed: %d bytes after its sections", len(rest))
	}
	ent := &planCacheEntry{
		Format: string(sections[0]), Key: string(sections[1]), Revision: string(sections[2]),
		Data: sections[4], Decision: sections[5], Mask: sections[6],
	}
	if err := json.Unmarshal(sections[3], &ent.Unmasked); err != nil {
		return nil, fmt.Errorf("entry is malformed: %w", err)
	}
	return ent, nil
}

// planCache is the cache entry of one load.
type planCache struct {
	dir, key string
	// secret is the node's plan cache key, which authenticates entries.
	secret []byte
	src    sources
}

// planCache returns the cache entry for src, or nil when there is no
// cache: no PlanCacheDir, the interpreter evaluator, a bundle directory
// (only a tarball is read in one piece), or no usable key to authenticate
// entries with (logged: the cache is then neither read nor written).
func (e *Engine) planCache(src sources) *planCache {
	if e.opts.PlanCacheDir == "" || e.opts.Evaluator == EvaluatorTopdown || src.raw == nil {
		return nil
	}
	secret, err := loadPlanCacheKey(e.opts.PlanCacheKeyFile, e.opts.PlanCacheDir)
	if err != nil {
		e.logger.Warn("policy plan cache not used: no key to authenticate its entries; compiling the bundle",
			"dir", e.opts.PlanCacheDir, "key_file", e.opts.PlanCacheKeyFile, "error", err)
		return nil
	}
	return &planCache{dir: e.opts.PlanCacheDir, key: e.planCacheName(src), secret: secret, src: src}
}

// planCacheName is the name of src's entry: a digest of everything the
// entry's content depends on.
func (e *Engine) planCacheName(src sources) string {
	h := sha256.New()
	field := func(name string, v []byte) {
		fmt.Fprintf(h, "%s %d\n", name, len(v))
		h.Write(v)
	}
	lim := e.opts.bundleLimits()
	field("format", []byte(planCacheFormat))
	field("build", []byte(buildIdentity()))
	field("bundle-path", []byte(e.opts.BundlePath))
	field("data-path", []byte(e.opts.DataPath))
	field("evaluator", []byte(e.opts.Evaluator))
	field("limits", fmt.Appendf(nil, "%d/%d", lim.bytes, lim.files))
	if e.vc == nil {
		field("verify", []byte("off"))
	} else {
		field("verify", []byte("on"))
		field("key-id", []byte(e.vc.KeyID))
		field("scope", []byte(e.vc.Scope))
		ids := make([]string, 0, len(e.vc.PublicKeys))
		for id := range e.vc.PublicKeys {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			k := e.vc.PublicKeys[id]
			field("key", []byte(id))
			field("algorithm", []byte(k.Algorithm))
			field("key-scope", []byte(k.Scope))
			field("public-key", []byte(k.Key))
		}
	}
	field("bundle", src.raw)
	field("data", src.data)
	return hex.EncodeToString(h.Sum(nil))
}

// buildIdentity names this binary: its build info and its file, so that
// another build never reads this one's entries.
var buildIdentity = sync.OnceValue(func() string {
	var b strings.Builder
	if info, ok := debug.ReadBuildInfo(); ok {
		b.WriteString(info.String())
	}
	if exe, err := os.Executable(); err == nil {
		if st, err := os.Stat(exe); err == nil {
			fmt.Fprintf(&b, "\nexecutable %s %d %d", exe, st.Size(), st.ModTime().UnixNano())
			if sys, ok := st.Sys().(*syscall.Stat_t); ok {
				fmt.Fprintf(&b, " %d:%d", sys.Dev, sys.Ino)
			}
		}
	}
	return b.String()
})

func (c *planCache) path() string { return filepath.Join(c.dir, "plan-"+c.key) }

// load returns the snapshot of the entry, or nil on a miss (logged when
// an entry exists but cannot be used).
func (c *planCache) load(ctx context.Context, e *Engine) *snapshot {
	raw, err := c.read()
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			e.logger.Warn("policy plan cache entry not used; compiling the bundle", "entry", c.path(), "error", err)
		}
		return nil
	}
	src := c.src
	// An entry is no proof that the bundle verifies: its signature is
	// checked again, on another core while the entry is read back. A
	// bundle that fails is a miss, which the compile then refuses with
	// OPA's own message.
	verified := make(chan error, 1)
	if e.vc == nil {
		verified <- nil
	} else {
		go func() { verified <- verifySignature(src.raw, e.vc, e.opts.bundleLimits()) }()
	}
	snap, err := c.decode(raw)
	verr := <-verified
	if err != nil {
		e.logger.Warn("policy plan cache entry not used; compiling the bundle", "entry", c.path(), "error", err)
		return nil
	}
	if verr != nil {
		e.logger.Warn("policy plan cache entry not used: the bundle's signature does not verify; compiling the bundle", "entry", c.path(), "error", verr)
		return nil
	}
	snap.fromCache = true
	snap.buildInterp = func(ctx context.Context) (*interpreter, error) {
		// The interpreter outlives the decision that first needs it.
		ctx = context.WithoutCancel(ctx)
		b, rev, err := readBundleFrom(e.opts.BundlePath, src.raw, e.vc, e.opts.bundleLimits())
		if err != nil {
			return nil, err
		}
		if e.opts.DataPath != "" {
			if err := mergeData(b, src.data); err != nil {
				return nil, fmt.Errorf("data %s: %w", e.opts.DataPath, err)
			}
		}
		if rev != snap.revision {
			return nil, fmt.Errorf("bundle revision %s, plan cache entry %s", rev, snap.revision)
		}
		full, err := compile(ctx, b, rev, false)
		if err != nil {
			return nil, err
		}
		return full.interp, nil
	}
	return snap
}

// read returns the entry's bytes when the directory and the file are this
// user's and closed to others.
func (c *planCache) read() ([]byte, error) {
	if err := checkPrivate(c.dir, true); err != nil {
		return nil, err
	}
	raw, err := readPrivate(c.path(), 0, planCacheMaxEntry)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.path(), err)
	}
	return raw, nil
}

// readPrivate reads the regular file at path, refusing a symbolic link, a
// file of another user or one open to group or others, and a size outside
// [min, max] bytes.
func readPrivate(path string, min, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := privateInfo(st, false); err != nil {
		return nil, err
	}
	if st.Size() < min || st.Size() > max {
		return nil, fmt.Errorf("%d bytes, want %d to %d", st.Size(), min, max)
	}
	raw := make([]byte, st.Size())
	if _, err := io.ReadFull(f, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// decode authenticates an entry, checks it and reads its programs back.
func (c *planCache) decode(raw []byte) (*snapshot, error) {
	ent, err := unmarshalPlanCacheEntry(raw, c.secret)
	if err != nil {
		return nil, err
	}
	return c.snapshotOf(ent)
}

// snapshotOf checks an authenticated entry and reads its programs back.
func (c *planCache) snapshotOf(ent *planCacheEntry) (*snapshot, error) {
	if ent.Format != planCacheFormat || ent.Key != c.key {
		return nil, fmt.Errorf("entry is format %q key %.12s, want %q key %.12s", ent.Format, ent.Key, planCacheFormat, c.key)
	}
	if len(ent.Decision) == 0 || len(ent.Data) == 0 || ent.Revision == "" {
		return nil, errors.New("entry is incomplete")
	}
	data, err := irvm.ReadValue(ent.Data)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	snap := &snapshot{revision: ent.Revision, hasMask: len(ent.Mask) > 0, data: ast.NewTerm(data), unmaskedAnnotations: ent.Unmasked}
	caps := Capabilities()
	if snap.program, err = irvm.LoadBinary(ent.Decision, caps); err != nil {
		return nil, fmt.Errorf("plan %s: %w", DecisionQuery, err)
	}
	if snap.hasMask {
		if snap.maskProgram, err = irvm.LoadBinary(ent.Mask, caps); err != nil {
			return nil, fmt.Errorf("plan %s: %w", MaskQuery, err)
		}
	}
	return snap, nil
}

// store writes snap's entry when it can be served without the interpreter
// (a program for the decision, and for the mask when there is one); a
// failure only costs the next open a compile.
func (c *planCache) store(snap *snapshot, logger *slog.Logger) {
	if snap.program == nil || snap.data == nil || (snap.hasMask && snap.maskProgram == nil) {
		return
	}
	ent := planCacheEntry{Format: planCacheFormat, Key: c.key, Revision: snap.revision, Unmasked: snap.unmaskedAnnotations}
	data, err := irvm.AppendValue(nil, snap.data.Value)
	if err == nil {
		ent.Data = data
		ent.Decision, err = snap.program.AppendBinary(nil)
	}
	if err == nil && snap.hasMask {
		ent.Mask, err = snap.maskProgram.AppendBinary(nil)
	}
	if err == nil {
		err = c.write(ent)
	}
	if err != nil {
		logger.Warn("policy plan cache entry not written", "dir", c.dir, "error", err)
	}
}

func (c *planCache) write(ent planCacheEntry) error {
	data, err := ent.marshal(c.secret)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return err
	}
	if err := checkPrivate(c.dir, true); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.dir, ".plan-*") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// No fsync: an entry lost or torn by a crash is a miss.
	if err := os.Rename(tmp.Name(), c.path()); err != nil {
		return err
	}
	c.prune()
	return nil
}

// prune removes all but the newest planCacheKeep entries.
func (c *planCache) prune() {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return
	}
	type aged struct {
		name string
		mod  int64
	}
	var plans []aged
	for _, d := range entries {
		if !strings.HasPrefix(d.Name(), "plan-") {
			continue
		}
		if info, err := d.Info(); err == nil {
			plans = append(plans, aged{d.Name(), info.ModTime().UnixNano()})
		}
	}
	slices.SortFunc(plans, func(a, b aged) int { return int(b.mod - a.mod) })
	for i, p := range plans {
		if i >= planCacheKeep && p.name != filepath.Base(c.path()) {
			_ = os.Remove(filepath.Join(c.dir, p.name))
		}
	}
}

// checkPrivate refuses path unless it is a directory (dir) or a regular
// file of this process's user that nobody else may write (a directory) or
// read (a file), and not a symbolic link.
func checkPrivate(path string, dir bool) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if err := privateInfo(st, dir); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func privateInfo(st os.FileInfo, dir bool) error {
	switch {
	case dir && !st.IsDir():
		return errors.New("not a directory")
	case !dir && !st.Mode().IsRegular():
		return errors.New("not a regular file")
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("mode %v: must be closed to group and others (0700 directory, 0600 file)", st.Mode().Perm())
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok || int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("not owned by uid %d", os.Geteuid())
	}
	return nil
}

// planCacheKeySize is the size of a plan cache key the engine creates
// (Options.PlanCacheKeyFile, the node key).
const planCacheKeySize = nodekey.Size

// loadPlanCacheKey returns the plan cache key at path, creating it when it
// does not exist, under nodekey's invariant (this user's, closed to
// everyone else, in a directory only this user may write), and refused
// when its directory lies inside cacheDir.
func loadPlanCacheKey(path, cacheDir string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("Options.PlanCacheKeyFile is not set")
	}
	return nodekey.Load(path, nodekey.Options{
		TempPattern: ".plan-cache-key-*",
		CheckDir:    func(dir string) error { return keyDirOutsideCache(dir, cacheDir) },
	})
}

// keyDirOutsideCache refuses the key's directory dir (symbolic links
// resolved) when it is cacheDir or lies inside it.
func keyDirOutsideCache(dir, cacheDir string) error {
	if resolvedCache, err := filepath.EvalSymlinks(cacheDir); err == nil && insideDir(dir, resolvedCache) {
		return fmt.Errorf("key directory %s lies inside the plan cache directory %s: a writer of the cache could read or replace the key", dir, resolvedCache)
	}
	return nil
}

// insideDir reports whether path is dir or lies inside it, both clean.
func insideDir(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
