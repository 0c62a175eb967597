package irvm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
	"github.com/open-policy-agent/opa/v1/topdown/builtins"
)

// Control results of running a block, besides a break count (>= 0): the
// block ran to its end, or a ReturnLocalStmt ended the function.
const (
	fellThrough = -1
	returned    = -2
)

// Eval runs the plan on input and data (either may be nil: undefined) and
// returns the result set: one object per result, keyed by query variable,
// as OPA's Wasm runtime returns it. An empty result set means undefined.
// Every error but the context's is a *DeferredError (errors.Is ErrDeferred):
// the caller must ask OPA's interpreter, whose answer may be a value (its
// rule index can skip the body whose built-in failed here) or an error.
func (p *Program) Eval(ctx context.Context, input, data *ast.Term) ([]*ast.Term, error) {
	st := p.state()
	defer p.release(st)
	st.ctx = ctx
	st.input = input
	p.cacheData.CompareAndSwap(nil, data)
	st.cached = data != nil && p.cacheData.Load() == data
	st.bctx = topdown.BuiltinContext{
		Context:      ctx,
		Seed:         rand.Reader,
		Cache:        st.cache,
		Capabilities: p.caps,
	}
	if p.needsTime {
		st.bctx.Time = ast.IntNumberTerm(int(time.Now().UnixNano()))
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	args := []*ast.Term{input, data}
	if _, err := st.call(p.plan, args); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		p.deferrals.Add(1)
		return nil, &DeferredError{Cause: err}
	}
	return st.results, nil
}

type state struct {
	p       *Program
	ctx     context.Context
	input   *ast.Term
	cached  bool // rule caches apply: this evaluation has the Program's data
	bctx    topdown.BuiltinContext
	cache   builtins.Cache
	memo    []*ast.Term
	memoSet []bool
	results []*ast.Term
	retval  *ast.Term
	out     *ast.Term
	outFn   func(*ast.Term) error
	args    []*ast.Term // a built-in's arguments
	stack   []*ast.Term // frames' locals, allocated last in first out
	frame   scanFrame   // the innermost scan running
	// objectStep is scanStep as the func ast.Object.Iter takes, made once
	// per state rather than once per scan.
	objectStep func(k, v *ast.Term) error
	keys       []keyPart      // cache keys being looked up, last in first out
	paths      []resolvedPath // Program.keyPaths in this evaluation's input
	top        int
	high       int // highest top since the state was cleared
	ticks      int
}

func (p *Program) state() *state {
	if st, ok := p.states.Get().(*state); ok {
		return st
	}
	st := &state{p: p, cache: builtins.Cache{}, memo: make([]*ast.Term, p.nmemo), memoSet: make([]bool, p.nmemo), stack: make([]*ast.Term, 1024),
		paths: make([]resolvedPath, len(p.keyPaths))}
	st.outFn = func(t *ast.Term) error {
		if st.out == nil {
			st.out = t
		}
		return nil
	}
	st.objectStep = st.scanStep
	return st
}

// release drops every reference the evaluation held and pools the state.
func (p *Program) release(st *state) {
	clear(st.memo)
	clear(st.memoSet)
	clear(st.paths)
	clear(st.stack[:st.high])
	clear(st.cache)
	clear(st.args[:cap(st.args)])
	clear(st.keys[:cap(st.keys)])
	st.keys, st.frame = st.keys[:0], scanFrame{}
	st.results, st.retval, st.out, st.top, st.high, st.input = nil, nil, nil, 0, 0, nil
	st.ctx, st.bctx = nil, topdown.BuiltinContext{}
	p.states.Put(st)
}

func (st *state) alloc(n int) []*ast.Term {
	if st.top+n > len(st.stack) {
		// Frames already handed out keep the old array; the new one only
		// serves frames from here on.
		st.stack = make([]*ast.Term, 2*len(st.stack)+n)
		st.high = 0
	}
	locals := st.stack[st.top : st.top+n : st.top+n]
	clear(locals)
	st.top += n
	st.high = max(st.high, st.top)
	return locals
}

// call returns fn's value for args (nil: undefined). A rule without
// arguments is computed once per evaluation, and a rule with a cache is
// looked up there first and kept there after.
func (st *state) call(fn *function, args []*ast.Term) (*ast.Term, error) {
	if fn.memo >= 0 && st.memoSet[fn.memo] {
		return st.memo[fn.memo], nil
	}
	c := fn.cache
	if c == nil || !st.cached || !c.active() {
		return st.invoke(fn, args)
	}
	top := len(st.keys)
	var h uint64
	st.keys, h = c.key(st, st.keys)
	key := st.keys[top:len(st.keys):len(st.keys)]
	if v, ok := c.get(key, h); ok {
		st.keys = st.keys[:top]
		st.memo[fn.memo], st.memoSet[fn.memo] = v, true
		return v, nil
	}
	res, err := st.invoke(fn, args)
	if err == nil {
		c.put(key, h, res) // copies key
	}
	st.keys = st.keys[:top]
	return res, err
}

// invoke runs fn with args bound to its parameters.
func (st *state) invoke(fn *function, args []*ast.Term) (*ast.Term, error) {
	if st.ticks++; st.ticks&0xff == 0 {
		if err := st.ctx.Err(); err != nil {
			return nil, err
		}
	}
	top := st.top
	locals := st.alloc(fn.nlocals)
	switch {
	case len(fn.params) > 0:
		for i, prm := range fn.params {
			locals[prm] = args[i]
		}
	default: // the plan: input and data are locals 0 and 1
		locals[0], locals[1] = args[0], args[1]
	}
	var result *ast.Term
	done := false
	for _, block := range fn.blocks {
		r, err := st.run(block, locals)
		if err != nil {
			st.top = top
			return nil, err
		}
		if r == returned {
			result, done = st.retval, true
			break
		}
		if r >= 1 { // a break out of the function's body
			break
		}
	}
	if !done && fn.ret >= 0 {
		result = locals[fn.ret]
	}
	st.top = top
	if fn.memo >= 0 {
		st.memo[fn.memo], st.memoSet[fn.memo] = result, true
	}
	return result, nil
}

func val(o *operand, locals []*ast.Term) *ast.Term {
	if o.konst != nil {
		return o.konst
	}
	return locals[o.local]
}

// run executes code, one block. It returns fellThrough when the block ran to
// its end, returned after a ReturnLocalStmt, or the number of enclosing
// blocks still to leave: 0 when this block was left (a statement was
// undefined, or BreakStmt 0).
func (st *state) run(code []instr, L []*ast.Term) (int, error) {
	for i := range code {
		in := &code[i]
		switch in.op {
		case opReturn:
			st.retval = L[in.s]
			return returned, nil
		case opCall:
			// The callee binds its arguments to locals of its own frame.
			var buf [8]*ast.Term
			args := buf[:0]
			for j := range in.args {
				args = append(args, val(&in.args[j], L))
			}
			res, err := st.call(in.fn, args)
			if err != nil {
				return 0, err
			}
			if res == nil {
				return 0, nil
			}
			L[in.t] = res
		case opCallBuiltin:
			st.args = st.args[:0]
			for j := range in.args {
				a := val(&in.args[j], L)
				if a == nil {
					return 0, nil
				}
				st.args = append(st.args, a)
			}
			st.out = nil
			st.bctx.Location = in.loc
			if err := in.bi.f(st.bctx, st.args, st.outFn); err != nil {
				var halt topdown.Halt
				if errors.As(err, &halt) {
					err = halt.Err
				}
				return 0, err
			}
			if in.bi.void {
				continue
			}
			if st.out == nil {
				return 0, nil
			}
			L[in.t] = st.out
		case opBlock:
			for _, b := range in.blocks {
				r, err := st.run(b, L)
				if err != nil || r == returned {
					return r, err
				}
				if r >= 1 {
					return r - 1, nil
				}
			}
		case opBreak:
			return int(in.n), nil
		case opDot:
			src, key := val(&in.a, L), val(&in.b, L)
			if in.base && !valueKey(src, key) {
				return 0, deferred(in, "a lookup into base data with a %s key into a %s: OPA's interpreter reads base data by path, converting the key", ast.ValueName(key.Value), ast.ValueName(src.Value))
			}
			res := dot(src, key)
			if res == nil {
				return 0, nil
			}
			L[in.t] = res
		case opLen:
			n, ok := length(val(&in.a, L))
			if !ok {
				return 0, nil
			}
			L[in.t] = ast.InternedTerm(n)
		case opScan:
			r, err := st.scan(in, L)
			if err != nil || r == returned {
				return r, err
			}
			if r >= 0 {
				return r, nil
			}
		case opCallDynamic:
			// As OPA plans it: no rule at the path leaves this block (the
			// planner then looks the path up in data), a rule that is
			// undefined leaves three, the rule's value goes to in.t.
			callee := st.p.dynamicCallee(in, L)
			if callee == nil {
				return 0, nil
			}
			args := [2]*ast.Term{val(&in.args[0], L), val(&in.args[1], L)}
			res, err := st.call(callee, args[:])
			if err != nil {
				return 0, err
			}
			if res == nil {
				return 3, nil
			}
			L[in.t] = res
		case opObjectMerge:
			merged, err := merge(L[in.s], L[in.k])
			if err != nil {
				return 0, conflict(in, err.Error())
			}
			L[in.t] = merged
		case opWith:
			r, err := st.with(in, L)
			switch {
			case err != nil || r == returned:
				return r, err
			case r == 0: // the block was left: with is undefined
				return 0, nil
			case r >= 1:
				return r - 1, nil
			}
		case opNot:
			r, err := st.run(in.blocks[0], L)
			switch {
			case err != nil || r == returned:
				return r, err
			case r == fellThrough: // the negated block held: not fails
				return 0, nil
			case r >= 1:
				return r - 1, nil
			}
		case opAssignVar:
			L[in.t] = val(&in.a, L)
		case opAssignVarOnce:
			v := val(&in.a, L)
			if cur := L[in.t]; cur == nil {
				L[in.t] = v
			} else if v == nil || ast.Compare(cur.Value, v.Value) != 0 {
				return 0, conflict(in, "complete rules and functions must not produce multiple outputs")
			}
		case opResetLocal:
			L[in.t] = nil
		case opMakeNull, opMakeNumberInt, opMakeNumberRef, opLoadConst:
			L[in.t] = in.konst
		case opMakeArray:
			if in.n == 0 {
				L[in.t] = ast.NewTerm(emptyArray)
			} else {
				L[in.t] = ast.NewTerm(ast.NewArrayWithCapacity(int(in.n)))
			}
		case opMakeObject:
			if in.n == 0 {
				L[in.t] = ast.NewTerm(emptyObject)
			} else {
				L[in.t] = ast.NewTerm(ast.NewObjectWithCapacity(int(in.n)))
			}
		case opMakeSet:
			L[in.t] = ast.NewTerm(emptySet)
		case opEqual, opNotEqual:
			a, b := val(&in.a, L), val(&in.b, L)
			if a == nil || b == nil {
				return 0, nil
			}
			if (ast.Compare(a.Value, b.Value) == 0) != (in.op == opEqual) {
				return 0, nil
			}
		case opIsArray, opIsObject, opIsSet:
			if !isType(in.op, val(&in.a, L)) {
				return 0, nil
			}
		case opIsDefined:
			if L[in.s] == nil {
				return 0, nil
			}
		case opIsUndefined:
			if L[in.s] != nil {
				return 0, nil
			}
		case opArrayAppend:
			arr, ok := valueOf[*ast.Array](L[in.t])
			v := val(&in.a, L)
			if !ok || v == nil {
				return 0, internal(in, "ArrayAppendStmt on a non-array")
			}
			// In place, like OPA's Wasm runtime: every local holding this
			// array sees the element.
			L[in.t].Value = arr.Append(v)
		case opObjectInsert, opObjectInsertOnce:
			obj, ok := valueOf[ast.Object](L[in.t])
			k, v := val(&in.a, L), val(&in.b, L)
			if !ok || k == nil || v == nil {
				return 0, internal(in, "ObjectInsertStmt on a non-object")
			}
			if obj == emptyObject {
				obj = ast.NewObject()
				L[in.t].Value = obj
			}
			if in.op == opObjectInsertOnce {
				if cur := obj.Get(k); cur != nil {
					if ast.Compare(cur.Value, v.Value) != 0 {
						return 0, conflict(in, "object keys must be unique")
					}
					continue
				}
			}
			obj.Insert(k, v)
		case opSetAdd:
			set, ok := valueOf[ast.Set](L[in.t])
			v := val(&in.a, L)
			if !ok || v == nil {
				return 0, internal(in, "SetAddStmt on a non-set")
			}
			if set == emptySet {
				set = ast.NewSet()
				L[in.t].Value = set
			}
			set.Add(v)
		case opResultSetAdd:
			if L[in.s] != nil {
				st.results = append(st.results, L[in.s])
			}
		case opNop:
		}
	}
	return fellThrough, nil
}

// with runs in.blocks[0] with the local in.t replaced: the whole local when
// in.path is empty, else the value at in.path inside it, the objects on the
// way copied (never changed in place: other locals may share them). Rules
// evaluated inside see the replaced input or data, so they get a memo table
// of their own and no rule cache. It returns what running the block did.
func (st *state) with(in *instr, L []*ast.Term) (int, error) {
	v := val(&in.a, L)
	saved := L[in.t]
	switch {
	case len(in.path) == 0:
		// The planner restores input and data after a with by a WithStmt
		// whose value is the saved local: undefined when there was no input.
		L[in.t] = v
	case v == nil:
		return 0, nil
	default:
		L[in.t] = upsert(saved, in.path, v)
	}
	memo, memoSet, cached := slices.Clone(st.memo), slices.Clone(st.memoSet), st.cached
	clear(st.memo)
	clear(st.memoSet)
	clear(st.paths)
	st.cached = false
	r, err := st.run(in.blocks[0], L)
	copy(st.memo, memo)
	copy(st.memoSet, memoSet)
	st.cached, L[in.t] = cached, saved
	return r, err
}

// upsert is doc with the value at path set to v: doc and the objects along
// path are copied, a missing or non-object step becomes a new object, as
// OPA's interpreter does it (topdown's mergeTermWithValues): a document that
// is not an object, or is undefined, is replaced by a new one.
func upsert(doc *ast.Term, path []*ast.Term, v *ast.Term) *ast.Term {
	var root ast.Object
	if d, ok := valueOf[ast.Object](doc); ok {
		root = d.Copy()
	} else {
		root = ast.NewObject()
	}
	cur := root
	for _, k := range path[:len(path)-1] {
		var next ast.Object
		if child, ok := valueOf[ast.Object](cur.Get(k)); ok {
			next = child.Copy()
		} else {
			next = ast.NewObject()
		}
		cur.Insert(k, ast.NewTerm(next))
		cur = next
	}
	cur.Insert(path[len(path)-1], v)
	return ast.NewTerm(root)
}

// dynamicCallee is the rule at the path in.dyn names, nil when there is
// none (a segment that is not a string cannot name one).
func (p *Program) dynamicCallee(in *instr, L []*ast.Term) *function {
	var b strings.Builder
	for i := range in.dyn {
		s, ok := valueOf[ast.String](val(&in.dyn[i], L))
		if !ok {
			return nil
		}
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(string(s))
	}
	fn := p.byPath[b.String()]
	if fn == nil || len(fn.params) != 2 {
		return nil
	}
	return fn
}

// merge is the base document a with the rules' document b laid over it:
// objects merge key by key, recursively. OPA refuses a bundle whose rules
// define a path its data also holds, so two values other than objects
// under one key are an error, never a silent choice.
func merge(a, b *ast.Term) (*ast.Term, error) {
	if a == nil {
		return b, nil
	}
	if b == nil {
		return a, nil
	}
	ao, aok := a.Value.(ast.Object)
	bo, bok := b.Value.(ast.Object)
	if !aok || !bok {
		return nil, fmt.Errorf("rules and data both define a %s and a %s at one path", ast.ValueName(a.Value), ast.ValueName(b.Value))
	}
	out := ast.NewObjectWithCapacity(ao.Len() + bo.Len())
	var err error
	ao.Foreach(func(k, v *ast.Term) {
		if err != nil {
			return
		}
		m, e := merge(v, bo.Get(k))
		if e != nil {
			err = fmt.Errorf("%v: %w", k, e)
			return
		}
		out.Insert(k, m)
	})
	if err != nil {
		return nil, err
	}
	bo.Foreach(func(k, v *ast.Term) {
		if ao.Get(k) == nil {
			out.Insert(k, v)
		}
	})
	return ast.NewTerm(out), nil
}

// A collection the plan makes starts as one of these shared empty values;
// the first insert replaces it, in the term every alias shares, by a value
// of its own. Most accumulators of a decision (the findings of a package
// that finds nothing) stay empty, and then cost one term instead of three
// allocations. Nothing ever inserts into these.
var (
	emptyArray  = ast.NewArray()
	emptyObject = ast.NewObject()
	emptySet    = ast.NewSet()
)

// errStopScan ends a collection's iteration early.
var errStopScan = errors.New("stop scan")

// scanFrame is the scan in progress: its statement, its frame's locals
// and how it ended. Scans nest; each saves and restores the outer one.
type scanFrame struct {
	in      *instr
	L       []*ast.Term
	outcome int
}

// scan runs the body once per element. The body sits in a loop inside a
// block: a break of 0 moves to the next element, 1 ends the scan, more
// leaves enclosing blocks. It returns fellThrough when the scan completed.
func (st *state) scan(in *instr, L []*ast.Term) (int, error) {
	outer := st.frame
	st.frame = scanFrame{in: in, L: L, outcome: fellThrough}
	var err error
	switch c := valueOrNil(L[in.s]).(type) {
	case *ast.Array:
		for i := range c.Len() {
			if err = st.scanStep(ast.InternedTerm(i), c.Elem(i)); err != nil {
				break
			}
		}
	case ast.Object:
		err = c.Iter(st.objectStep)
	case ast.Set:
		for _, t := range c.Slice() {
			if err = st.scanStep(t, t); err != nil {
				break
			}
		}
	}
	outcome := st.frame.outcome
	st.frame = outer
	if err != nil && err != errStopScan {
		return 0, err
	}
	return outcome, nil
}

// scanStep runs the current scan's body for one element.
func (st *state) scanStep(k, v *ast.Term) error {
	if st.ticks++; st.ticks&0xff == 0 {
		if err := st.ctx.Err(); err != nil {
			return err
		}
	}
	f := &st.frame
	f.L[f.in.k], f.L[f.in.v] = k, v
	r, err := st.run(f.in.blocks[0], f.L)
	switch {
	case err != nil:
		return err
	case r == returned:
		st.frame.outcome = returned
		return errStopScan
	case r == 1:
		return errStopScan
	case r >= 2:
		st.frame.outcome = r - 2
		return errStopScan
	}
	return nil
}

func valueOrNil(t *ast.Term) ast.Value {
	if t == nil {
		return nil
	}
	return t.Value
}

func valueOf[T ast.Value](t *ast.Term) (T, bool) {
	var zero T
	if t == nil {
		return zero, false
	}
	v, ok := t.Value.(T)
	return v, ok
}

// valueKey reports whether src[key] means the same for a document of
// base data as for a value: an object's key that is a string, an array's
// index that is a number, or a source that holds no element at all.
// OPA's interpreter reads a ref into base data by its path, the keys turned
// into strings (storage.NewPathForRef): data.x[2] finds data.x["2"], and
// data.a["1"] the element 1 of an array; the same keys on a value (a rule's,
// or base data bound to a variable first) find nothing. The plan does not
// say which of the two a lookup is, so those keys go to the interpreter.
func valueKey(src, key *ast.Term) bool {
	if src == nil || key == nil {
		return true
	}
	switch src.Value.(type) {
	case ast.Object:
		_, ok := key.Value.(ast.String)
		return ok
	case *ast.Array:
		_, ok := key.Value.(ast.Number)
		return ok
	case ast.Set:
		return false
	}
	return true
}

// dot is source[key]: an object's value, an array's element, a set's member.
func dot(src, key *ast.Term) *ast.Term {
	if src == nil || key == nil {
		return nil
	}
	switch c := src.Value.(type) {
	case ast.Object:
		return c.Get(key)
	case *ast.Array:
		n, ok := key.Value.(ast.Number)
		if !ok {
			return nil
		}
		i, ok := n.Int()
		if !ok || i < 0 || i >= c.Len() {
			return nil
		}
		return c.Elem(i)
	case ast.Set:
		if c.Contains(key) {
			return key
		}
	}
	return nil
}

func length(t *ast.Term) (int, bool) {
	switch c := valueOrNil(t).(type) {
	case *ast.Array:
		return c.Len(), true
	case ast.Object:
		return c.Len(), true
	case ast.Set:
		return c.Len(), true
	case ast.String:
		return utf8.RuneCountInString(string(c)), true
	}
	return 0, false
}

func isType(op opcode, t *ast.Term) bool {
	switch valueOrNil(t).(type) {
	case *ast.Array:
		return op == opIsArray
	case ast.Object:
		return op == opIsObject
	case ast.Set:
		return op == opIsSet
	}
	return false
}

// ErrDeferred is what an evaluation returns (errors.Is) when it reached
// something whose outcome only OPA's interpreter decides exactly: an error
// of any kind (the interpreter's rule index may skip the body that raised
// it, and its early exit the conflict), or a lookup that the interpreter
// resolves by path in base data (valueKey). The caller evaluates the same
// input with the interpreter; no value irvm returns is ever replaced.
var ErrDeferred = errors.New("irvm: evaluation deferred to OPA's interpreter")

// DeferredError carries why an evaluation was deferred.
type DeferredError struct{ Cause error }

func (e *DeferredError) Error() string        { return ErrDeferred.Error() + ": " + e.Cause.Error() }
func (e *DeferredError) Unwrap() error        { return e.Cause }
func (e *DeferredError) Is(target error) bool { return target == ErrDeferred }

// errValueKey is the cause of a deferral by valueKey.
type errValueKey struct{ msg string }

func (e *errValueKey) Error() string { return e.msg }

func deferred(in *instr, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if loc := location(in); loc != nil {
		msg = loc.String() + ": " + msg
	}
	return &errValueKey{msg: msg}
}

func conflict(in *instr, msg string) error {
	return &topdown.Error{Code: topdown.ConflictErr, Message: msg, Location: location(in)}
}

func internal(in *instr, msg string) error {
	return &topdown.Error{Code: topdown.InternalErr, Message: "irvm: " + msg, Location: location(in)}
}

func location(in *instr) *ast.Location {
	if in.loc == nil {
		return nil
	}
	loc := *in.loc // errors travel on; in stays as it is
	return &loc
}
