package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/gob"
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
	"github.com/open-policy-agent/opa/v1/ir"
)

// The plan cache (Options.PlanCacheDir) keeps what compiling a bundle
// produces for the plan evaluator: OPA's plans of the decision and mask
// queries, the bundle's data with the precomputed index, its revision. A
// process that opens the same bundle again loads them instead of parsing,
// compiling and planning it (most of Open's cost; a Bulkhead shim opens
// the bundle once per pod).
//
// An entry is named by a digest of everything its content depends on: the
// bundle tarball's bytes and the data file's bytes as read, the
// verification config (key id, scope, every key and its algorithm, or
// verification off), the bundle bounds, the evaluator, the paths, and this
// binary (its build info and its file). It is written only after those
// very bytes were verified against that config, compiled, and the plan's
// probe decision matched OPA's interpreter; verification being a function
// of the bytes and the config, a hit stands for a verification that
// succeeded. Another bundle, a changed byte, another key or scope is
// another name: a miss, verified and compiled in full. The directory and
// the entries must belong to this process's user and be closed to everyone
// else (0700, 0600), or the cache is not read. A damaged entry is a miss.
//
// Decisions are identical with and without the cache: the same plans run
// on the same data. OPA's interpreter, which decides where a plan defers,
// is compiled from the same bytes on first use.

// planCacheFormat changes whenever what an entry holds or how the engine
// compiles and plans a bundle changes.
const planCacheFormat = "bulkhead-plan-cache/1"

// planCacheMaxEntry bounds an entry read back.
const planCacheMaxEntry = 256 << 20

// planCacheKeep is how many entries a directory keeps (the newest).
const planCacheKeep = 4

// cachedPlans are the plans behind a snapshot's programs.
type cachedPlans struct {
	decision, mask *ir.Policy
}

// planCacheEntry is one cache file, gob-encoded: OPA's JSON form of a
// plan decodes in time quadratic in its nesting, slower than compiling.
type planCacheEntry struct {
	Format   string
	Key      string
	Revision string
	Decision *gobPlan
	Mask     *gobPlan
	HasMask  bool
	// Data is the data document with the index, as OPA's typed JSON of a
	// term (sets stay sets).
	Data     []byte
	Unmasked []string
}

// registerPlanTypes registers the IR's statements and values with gob.
var registerPlanTypes = sync.OnceFunc(func() {
	for _, s := range ir.StmtKinds() {
		gob.Register(s)
	}
	gob.Register(ir.Local(0))
	gob.Register(ir.Bool(false))
	gob.Register(ir.StringIndex(0))
})

// gobPlan is an ir.Policy as gob can encode it: built-ins by name (gob
// cannot encode their declarations, and irvm reads OPA's own).
type gobPlan struct {
	Strings, Files []string
	Builtins       []string
	Plans          *ir.Plans
	Funcs          *ir.Funcs
}

// toGobPlan converts p; ok is false for a plan irvm would not run from
// the cache exactly: one calling a built-in OPA does not know, or with
// rules OPA could not plan.
func toGobPlan(p *ir.Policy) (_ *gobPlan, ok bool) {
	if p == nil {
		return nil, true
	}
	if len(p.UnplannedRules) > 0 {
		return nil, false
	}
	g := &gobPlan{Plans: p.Plans, Funcs: p.Funcs}
	if p.Static != nil {
		for _, c := range p.Static.Strings {
			g.Strings = append(g.Strings, c.Value)
		}
		for _, c := range p.Static.Files {
			g.Files = append(g.Files, c.Value)
		}
		for _, b := range p.Static.BuiltinFuncs {
			if ast.BuiltinMap[b.Name] == nil {
				return nil, false
			}
			g.Builtins = append(g.Builtins, b.Name)
		}
	}
	return g, true
}

// policy is the ir.Policy g holds.
func (g *gobPlan) policy() *ir.Policy {
	if g == nil {
		return nil
	}
	static := &ir.Static{}
	for _, v := range g.Strings {
		static.Strings = append(static.Strings, &ir.StringConst{Value: v})
	}
	for _, v := range g.Files {
		static.Files = append(static.Files, &ir.StringConst{Value: v})
	}
	for _, name := range g.Builtins {
		static.BuiltinFuncs = append(static.BuiltinFuncs, &ir.BuiltinFunc{Name: name, Decl: ast.BuiltinMap[name].Decl})
	}
	return &ir.Policy{Static: static, Plans: g.Plans, Funcs: g.Funcs}
}

// planCache is the cache entry of one load.
type planCache struct {
	dir, key string
	src      sources
}

// planCache returns the cache entry for src, or nil when there is no
// cache: no PlanCacheDir, the interpreter evaluator, or a bundle directory
// (only a tarball is read in one piece).
func (e *Engine) planCache(src sources) *planCache {
	if e.opts.PlanCacheDir == "" || e.opts.Evaluator == EvaluatorTopdown || src.raw == nil {
		return nil
	}
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
	return &planCache{dir: e.opts.PlanCacheDir, key: hex.EncodeToString(h.Sum(nil)), src: src}
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
	snap, err := c.decode(raw)
	if err != nil {
		e.logger.Warn("policy plan cache entry not used; compiling the bundle", "entry", c.path(), "error", err)
		return nil
	}
	snap.fromCache = true
	src := c.src
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
	f, err := os.OpenFile(c.path(), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := privateInfo(st, false); err != nil {
		return nil, fmt.Errorf("%s: %w", c.path(), err)
	}
	if st.Size() > planCacheMaxEntry {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", c.path(), st.Size(), planCacheMaxEntry)
	}
	return io.ReadAll(io.LimitReader(f, planCacheMaxEntry+1))
}

// decode checks an entry and loads its plans.
func (c *planCache) decode(raw []byte) (*snapshot, error) {
	registerPlanTypes()
	var ent planCacheEntry
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&ent); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if ent.Format != planCacheFormat || ent.Key != c.key {
		return nil, fmt.Errorf("entry is format %q key %.12s, want %q key %.12s", ent.Format, ent.Key, planCacheFormat, c.key)
	}
	if ent.Decision == nil || ent.Data == nil || ent.Revision == "" || ent.HasMask != (ent.Mask != nil) {
		return nil, errors.New("entry is incomplete")
	}
	var data ast.Term
	if err := json.Unmarshal(ent.Data, &data); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	snap := &snapshot{revision: ent.Revision, hasMask: ent.HasMask, data: &data, unmaskedAnnotations: ent.Unmasked}
	var err error
	if snap.program, err = loadPlan(ent.Decision.policy()); err != nil {
		return nil, fmt.Errorf("plan %s: %w", DecisionQuery, err)
	}
	if ent.Mask != nil {
		if snap.maskProgram, err = loadPlan(ent.Mask.policy()); err != nil {
			return nil, fmt.Errorf("plan %s: %w", MaskQuery, err)
		}
	}
	return snap, nil
}

// store writes snap's entry when it can be served without the interpreter
// (a plan for the decision, and for the mask when there is one); a
// failure only costs the next open a compile.
func (c *planCache) store(snap *snapshot, logger *slog.Logger) {
	if snap.program == nil || snap.plans == nil || snap.data == nil || (snap.hasMask && snap.plans.mask == nil) {
		return
	}
	decision, ok1 := toGobPlan(snap.plans.decision)
	mask, ok2 := toGobPlan(snap.plans.mask)
	if !ok1 || !ok2 {
		return
	}
	data, err := json.Marshal(snap.data)
	if err != nil {
		logger.Warn("policy plan cache entry not written", "dir", c.dir, "error", err)
		return
	}
	ent := planCacheEntry{
		Format: planCacheFormat, Key: c.key, Revision: snap.revision,
		Decision: decision, Mask: mask, HasMask: snap.hasMask,
		Data: data, Unmasked: snap.unmaskedAnnotations,
	}
	if err := c.write(ent); err != nil {
		logger.Warn("policy plan cache entry not written", "dir", c.dir, "error", err)
	}
}

func (c *planCache) write(ent planCacheEntry) error {
	registerPlanTypes()
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(ent); err != nil {
		return err
	}
	data := buf.Bytes()
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
