// Package policy decides what a pod may have by evaluating a signed OPA
// bundle (default: rego/). It keeps one invariant: every decision comes from
// a bundle that was verified and compiled before it became active, and every
// failure is a deny that names its cause.
package policy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// Queries the engine evaluates.
const (
	DecisionQuery = "data.bulkhead.decision"
	MaskQuery     = "data.system.log.mask"
)

// Rule ids of the engine's own fail-closed denies.
const (
	RuleUndefined = "engine.undefined" // the bundle has no decision for this input
	RuleError     = "engine.error"     // evaluation failed
	RuleShape     = "engine.shape"     // the decision breaks the contract
)

// Engine evaluates the active bundle. It is safe for concurrent use: Decide
// reads an immutable snapshot that Reload swaps atomically.
type Engine struct {
	opts   Options
	vc     *bundle.VerificationConfig
	logger *slog.Logger

	decisions *lockedWriter // nil when no decision log is configured
	closer    io.Closer     // the decision log file, when the engine opened it

	active atomic.Pointer[snapshot]

	reloadMu sync.Mutex // serialises Reload so snapshots activate in order
	// onReload is OnReload's function; guarded by reloadMu.
	onReload func(revision string, err error)

	idPrefix string
	idSeq    atomic.Uint64
}

// snapshot is one compiled, verified bundle. Never modified once built,
// but for its interpreter, which a snapshot read from the plan cache
// compiles on first use (interpreter).
type snapshot struct {
	revision    string
	fingerprint string
	// hasMask: the bundle defines MaskQuery.
	hasMask bool
	// fromCache: read from the plan cache (Options.PlanCacheDir).
	fromCache bool

	// interp is OPA's interpreter on the bundle, the reference, or its
	// error; set at once, or by the first interpreter call through
	// buildInterp for a snapshot from the plan cache.
	interpOnce  sync.Once
	interp      *interpreter
	interpErr   error
	buildInterp func(context.Context) (*interpreter, error)

	// program is OPA's plan of the decision query, run by irvm, with data
	// its base document; nil when Options.Evaluator is topdown or the plan
	// needs what irvm does not implement (planNote says why).
	program  *irvm.Program
	data     *ast.Term
	planNote string
	// maskProgram is the plan of MaskQuery, when program exists and the
	// mask can run as a plan.
	maskProgram *irvm.Program
	// unmaskedAnnotations is the bundle's UnmaskedAnnotationsPath.
	unmaskedAnnotations []string
}

// interpreter is OPA's interpreter prepared on a bundle's queries.
type interpreter struct {
	decision rego.PreparedEvalQuery
	mask     *rego.PreparedEvalQuery // nil when the bundle defines no mask
}

// interpreter returns OPA's interpreter on the snapshot's bundle,
// compiling it on first use for a snapshot read from the plan cache.
func (s *snapshot) interpreter(ctx context.Context) (*interpreter, error) {
	s.interpOnce.Do(func() {
		if s.interp == nil && s.buildInterp != nil {
			s.interp, s.interpErr = s.buildInterp(ctx)
		}
		if s.interp == nil && s.interpErr == nil {
			s.interpErr = errors.New("no interpreter")
		}
	})
	if s.interpErr != nil {
		return nil, fmt.Errorf("OPA's interpreter on revision %s: %w", s.revision, s.interpErr)
	}
	return s.interp, nil
}

// Open validates opts, loads, verifies and compiles the bundle and returns an
// engine ready to decide.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	vc, err := opts.verificationConfig()
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, vc: vc, logger: opts.Logger}
	if e.logger == nil {
		e.logger = slog.Default()
	}
	var prefix [4]byte
	_, _ = rand.Read(prefix[:])
	e.idPrefix = hex.EncodeToString(prefix[:])

	snap, err := e.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle %s: %w", opts.BundlePath, err)
	}
	switch {
	case opts.DecisionLog != nil:
		e.decisions = &lockedWriter{w: opts.DecisionLog}
	case opts.DecisionLogFile == "-":
		e.decisions = &lockedWriter{w: os.Stdout}
	case opts.DecisionLogFile != "":
		rf := &RotatingFile{Path: opts.DecisionLogFile, MaxBytes: opts.DecisionLogMaxBytes, Backups: opts.DecisionLogBackups}
		if rf.MaxBytes == 0 {
			rf.MaxBytes = 64 << 20
		}
		if rf.Backups == 0 {
			rf.Backups = 5
		}
		if err := os.MkdirAll(filepath.Dir(rf.Path), 0o700); err != nil {
			return nil, fmt.Errorf("policy: Options.DecisionLogFile: %w", err)
		}
		e.decisions, e.closer = &lockedWriter{w: rf}, rf
	}
	e.active.Store(snap)
	e.logger.Info("policy bundle active", "bundle", opts.BundlePath, "revision", snap.revision, "verified", vc != nil, "plan_cache_hit", snap.fromCache)
	return e, nil
}

// Close releases the decision log file. Decide must not be called after.
func (e *Engine) Close() error {
	if e.closer != nil {
		return e.closer.Close()
	}
	return nil
}

// Revision is the revision of the active bundle.
func (e *Engine) Revision() string { return e.active.Load().revision }

// OnReload registers fn, called after every reload (Reload, Watch) with
// the revision active afterwards and the reload's error: nil when the new
// bundle became active, else why it was refused and the old one stays.
func (e *Engine) OnReload(fn func(revision string, err error)) {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	e.onReload = fn
}

// Reload reads, verifies and compiles the bundle again and activates it. On
// any failure the active bundle stays and the error names its revision.
func (e *Engine) Reload(ctx context.Context) error {
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	old := e.active.Load()
	snap, err := e.load(ctx)
	if err != nil {
		e.logger.Error("policy bundle reload refused; keeping the active bundle",
			"bundle", e.opts.BundlePath, "active_revision", old.revision, "error", err)
		err = fmt.Errorf("policy: reload of %s refused, revision %s stays active: %w", e.opts.BundlePath, old.revision, err)
		if e.onReload != nil {
			e.onReload(old.revision, err)
		}
		return err
	}
	e.active.Store(snap)
	e.logger.Info("policy bundle reloaded", "bundle", e.opts.BundlePath, "revision", snap.revision, "previous_revision", old.revision)
	if e.onReload != nil {
		e.onReload(snap.revision, nil)
	}
	return nil
}

// Watch polls the bundle (and DataPath) every interval and reloads when
// they change, until ctx ends. Failed reloads are logged and retried only
// after the next change.
func (e *Engine) Watch(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("policy: Watch interval %v must be positive", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	seen := e.active.Load().fingerprint
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		fp := fingerprint(e.opts.BundlePath, e.opts.DataPath)
		if fp == seen {
			continue
		}
		seen = fp
		_ = e.Reload(ctx) // logged by Reload
	}
}

// load builds a snapshot from the files on disk.
func (e *Engine) load(ctx context.Context) (*snapshot, error) {
	if e.vc == nil {
		e.logger.Error("POLICY BUNDLE SIGNATURE VERIFICATION IS DISABLED (InsecureSkipVerification): whatever is at the bundle path will be enforced; never run a production node like this",
			"bundle", e.opts.BundlePath)
	}
	fp := fingerprint(e.opts.BundlePath, e.opts.DataPath)
	src, err := e.readSources()
	if err != nil {
		return nil, err
	}
	cache := e.planCache(src)
	if cache != nil {
		if snap := cache.load(ctx, e); snap != nil {
			snap.fingerprint = fp
			return snap, nil
		}
	}
	snap, err := e.compileSources(ctx, src)
	if err != nil {
		return nil, err
	}
	snap.fingerprint = fp
	if cache != nil {
		cache.store(snap, e.logger)
	}
	return snap, nil
}

// sources are the bytes a snapshot is built from: the bundle (nil for a
// directory, which readBundle reads itself) and the data file.
type sources struct {
	raw, data []byte
}

// readSources reads the bundle tarball and the data file once, bounded:
// what is compiled, cached or verified is exactly what was read.
func (e *Engine) readSources() (sources, error) {
	var src sources
	lim := e.opts.bundleLimits()
	if e.opts.DataPath != "" {
		// Bounded before the bundle is read, as the bundle is.
		var err error
		if src.data, err = readAtMost(e.opts.DataPath, lim.bytes); err != nil {
			if errors.Is(err, ErrBundleTooLarge) {
				return src, tooLarge("data %s is larger than MaxBundleBytes (%d bytes)"+limitKeys, filepath.Base(e.opts.DataPath), lim.bytes)
			}
			return src, fmt.Errorf("data %s: %w", e.opts.DataPath, err)
		}
	}
	info, err := os.Stat(e.opts.BundlePath)
	if err != nil {
		return src, err
	}
	if !info.IsDir() {
		if src.raw, err = readAtMost(e.opts.BundlePath, lim.bytes); err != nil {
			return src, err
		}
	}
	return src, nil
}

// compileSources verifies, compiles and probes the bundle in src.
func (e *Engine) compileSources(ctx context.Context, src sources) (*snapshot, error) {
	lim := e.opts.bundleLimits()
	b, rev, err := readBundleFrom(e.opts.BundlePath, src.raw, e.vc, lim)
	if err != nil {
		return nil, err
	}
	if e.opts.DataPath != "" {
		if err := mergeData(b, src.data); err != nil {
			return nil, fmt.Errorf("data %s: %w", e.opts.DataPath, err)
		}
	}
	snap, err := compile(ctx, b, rev, e.opts.Evaluator != EvaluatorTopdown)
	if err != nil {
		return nil, fmt.Errorf("revision %s: %w", rev, err)
	}
	// A bundle that cannot answer a minimal input is broken: refuse it here
	// rather than deny every pod after the swap. The plan must answer it
	// exactly as the interpreter does, or the interpreter decides.
	probe := (&Input{Version: ContractVersion, Kind: KindSandbox}).astValue()
	want, err := snap.evalTopdown(ctx, probe)
	if err == nil {
		_, err = decisionOf(want)
	}
	if err != nil {
		return nil, fmt.Errorf("revision %s: probe decision: %w", rev, err)
	}
	if snap.program != nil {
		got, err := snap.evalPlan(ctx, probe)
		if errors.Is(err, irvm.ErrDeferred) {
			got, err = want, nil // the interpreter answers this input
		}
		if err != nil || !sameValue(got, want) {
			snap.program, snap.planNote = nil, fmt.Sprintf("the plan's probe decision differs from OPA's interpreter (%v, error %v)", got, err)
		}
	}
	if e.opts.Evaluator != EvaluatorTopdown && snap.program == nil {
		e.logger.Warn("policy decisions use OPA's interpreter: the compiled plan cannot run this bundle",
			"revision", rev, "reason", snap.planNote)
	}
	return snap, nil
}

func sameValue(a, b ast.Value) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return ast.Compare(a, b) == 0
}

// compile compiles the bundle's modules, evaluates the data-only index
// package once (precomputeIndex) and prepares both queries on the rest.
func compile(ctx context.Context, b *bundle.Bundle, rev string, withPlan bool) (*snapshot, error) {
	modules := b.ParsedModules("bulkhead")
	data := b.Data
	if data == nil {
		data = map[string]any{}
	}
	store := newStore(data)
	compiler, err := newCompiler(ctx, modules, store)
	if err != nil {
		return nil, err
	}
	// Rules that depend on data alone are evaluated here, once, and served
	// as data from now on; decisions then only look them up.
	rest, index, err := precomputeIndex(ctx, compiler, modules, data)
	if err != nil {
		return nil, err
	}
	if index != nil {
		data = withIndex(data, index)
		store = newStore(data)
		if compiler, err = newCompiler(ctx, rest, store); err != nil {
			return nil, err
		}
	}
	prepare := func(query string) (rego.PreparedEvalQuery, error) {
		return prepareTopdown(ctx, compiler, store, query)
	}
	decision, err := prepare(DecisionQuery)
	if err != nil {
		return nil, fmt.Errorf("prepare %s: %w", DecisionQuery, err)
	}
	interp := &interpreter{decision: decision}
	snap := &snapshot{revision: rev, interp: interp}
	if snap.unmaskedAnnotations, err = unmaskedAnnotations(data); err != nil {
		return nil, err
	}
	if withPlan {
		if snap.program, err = planQuery(ctx, compiler, DecisionQuery); err != nil {
			if !errors.Is(err, irvm.ErrUnsupported) {
				return nil, fmt.Errorf("plan %s: %w", DecisionQuery, err)
			}
			snap.program, snap.planNote = nil, err.Error()
		} else {
			if snap.data, err = dataTerm(ctx, store); err != nil {
				return nil, err
			}
		}
	}
	if len(compiler.GetRulesExact(ast.MustParseRef(MaskQuery))) > 0 {
		mask, err := prepare(MaskQuery)
		if err != nil {
			return nil, fmt.Errorf("prepare %s: %w", MaskQuery, err)
		}
		interp.mask, snap.hasMask = &mask, true
		if snap.program != nil {
			// The mask runs in the interpreter when its plan cannot.
			if snap.maskProgram, err = planQuery(ctx, compiler, MaskQuery); err != nil && !errors.Is(err, irvm.ErrUnsupported) {
				return nil, fmt.Errorf("plan %s: %w", MaskQuery, err)
			}
		}
	}
	return snap, nil
}

// newCompiler compiles a bundle's modules as every bundle is compiled:
// Bulkhead's capabilities, no print statements, and OPA's check that no
// rule defines a path the bundle's data (in store) also holds, which OPA
// runs when it activates a bundle or compiles modules beside a store: the
// interpreter would answer such a path from data or from the rule
// depending on how it is reached, so the bundle is refused.
func newCompiler(ctx context.Context, modules map[string]*ast.Module, store storage.Store) (*ast.Compiler, error) {
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return nil, err
	}
	defer store.Abort(ctx, txn)
	c := ast.NewCompiler().
		WithCapabilities(Capabilities()).
		WithEnablePrintStatements(false).
		WithPathConflictsCheck(storage.NonEmpty(ctx, store, txn))
	c.Compile(modules)
	if c.Failed() {
		return nil, fmt.Errorf("compile: %w", c.Errors)
	}
	return c, nil
}

// newStore is the store both evaluators read a bundle's data from.
func newStore(data map[string]any) storage.Store {
	return inmem.NewFromObjectWithOpts(data, inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
}

// dataTerm is the whole of store's data, as the plan reads it.
func dataTerm(ctx context.Context, store storage.Store) (*ast.Term, error) {
	root, err := storage.ReadOne(ctx, store, storage.Path{})
	if err != nil {
		return nil, fmt.Errorf("read data: %w", err)
	}
	v, ok := root.(ast.Value)
	if !ok {
		return nil, fmt.Errorf("read data: got %T", root)
	}
	return ast.NewTerm(v), nil
}

// prepareTopdown prepares query for OPA's interpreter as the engine runs it.
func prepareTopdown(ctx context.Context, compiler *ast.Compiler, store storage.Store, query string) (rego.PreparedEvalQuery, error) {
	return rego.New(
		rego.Query(query),
		rego.Compiler(compiler),
		rego.Store(store),
		rego.StrictBuiltinErrors(true),
	).PrepareForEval(ctx)
}

// keepAST hands the evaluator's result over as a Rego value: decodeDecision
// reads it directly instead of through a JSON-like copy.
func keepAST(t *ast.Term, _ *rego.EvalContext) (any, error) { return t.Value, nil }

// evalError carries the rule id of a fail-closed deny.
type evalError struct {
	rule string
	err  error
}

func (e *evalError) Error() string { return e.rule + ": " + e.err.Error() }
func (e *evalError) Unwrap() error { return e.err }

// evalTopdown decides with OPA's interpreter; nil means undefined.
func (s *snapshot) evalTopdown(ctx context.Context, input ast.Value) (ast.Value, error) {
	interp, err := s.interpreter(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := interp.decision.Eval(ctx, rego.EvalParsedInput(input), rego.EvalGenerateJSON(keepAST))
	if err != nil || len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, err
	}
	v, _ := rs[0].Expressions[0].Value.(ast.Value)
	return v, nil
}

func (s *snapshot) evaluate(ctx context.Context, in *Input) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, &evalError{RuleError, err}
	}
	v, err := s.evalValue(ctx, in.astValue())
	if err != nil {
		return Decision{}, &evalError{RuleError, err}
	}
	return decisionOf(v)
}

// evalValue is the value of DecisionQuery for input: the plan's, or the
// interpreter's when there is no plan or the plan deferred.
func (s *snapshot) evalValue(ctx context.Context, input ast.Value) (ast.Value, error) {
	if s.program != nil {
		v, err := s.evalPlan(ctx, input)
		if !errors.Is(err, irvm.ErrDeferred) {
			return v, err
		}
		// The plan ran into what only the interpreter decides exactly (an
		// error, a key it reads by path in base data): the interpreter decides.
	}
	return s.evalTopdown(ctx, input)
}

// decisionOf reads the value of DecisionQuery; undefined (nil) and a value
// of the wrong shape are fail-closed errors.
func decisionOf(v ast.Value) (Decision, error) {
	if v == nil {
		return Decision{}, &evalError{RuleUndefined, errors.New(DecisionQuery + " is undefined for this input")}
	}
	d, err := decodeDecision(v)
	if err != nil {
		return Decision{}, &evalError{RuleShape, err}
	}
	return d, nil
}

// Decide evaluates the active bundle for in. It never fails open: when the
// bundle errs, has no decision or returns a malformed one, Decide returns a
// deny whose single reason is engine.error, engine.undefined or engine.shape,
// together with the error. The decision always carries ID and Revision, and
// is written to the decision log when one is configured.
func (e *Engine) Decide(ctx context.Context, in Input) (Decision, error) {
	start := time.Now()
	snap := e.active.Load()
	d, err := snap.evaluate(ctx, &in)
	if err != nil {
		var ee *evalError
		rule := RuleError
		if errors.As(err, &ee) {
			rule = ee.rule
		}
		d = failClosed(rule, err.Error())
		err = fmt.Errorf("policy: revision %s: %w", snap.revision, err)
	}
	d.ID = e.decisionID()
	d.Revision = snap.revision
	if e.decisions != nil {
		e.logDecision(ctx, snap, &in, &d, err, time.Since(start))
	}
	return d, err
}

// decisionID is "<8 hex of this engine>-<sequence>", unique per process.
func (e *Engine) decisionID() string {
	buf := make([]byte, 0, 24)
	buf = append(buf, e.idPrefix...)
	buf = append(buf, '-')
	seq := strconv.AppendUint(nil, e.idSeq.Add(1), 10)
	for range 8 - len(seq) {
		buf = append(buf, '0')
	}
	return string(append(buf, seq...))
}

// failClosed is the most restrictive decision, with one deny reason.
func failClosed(rule, message string) Decision {
	return Decision{
		Allow:   false,
		Reasons: []Reason{{Rule: rule, Message: message, Enforcement: EnforceDeny}},
		Runtime: RuntimeGVisor,
		RDMA:    RDMADeny,
		GPU:     GPUDecision{AllowedProfiles: []string{}, ExclusivePhysicalGPU: true, MIGInSandbox: "refuse"},
		Network: NetworkDecision{Isolation: "tenant", EgressCIDRs: []string{}, DenyMetadata: true},
	}
}

func (e *Engine) logDecision(ctx context.Context, snap *snapshot, in *Input, d *Decision, decideErr error, latency time.Duration) {
	entry := logEntry{
		DecisionID: d.ID,
		Revision:   snap.revision,
		Timestamp:  time.Now().UTC(),
		Kind:       in.Kind,
		Namespace:  in.Namespace,
		Result:     d,
		LatencyNS:  latency.Nanoseconds(),
	}
	if decideErr != nil {
		entry.Error = decideErr.Error()
	}
	doc, err := toDoc(map[string]any{"input": in, "result": d})
	if err != nil {
		entry.Error = "mask: " + err.Error()
		entry.Input = "**masked: input could not be encoded**"
		_ = e.decisions.writeLine(entry)
		return
	}
	entry.Masked = builtinMask(doc, snap.unmaskedAnnotations)
	if snap.hasMask {
		masked, err := snap.applyBundleMask(ctx, doc)
		entry.Masked = append(entry.Masked, masked...)
		if err != nil {
			// Never log what the bundle wanted hidden: drop the whole input.
			e.logger.Error("policy decision log mask failed; input dropped from the log", "error", err)
			doc["input"] = "**masked: data.system.log.mask failed**"
		}
	}
	entry.Input, entry.Result = doc["input"], doc["result"]
	if err := e.decisions.writeLine(entry); err != nil {
		e.logger.Error("policy decision log write failed", "error", err)
	}
}

// maskValue evaluates the bundle's mask on doc: plain JSON values, nil when
// the mask is undefined.
func (s *snapshot) maskValue(ctx context.Context, doc map[string]any) (any, error) {
	if s.maskProgram != nil {
		input, err := ast.InterfaceToValue(doc)
		if err != nil {
			return nil, err
		}
		v, err := s.evalProgram(ctx, s.maskProgram, input)
		if !errors.Is(err, irvm.ErrDeferred) {
			if err != nil || v == nil {
				return nil, err
			}
			return ast.JSON(v)
		}
	}
	interp, err := s.interpreter(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := interp.mask.Eval(ctx, rego.EvalInput(doc))
	if err != nil || len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, err
	}
	return rs[0].Expressions[0].Value, nil
}

func (s *snapshot) applyBundleMask(ctx context.Context, doc map[string]any) ([]string, error) {
	v, err := s.maskValue(ctx, doc)
	if err != nil || v == nil {
		return nil, err
	}
	ops, err := parseMaskOps(v)
	if err != nil {
		return nil, err
	}
	var touched []string
	for _, op := range ops {
		if op.apply(doc) {
			touched = append(touched, "/"+joinPointer(op.path))
		}
	}
	return touched, nil
}

func joinPointer(parts []string) string {
	out := ""
	for i, p := range parts {
		if i > 0 {
			out += "/"
		}
		out += escapePointer(p)
	}
	return out
}

// toDoc turns v into plain JSON values that masks can edit.
func toDoc(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	err = json.Unmarshal(b, &doc)
	return doc, err
}

// fingerprint summarises names, sizes and modification times of the files
// under the given paths, to notice changes cheaply.
func fingerprint(paths ...string) string {
	var h strings.Builder
	for _, p := range paths {
		if p == "" {
			continue
		}
		_ = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				h.WriteString(path + ":error;")
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			fmt.Fprintf(&h, "%s:%d:%d;", path, info.Size(), info.ModTime().UnixNano())
			return nil
		})
	}
	return h.String()
}
