// Package irvm evaluates a query that OPA has compiled and planned: the
// intermediate representation (package ir) that OPA's own planner produces
// for its Wasm compiler and for rego target plugins. It keeps one invariant:
// it runs a plan exactly or not at all. Load refuses any plan that uses a
// statement or a built-in this package does not implement (ErrUnsupported),
// so the caller can fall back to OPA's interpreter; and Eval hands a single
// evaluation back (ErrDeferred) when it meets what only the interpreter
// decides exactly: an error, or a key the interpreter reads by path in base
// data. It never guesses.
//
// Built-in functions are OPA's own implementations (topdown.GetBuiltin), so
// sprintf, regex.match, net.cidr_contains and the rest behave as they do in
// opa eval. What this package adds is only the control flow of the plan:
// blocks, breaks, scans, negation, with, calls (static and dynamic),
// memoised rules and the merge of rules' values with data under one path.
package irvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/types"
)

// ErrUnsupported is returned by Load for plans this package cannot run.
var ErrUnsupported = errors.New("irvm: plan not supported")

// Program is a loaded plan, immutable and safe for concurrent Eval calls.
type Program struct {
	plan  *function // the query's plan, run like a function without params
	funcs []*function
	caps  *ast.Capabilities
	nmemo int // functions whose results are memoised per evaluation
	// keyPaths are the distinct input paths of every rule cache's key;
	// an evaluation resolves each at most once (state.resolve).
	keyPaths []path
	// needsTime: a built-in of the plan may read the evaluation's clock.
	needsTime bool
	// byPath finds the rules a CallDynamicStmt may call by their path in
	// data (ir.Func.Path, joined with NUL).
	byPath map[string]*function
	// states recycles evaluation states (locals, memo table) between Evals;
	// it goes away with the Program when a bundle is replaced.
	states sync.Pool
	// cacheData is the data of the first evaluation: rule caches serve
	// only evaluations with that same data.
	cacheData atomic.Pointer[ast.Term]
	// deferrals counts evaluations handed to the interpreter (ErrDeferred).
	deferrals atomic.Int64
}

// Deferrals is the number of evaluations so far that returned ErrDeferred.
func (p *Program) Deferrals() int64 { return p.deferrals.Load() }

// function is an ir.Func (or the plan) with every reference resolved.
type function struct {
	name    string
	params  []int
	ret     int
	blocks  [][]instr
	nlocals int
	memo    int        // index in the per-evaluation memo table, -1 if not memoised
	cache   *ruleCache // values kept across evaluations; nil if not cached
}

// operand is a local or a constant.
type operand struct {
	local int
	konst *ast.Term // non-nil: a constant
}

// instr is one resolved statement.
type instr struct {
	op   opcode
	a, b operand
	// target, source, key, value locals (meaning depends on op)
	t, s, k, v int
	n          int64 // BreakStmt index, MakeNumberInt value
	konst      *ast.Term
	blocks     [][]instr // BlockStmt blocks; Scan/Not body is blocks[0]
	fn         *function // CallStmt to a planned function
	args       []operand
	bi         *builtin
	loc        *ast.Location // the Rego the statement comes from
	path       []*ast.Term   // WithStmt: the keys below the local it replaces
	dyn        []operand     // CallDynamicStmt: the path of the rule to call
	base       bool          // DotStmt: the source may be a document of base data (markBaseLookups)
}

type builtin struct {
	name string
	f    topdown.BuiltinFunc
	void bool
}

type opcode uint8

const (
	opReturn opcode = iota
	opCall
	opCallBuiltin
	opBlock
	opBreak
	opDot
	opScan
	opNot
	opAssignVar
	opAssignVarOnce
	opResetLocal
	opMakeNull
	opMakeNumberInt
	opMakeNumberRef
	opMakeArray
	opMakeObject
	opMakeSet
	opEqual
	opNotEqual
	opIsArray
	opIsObject
	opIsSet
	opIsDefined
	opIsUndefined
	opArrayAppend
	opObjectInsert
	opObjectInsertOnce
	opSetAdd
	opResultSetAdd
	opNop
	opLen
	opLoadConst // a composite literal folded at load time
	opWith
	opObjectMerge
	opCallDynamic
	numOpcodes // not an opcode: how many there are
)

// Load resolves policy's single plan. caps lists the built-ins the bundle
// was compiled with; a call to anything else is refused.
func Load(policy *ir.Policy, caps *ast.Capabilities) (*Program, error) {
	if policy == nil || policy.Plans == nil || len(policy.Plans.Plans) != 1 {
		return nil, fmt.Errorf("%w: want exactly one plan", ErrUnsupported)
	}
	if len(policy.UnplannedRules) > 0 {
		return nil, fmt.Errorf("%w: OPA could not plan rule %s", ErrUnsupported, policy.UnplannedRules[0].Path)
	}
	p := &Program{caps: caps}
	l := newLoader(p)
	l.byName = map[string]*function{}
	if policy.Static != nil {
		for _, s := range policy.Static.Strings {
			l.static = append(l.static, ast.StringTerm(s.Value))
			l.raw = append(l.raw, s.Value)
		}
		for _, f := range policy.Static.Files {
			l.files = append(l.files, f.Value)
		}
	}
	if policy.Static != nil {
		for _, b := range policy.Static.BuiltinFuncs {
			if err := l.declare(b); err != nil {
				return nil, err
			}
		}
	}
	var funcs []*ir.Func
	if policy.Funcs != nil {
		funcs = policy.Funcs.Funcs
	}
	for _, f := range funcs {
		fn := &function{name: f.Name, ret: int(f.Return), memo: -1}
		for _, prm := range f.Params {
			fn.params = append(fn.params, int(prm))
		}
		// Rules without arguments take (input, data) and have one value per
		// evaluation: compute them once, as OPA's Wasm runtime does.
		if len(f.Params) == 2 {
			fn.memo = p.nmemo
			p.nmemo++
		}
		l.byName[f.Name] = fn
		p.funcs = append(p.funcs, fn)
		if f.Path != nil {
			if p.byPath == nil {
				p.byPath = map[string]*function{}
			}
			p.byPath[strings.Join(f.Path, "\x00")] = fn
		}
	}
	for i, f := range funcs {
		fn := p.funcs[i]
		for _, b := range f.Blocks {
			code, err := l.block(b, fn)
			if err != nil {
				return nil, fmt.Errorf("function %s: %w", f.Name, err)
			}
			fn.blocks = append(fn.blocks, code)
		}
		foldLiterals(fn)
		fn.nlocals = max(fn.nlocals, fn.ret+1)
		for _, prm := range fn.params {
			fn.nlocals = max(fn.nlocals, prm+1)
		}
	}
	plan := policy.Plans.Plans[0]
	p.plan = &function{name: plan.Name, ret: -1, memo: -1, nlocals: int(ir.Data) + 1}
	for _, b := range plan.Blocks {
		code, err := l.block(b, p.plan)
		if err != nil {
			return nil, fmt.Errorf("plan %s: %w", plan.Name, err)
		}
		p.plan.blocks = append(p.plan.blocks, code)
	}
	foldLiterals(p.plan)
	for _, fn := range p.funcs {
		markBaseLookups(fn)
	}
	markBaseLookups(p.plan)
	planCaches(p)
	p.needsTime = l.readsClock()
	return p, nil
}

type loader struct {
	p        *Program
	byName   map[string]*function
	builtins map[string]*builtin
	decls    map[string]*ast.Builtin // from the capabilities; nil: any OPA built-in
	static   []*ast.Term             // ir.Static.Strings as string terms
	raw      []string                // ir.Static.Strings
	files    []string                // ir.Static.Files
}

// newLoader is a loader for p, which holds the capabilities.
func newLoader(p *Program) *loader {
	l := &loader{p: p, builtins: map[string]*builtin{}}
	if p.caps != nil {
		l.decls = make(map[string]*ast.Builtin, len(p.caps.Builtins))
		for _, b := range p.caps.Builtins {
			l.decls[b.Name] = b
		}
	}
	return l
}

// readsClock reports whether a built-in the program calls may read the
// evaluation's clock.
func (l *loader) readsClock() bool {
	for _, b := range l.builtins {
		if strings.HasPrefix(b.name, "time.") || strings.HasPrefix(b.name, "io.jwt.") {
			return true
		}
	}
	return false
}

func (l *loader) declare(b *ir.BuiltinFunc) error {
	if l.decls != nil && l.decls[b.Name] == nil {
		return fmt.Errorf("%w: built-in %s is not in the capabilities", ErrUnsupported, b.Name)
	}
	f := topdown.GetBuiltin(b.Name)
	if f == nil {
		return fmt.Errorf("%w: built-in %s has no implementation", ErrUnsupported, b.Name)
	}
	decl := b.Decl
	if d := ast.BuiltinMap[b.Name]; d != nil {
		if d.Relation {
			return fmt.Errorf("%w: built-in %s is a relation", ErrUnsupported, b.Name)
		}
		if d.IsNondeterministic() {
			return fmt.Errorf("%w: built-in %s is non-deterministic", ErrUnsupported, b.Name)
		}
		decl = d.Decl
	}
	l.builtins[b.Name] = &builtin{name: b.Name, f: f, void: decl == nil || voidResult(decl)}
	return nil
}

func voidResult(decl *types.Function) bool { return decl.Result() == nil }

func (l *loader) operand(o ir.Operand, fn *function) (operand, error) {
	val := o.Value
	// A plan read back from JSON (ir.Operand.UnmarshalJSON) holds pointers.
	switch p := val.(type) {
	case *ir.Local:
		val = *p
	case *ir.Bool:
		val = *p
	case *ir.StringIndex:
		val = *p
	}
	switch v := val.(type) {
	case ir.Local:
		l.use(fn, int(v))
		return operand{local: int(v)}, nil
	case ir.Bool:
		return operand{konst: ast.BooleanTerm(bool(v))}, nil
	case ir.StringIndex:
		if int(v) < 0 || int(v) >= len(l.static) {
			return operand{}, fmt.Errorf("string constant %d out of range", v)
		}
		return operand{konst: l.static[v]}, nil
	default:
		return operand{}, fmt.Errorf("%w: operand %T", ErrUnsupported, val)
	}
}

func (l *loader) use(fn *function, locals ...int) {
	for _, x := range locals {
		fn.nlocals = max(fn.nlocals, x+1)
	}
}

func (l *loader) block(b *ir.Block, fn *function) ([]instr, error) {
	code := make([]instr, 0, len(b.Stmts))
	for _, s := range b.Stmts {
		in, err := l.stmt(s, fn)
		if err != nil {
			var located *locatedError
			if !errors.As(err, &located) { // the innermost statement names the place
				loc := s.GetLocation()
				file := ""
				if loc.File >= 0 && loc.File < len(l.files) {
					file = l.files[loc.File]
				}
				err = &locatedError{file: file, row: loc.Row, col: loc.Col, err: err}
			}
			return nil, err
		}
		code = append(code, in)
	}
	return code, nil
}

// locatedError names the Rego source of a statement Load refused.
type locatedError struct {
	file     string
	row, col int
	err      error
}

func (e *locatedError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %v", e.file, e.row, e.col, e.err)
}

func (e *locatedError) Unwrap() error { return e.err }

// location is loc with its file named, as OPA's interpreter locates
// errors.
func (l *loader) location(loc *ir.Location) *ast.Location {
	file := ""
	if loc.File >= 0 && loc.File < len(l.files) {
		file = l.files[loc.File]
	}
	return &ast.Location{File: file, Row: loc.Row, Col: loc.Col, Text: loc.Text}
}

func (l *loader) stmt(s ir.Stmt, fn *function) (instr, error) {
	in := instr{loc: l.location(s.GetLocation())}
	var err error
	ops := func(dst ...*operand) func(...ir.Operand) {
		return func(src ...ir.Operand) {
			for i := range src {
				if err == nil {
					*dst[i], err = l.operand(src[i], fn)
				}
			}
		}
	}
	switch x := s.(type) {
	case *ir.ReturnLocalStmt:
		in.op, in.s = opReturn, int(x.Source)
		l.use(fn, in.s)
	case *ir.CallStmt:
		in.t = int(x.Result)
		l.use(fn, in.t)
		in.args = make([]operand, len(x.Args))
		for i, a := range x.Args {
			if in.args[i], err = l.operand(a, fn); err != nil {
				return in, err
			}
		}
		if callee, ok := l.byName[x.Func]; ok {
			if len(callee.params) != len(x.Args) {
				return in, fmt.Errorf("call %s: %d arguments for %d parameters", x.Func, len(x.Args), len(callee.params))
			}
			in.op, in.fn = opCall, callee
			return in, nil
		}
		bi, ok := l.builtins[x.Func]
		if !ok {
			if err := l.declare(&ir.BuiltinFunc{Name: x.Func}); err != nil {
				return in, err
			}
			bi = l.builtins[x.Func]
		}
		in.op, in.bi = opCallBuiltin, bi
	case *ir.BlockStmt:
		in.op = opBlock
		for _, b := range x.Blocks {
			code, err := l.block(b, fn)
			if err != nil {
				return in, err
			}
			in.blocks = append(in.blocks, code)
		}
	case *ir.BreakStmt:
		in.op, in.n = opBreak, int64(x.Index)
	case *ir.DotStmt:
		in.op, in.t = opDot, int(x.Target)
		l.use(fn, in.t)
		ops(&in.a, &in.b)(x.Source, x.Key)
	case *ir.LenStmt:
		in.op, in.t = opLen, int(x.Target)
		l.use(fn, in.t)
		ops(&in.a)(x.Source)
	case *ir.ScanStmt:
		in.op, in.s, in.k, in.v = opScan, int(x.Source), int(x.Key), int(x.Value)
		l.use(fn, in.s, in.k, in.v)
		code, err := l.block(x.Block, fn)
		if err != nil {
			return in, err
		}
		in.blocks = [][]instr{code}
	case *ir.NotStmt:
		in.op = opNot
		code, err := l.block(x.Block, fn)
		if err != nil {
			return in, err
		}
		in.blocks = [][]instr{code}
	case *ir.AssignIntStmt:
		in.op, in.t, in.konst = opAssignVar, int(x.Target), ast.IntNumberTerm(int(x.Value))
		l.use(fn, in.t)
		in.a = operand{konst: in.konst}
	case *ir.AssignVarStmt:
		in.op, in.t = opAssignVar, int(x.Target)
		l.use(fn, in.t)
		ops(&in.a)(x.Source)
	case *ir.AssignVarOnceStmt:
		in.op, in.t = opAssignVarOnce, int(x.Target)
		l.use(fn, in.t)
		ops(&in.a)(x.Source)
	case *ir.ResetLocalStmt:
		in.op, in.t = opResetLocal, int(x.Target)
		l.use(fn, in.t)
	case *ir.MakeNullStmt:
		in.op, in.t, in.konst = opMakeNull, int(x.Target), ast.NullTerm()
		l.use(fn, in.t)
	case *ir.MakeNumberIntStmt:
		in.op, in.t, in.konst = opMakeNumberInt, int(x.Target), ast.IntNumberTerm(int(x.Value))
		l.use(fn, in.t)
	case *ir.MakeNumberRefStmt:
		in.op, in.t = opMakeNumberRef, int(x.Target)
		l.use(fn, in.t)
		if x.Index < 0 || x.Index >= len(l.raw) {
			return in, fmt.Errorf("number constant %d out of range", x.Index)
		}
		in.konst = ast.NumberTerm(json.Number(l.raw[x.Index]))
	case *ir.MakeArrayStmt:
		in.op, in.t, in.n = opMakeArray, int(x.Target), int64(x.Capacity)
		l.use(fn, in.t)
	case *ir.MakeObjectStmt:
		in.op, in.t = opMakeObject, int(x.Target)
		l.use(fn, in.t)
	case *ir.MakeSetStmt:
		in.op, in.t = opMakeSet, int(x.Target)
		l.use(fn, in.t)
	case *ir.EqualStmt:
		in.op = opEqual
		ops(&in.a, &in.b)(x.A, x.B)
	case *ir.NotEqualStmt:
		in.op = opNotEqual
		ops(&in.a, &in.b)(x.A, x.B)
	case *ir.IsArrayStmt:
		in.op = opIsArray
		ops(&in.a)(x.Source)
	case *ir.IsObjectStmt:
		in.op = opIsObject
		ops(&in.a)(x.Source)
	case *ir.IsSetStmt:
		in.op = opIsSet
		ops(&in.a)(x.Source)
	case *ir.IsDefinedStmt:
		in.op, in.s = opIsDefined, int(x.Source)
		l.use(fn, in.s)
	case *ir.IsUndefinedStmt:
		in.op, in.s = opIsUndefined, int(x.Source)
		l.use(fn, in.s)
	case *ir.ArrayAppendStmt:
		in.op, in.t = opArrayAppend, int(x.Array)
		l.use(fn, in.t)
		ops(&in.a)(x.Value)
	case *ir.ObjectInsertStmt:
		in.op, in.t = opObjectInsert, int(x.Object)
		l.use(fn, in.t)
		ops(&in.a, &in.b)(x.Key, x.Value)
	case *ir.ObjectInsertOnceStmt:
		in.op, in.t = opObjectInsertOnce, int(x.Object)
		l.use(fn, in.t)
		ops(&in.a, &in.b)(x.Key, x.Value)
	case *ir.SetAddStmt:
		in.op, in.t = opSetAdd, int(x.Set)
		l.use(fn, in.t)
		ops(&in.a)(x.Value)
	case *ir.ResultSetAddStmt:
		in.op, in.s = opResultSetAdd, int(x.Value)
		l.use(fn, in.s)
	case *ir.NopStmt:
		in.op = opNop
	case *ir.CallDynamicStmt:
		// A rule chosen by values known only at evaluation time, such as
		// data.t.pkgs[input.p].allow.
		in.op, in.t = opCallDynamic, int(x.Result)
		l.use(fn, in.t)
		if len(x.Args) != 2 {
			return in, fmt.Errorf("%w: dynamic call with %d arguments", ErrUnsupported, len(x.Args))
		}
		for _, a := range x.Args {
			l.use(fn, int(a))
			in.args = append(in.args, operand{local: int(a)})
		}
		for _, seg := range x.Path {
			o, err := l.operand(seg, fn)
			if err != nil {
				return in, err
			}
			in.dyn = append(in.dyn, o)
		}
	case *ir.ObjectMergeStmt:
		// The planner merges a base document from data (A) with the
		// rules' values under the same path (B).
		in.op, in.s, in.k, in.t = opObjectMerge, int(x.A), int(x.B), int(x.Target)
		l.use(fn, in.s, in.k, in.t)
	case *ir.WithStmt:
		in.op, in.t = opWith, int(x.Local)
		l.use(fn, in.t)
		for _, k := range x.Path {
			if k < 0 || k >= len(l.static) {
				return in, fmt.Errorf("with: string constant %d out of range", k)
			}
			in.path = append(in.path, l.static[k])
		}
		ops(&in.a)(x.Value)
		code, err := l.block(x.Block, fn)
		if err != nil {
			return in, err
		}
		in.blocks = [][]instr{code}
	default:
		// A statement added to OPA after this package was written: OPA's
		// interpreter runs it; this package does not pretend to.
		return in, fmt.Errorf("%w: statement %T", ErrUnsupported, s)
	}
	return in, err
}

// foldLiterals replaces each composite literal of fn (a MakeArray,
// MakeObject or MakeSet followed by inserts of constants, which is how the
// planner builds `{"warn", "audit"}` or the `[]` of object.get(x, k, []))
// by its value, built once here instead of on every evaluation. A literal
// is folded only when nothing reads it before its last insert and no other
// statement of fn mutates the local it lives in, or a local it is copied
// to: folded values are shared by every evaluation and never mutated.
func foldLiterals(fn *function) {
	inserts, copies := map[int]int{}, map[int][]int{}
	var scan func(code []instr)
	scan = func(code []instr) {
		for i := range code {
			in := &code[i]
			if isInsert(in.op) {
				inserts[in.t]++
			}
			if (in.op == opAssignVar || in.op == opAssignVarOnce) && in.a.konst == nil {
				copies[in.a.local] = append(copies[in.a.local], in.t)
			}
			for _, b := range in.blocks {
				scan(b)
			}
		}
	}
	for _, b := range fn.blocks {
		scan(b)
	}
	// shared reports whether a value in local x is safe to share: no copy
	// of it is ever mutated.
	var shared func(x int, seen map[int]bool) bool
	shared = func(x int, seen map[int]bool) bool {
		if seen[x] {
			return true
		}
		seen[x] = true
		for _, y := range copies[x] {
			if inserts[y] > 0 || !shared(y, seen) {
				return false
			}
		}
		return true
	}
	var fold func(code []instr) []instr
	fold = func(code []instr) []instr {
		known := map[int]*ast.Term{} // locals that hold a constant at this point of the block
		out := make([]instr, 0, len(code))
		for i := 0; i < len(code); i++ {
			in := code[i]
			for j := range in.blocks {
				in.blocks[j] = fold(in.blocks[j])
			}
			if v, end, n, ok := literal(code, i, known); ok && n == inserts[in.t] && shared(in.t, map[int]bool{}) {
				// Keep what the window computed besides the literal (numbers
				// used as its elements), drop the literal's own inserts.
				out = append(out, instr{op: opLoadConst, t: in.t, konst: v, loc: in.loc})
				for k := i + 1; k <= end; k++ {
					if !(isInsert(code[k].op) && code[k].t == in.t) {
						out = append(out, code[k])
						known[code[k].t] = code[k].konst
					}
				}
				known[in.t] = v
				i = end
				continue
			}
			out = append(out, in)
			if isConstant(in.op) {
				known[in.t] = in.konst
			} else {
				forget(known, &in)
			}
		}
		return out
	}
	for i := range fn.blocks {
		fn.blocks[i] = fold(fn.blocks[i])
	}
	sizeObjects(fn.blocks)
}

// sizeObjects gives every MakeObject the number of inserts into its local
// that follow it in the same block: the object is made that large at once.
func sizeObjects(blocks [][]instr) {
	for _, code := range blocks {
		for i := range code {
			sizeObjects(code[i].blocks)
			if code[i].op != opMakeObject {
				continue
			}
			n := 0
			for k := i + 1; k < len(code); k++ {
				if (code[k].op == opObjectInsert || code[k].op == opObjectInsertOnce) && code[k].t == code[i].t {
					n++
				}
			}
			code[i].n = int64(n)
		}
	}
}

// literal reports whether code[i] starts a foldable literal: its value, the
// index of its last insert and the number of inserts. Between the Make and
// that insert only constant producers may run.
func literal(code []instr, i int, known map[int]*ast.Term) (*ast.Term, int, int, bool) {
	mk := &code[i]
	var v ast.Value
	switch mk.op {
	case opMakeArray:
		v = ast.NewArray()
	case opMakeObject:
		v = ast.NewObject()
	case opMakeSet:
		v = ast.NewSet()
	default:
		return nil, 0, 0, false
	}
	consts := map[int]*ast.Term{}
	for x, t := range known {
		consts[x] = t
	}
	value := func(o operand) *ast.Term {
		if o.konst != nil {
			return o.konst
		}
		return consts[o.local]
	}
	end, n := i, 0
	for k := i + 1; k < len(code); k++ {
		in := &code[k]
		if !isInsert(in.op) || in.t != mk.t {
			if !isConstant(in.op) {
				break // anything else may read the literal or change its elements
			}
			consts[in.t] = in.konst
			continue
		}
		a, b := value(in.a), value(in.b)
		switch {
		case in.op == opArrayAppend && a != nil:
			v = v.(*ast.Array).Append(a)
		case in.op == opSetAdd && a != nil:
			v.(ast.Set).Add(a)
		case in.op == opObjectInsert && a != nil && b != nil:
			v.(ast.Object).Insert(a, b)
		default: // an element that is not constant, or an insert that may conflict
			return nil, 0, 0, false
		}
		end, n = k, n+1
	}
	return ast.NewTerm(v), end, n, true
}

func isInsert(op opcode) bool {
	return op == opArrayAppend || op == opObjectInsert || op == opObjectInsertOnce || op == opSetAdd
}

// isConstant: the statement sets in.t to in.konst.
func isConstant(op opcode) bool {
	return op == opMakeNull || op == opMakeNumberInt || op == opMakeNumberRef || op == opLoadConst
}

// forget drops from known every local in may write.
func forget(known map[int]*ast.Term, in *instr) {
	switch in.op {
	case opCall, opCallBuiltin, opCallDynamic, opDot, opLen, opAssignVar, opAssignVarOnce, opResetLocal, opObjectMerge,
		opMakeArray, opMakeObject, opMakeSet, opArrayAppend, opObjectInsert, opObjectInsertOnce, opSetAdd:
		delete(known, in.t)
	case opScan:
		delete(known, in.k)
		delete(known, in.v)
	}
	if len(in.blocks) > 0 {
		// Nested blocks may write any local: keep nothing across them.
		clear(known)
	}
}

// markBaseLookups flags every DotStmt of fn whose source may be a document
// of base data: the data local itself or anything reached from it by
// lookups, iterations, copies, merges and withs (a superset: the flag only
// makes Eval check the key, see valueKey). Rules and functions take data as
// their second parameter; the plan has it in local ir.Data.
func markBaseLookups(fn *function) {
	base := map[int]bool{}
	switch {
	case fn.ret < 0: // the plan
		base[int(ir.Data)] = true
	case len(fn.params) >= 2:
		base[fn.params[1]] = true
	default: // not a shape the planner makes: suspect every parameter
		for _, p := range fn.params {
			base[p] = true
		}
	}
	from := func(o operand) bool { return o.konst == nil && base[o.local] }
	var walk func(code []instr, visit func(*instr))
	walk = func(code []instr, visit func(*instr)) {
		for i := range code {
			visit(&code[i])
			for _, b := range code[i].blocks {
				walk(b, visit)
			}
		}
	}
	for grew := true; grew; {
		grew = false
		mark := func(l int) {
			if !base[l] {
				base[l], grew = true, true
			}
		}
		for _, b := range fn.blocks {
			walk(b, func(in *instr) {
				switch in.op {
				case opDot, opAssignVar, opAssignVarOnce, opWith:
					if from(in.a) {
						mark(in.t)
					}
				case opScan:
					if base[in.s] {
						mark(in.v)
					}
				case opObjectMerge:
					if base[in.s] || base[in.k] {
						mark(in.t)
					}
				}
			})
		}
	}
	for _, b := range fn.blocks {
		walk(b, func(in *instr) {
			if in.op == opDot && from(in.a) {
				in.base = true
			}
		})
	}
}
