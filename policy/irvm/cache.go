package irvm

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Rules without arguments are functions of input and data. Many of them
// read only a corner of input: a tenant's settings, its GPU caps, its
// network allow-list depend on input.namespace alone. Load finds, for every
// such rule, the input paths its value can depend on (inputDeps), and Eval
// keeps the rule's value across evaluations keyed by the values found at
// those paths, so the next pod of the same tenant looks them up instead of
// deriving them again. Data is the same for every evaluation of a Program
// (a bundle revision); a Program evaluated with other data does not cache.

// maxCacheEntries bounds the values kept per rule. Keys are usually a
// namespace; a rule whose key takes more values than this starts over
// empty, so memory stays bounded and a changing workload is followed.
const maxCacheEntries = 4096

// minCachedSize is the smallest rule (statements, its callees included)
// worth a cache lookup instead of evaluating it. A variable for tests.
var minCachedSize = 24

// path is a sequence of keys below input.
type path []*ast.Term

// deps is what a rule's value depends on in input: nothing but the values
// at some paths and whether other paths exist, or (all) possibly anything.
type deps struct {
	all   bool
	paths []dep
}

// dep is one path of input; exists: only whether every key of it
// resolves matters, not the value there.
type dep struct {
	path   path
	exists bool
	idx    int // in Program.keyPaths, once the dep is part of a cache key
}

// add records that the value at p matters.
func (d *deps) add(p path) { d.record(dep{path: p}) }

// addExists records that whether p exists matters.
func (d *deps) addExists(p path) { d.record(dep{path: p, exists: true}) }

func (d *deps) record(x dep) {
	if len(x.path) == 0 && !x.exists {
		d.all = true
		return
	}
	for i, q := range d.paths {
		if equalPath(q.path, x.path) {
			d.paths[i].exists = q.exists && x.exists // a value dependency covers existence
			return
		}
	}
	d.paths = append(d.paths, x)
}

func (d *deps) merge(o deps) {
	d.all = d.all || o.all
	for _, p := range o.paths {
		d.record(p)
	}
}

func (p path) String() string {
	return ast.Ref(append([]*ast.Term{ast.VarTerm("input")}, p...)).String()
}

func equalPath(a, b path) bool {
	return slices.EqualFunc(a, b, func(x, y *ast.Term) bool { return x.Equal(y) })
}

// inputDeps finds what fn's value depends on in input, its parameter 0.
// It follows every local that holds input or a value reached from it by
// constant keys (DotStmt); any other use of such a local (a built-in
// argument, a comparison, a scan, a return, a key, an insert) makes the
// value at its path a dependency, and so does every DotStmt on it, which
// may fail. A call to another rule adds that rule's dependencies; passing
// input-derived values to a function adds those values.
//
// The walk follows the statements in order, so a local the planner reuses
// for something else in a later rule body (it numbers locals per body)
// stops holding the path it held before: a statement that writes a local
// replaces what it holds. Where control can leave a block early (a
// statement that fails, a break), the walk goes on with everything the
// block's locals held anywhere inside it, and an iteration's body is walked
// until what its locals hold stops growing: this only ever adds
// dependencies.
func inputDeps(fn *function, memo map[*function]*deps) deps {
	if d, ok := memo[fn]; ok {
		if d == nil { // a cycle cannot occur in a plan; be safe
			return deps{all: true}
		}
		return *d
	}
	memo[fn] = nil
	if len(fn.params) == 0 {
		d := deps{all: true}
		memo[fn] = &d
		return d
	}
	w := &depWalk{self: fn.params[0], memo: memo}
	st := heldPaths{fn.params[0]: {path{}}}
	for _, b := range fn.blocks {
		st.join(w.block(b, st.clone()))
	}
	// The rule's value leaves through its return local.
	for _, p := range st[fn.ret] {
		w.d.add(p)
	}
	memo[fn] = &w.d
	return w.d
}

// heldPaths maps locals to the input paths whose values they may hold.
type heldPaths map[int][]path

func (h heldPaths) clone() heldPaths {
	c := make(heldPaths, len(h))
	for l, ps := range h {
		c[l] = slices.Clone(ps)
	}
	return c
}

// add records that l may also hold ps; it reports whether that is new.
func (h heldPaths) add(l int, ps []path) bool {
	grew := false
	for _, p := range ps {
		if !slices.ContainsFunc(h[l], func(q path) bool { return equalPath(p, q) }) {
			h[l] = append(h[l], p)
			grew = true
		}
	}
	return grew
}

// join adds everything o holds; it reports whether h grew.
func (h heldPaths) join(o heldPaths) bool {
	grew := false
	for l, ps := range o {
		grew = h.add(l, ps) || grew
	}
	return grew
}

type depWalk struct {
	self int // the local that holds input
	memo map[*function]*deps
	d    deps
}

// block walks code from the state cur (which it changes) and returns
// everything the locals held at any point in it: control may leave the
// block after any statement.
func (w *depWalk) block(code []instr, cur heldPaths) heldPaths {
	seen := cur.clone()
	set := func(l int, ps []path) {
		if len(ps) == 0 {
			delete(cur, l)
		} else {
			cur[l] = ps
		}
		seen.add(l, ps)
	}
	for i := range code {
		in := &code[i]
		w.uses(in, cur)
		switch in.op {
		case opDot:
			var next []path
			if in.a.konst == nil && in.b.konst != nil {
				for _, p := range cur[in.a.local] {
					next = append(next, append(slices.Clone(p), in.b.konst))
				}
			}
			set(in.t, next)
		case opAssignVar:
			if in.a.konst != nil {
				set(in.t, nil)
			} else {
				set(in.t, slices.Clone(cur[in.a.local]))
			}
		case opAssignVarOnce:
			// It keeps an equal value already there: the local may hold both.
			if in.a.konst == nil {
				cur.add(in.t, cur[in.a.local])
				seen.add(in.t, cur[in.a.local])
			}
		case opCall, opCallBuiltin, opCallDynamic, opLen, opResetLocal, opMakeNull, opMakeNumberInt,
			opMakeNumberRef, opMakeArray, opMakeObject, opMakeSet, opLoadConst, opObjectMerge:
			// A fresh value: what it depends on was recorded where it was
			// made from input (the arguments, the callee's dependencies).
			set(in.t, nil)
		}
		switch in.op {
		case opScan:
			// The key and value are new each round; the body runs any
			// number of times, so walk it until nothing new is held.
			loop := cur.clone()
			delete(loop, in.k)
			delete(loop, in.v)
			for loop.join(w.block(in.blocks[0], loop.clone())) {
			}
			cur.join(loop)
			seen.join(loop)
		case opBlock, opNot, opWith:
			// Blocks run in turn, each may stop anywhere.
			inner := cur.clone()
			for _, b := range in.blocks {
				inner.join(w.block(b, inner.clone()))
			}
			cur.join(inner)
			seen.join(inner)
		}
	}
	return seen
}

// uses records the dependencies of what in reads.
func (w *depWalk) uses(in *instr, cur heldPaths) {
	use := func(o operand) {
		if o.konst != nil {
			return
		}
		for _, p := range cur[o.local] {
			w.d.add(p)
		}
	}
	switch in.op {
	case opDot:
		if in.a.konst == nil {
			for _, p := range cur[in.a.local] {
				if in.b.konst == nil {
					w.d.add(p)
					continue
				}
				// The statement fails where the path does not resolve.
				w.d.addExists(append(slices.Clone(p), in.b.konst))
			}
		}
		use(in.b)
	case opCall:
		for j, a := range in.args {
			if held := cur[a.local]; j == 0 && a.konst == nil && a.local == w.self && len(held) == 1 && len(held[0]) == 0 {
				w.d.merge(inputDeps(in.fn, w.memo)) // input itself, as the callee's input
				continue
			}
			use(a)
		}
	case opCallBuiltin:
		for _, a := range in.args {
			use(a)
		}
	case opScan:
		use(operand{local: in.s})
	case opObjectMerge:
		use(operand{local: in.s})
		use(operand{local: in.k})
	case opCallDynamic:
		w.d.all = true // which rule runs is known only at evaluation time
	case opReturn, opIsDefined, opIsUndefined, opResultSetAdd:
		use(operand{local: in.s})
	case opEqual, opNotEqual, opObjectInsert, opObjectInsertOnce:
		use(in.a)
		use(in.b)
	case opIsArray, opIsObject, opIsSet, opLen, opArrayAppend, opSetAdd, opWith:
		use(in.a)
	}
}

// size is the number of statements fn and the functions it calls hold.
func size(fn *function, seen map[*function]bool) int {
	if seen[fn] {
		return 0
	}
	seen[fn] = true
	n := 0
	var walk func(code []instr)
	walk = func(code []instr) {
		for i := range code {
			n++
			if code[i].fn != nil {
				n += size(code[i].fn, seen)
			}
			for _, b := range code[i].blocks {
				walk(b)
			}
		}
	}
	for _, b := range fn.blocks {
		walk(b)
	}
	return n
}

// ruleCache keeps one rule's values across evaluations.
type ruleCache struct {
	paths   []dep
	entries sync.Map // uint64 key hash -> *cacheEntry
	n       atomic.Int64
	// A rule whose key takes a new value nearly every time (it depends on
	// the pod's name, say) is not worth keeping: after probeLookups, a
	// cache that served fewer than one lookup in four turns itself off.
	lookups, hits atomic.Int64
	off           atomic.Bool
}

const probeLookups = 256

type cacheEntry struct {
	key   []keyPart
	value *ast.Term // nil: the rule is undefined for this key
}

// keyPart is what input holds at one path: how many of its keys resolved,
// and the value when all did.
type keyPart struct {
	depth int
	value *ast.Term
}

// planCaches decides which memoised rules get a cache.
func planCaches(p *Program) {
	memo := map[*function]*deps{}
	for _, fn := range p.funcs {
		if fn.memo < 0 {
			continue
		}
		d := inputDeps(fn, memo)
		if d.all || size(fn, map[*function]bool{}) < minCachedSize {
			continue
		}
		for i := range d.paths {
			d.paths[i].idx = keyPathIndex(p, d.paths[i].path)
		}
		fn.cache = &ruleCache{paths: d.paths}
	}
}

// keyPathIndex is the index of q in p.keyPaths, added if new.
func keyPathIndex(p *Program, q path) int {
	for i, kp := range p.keyPaths {
		if equalPath(kp, q) {
			return i
		}
	}
	p.keyPaths = append(p.keyPaths, q)
	return len(p.keyPaths) - 1
}

// key reads the cache key of c from the evaluation's input.
func (c *ruleCache) key(st *state, buf []keyPart) ([]keyPart, uint64) {
	var h uint64 = 14695981039346656037
	for _, p := range c.paths {
		r := st.resolve(p.idx)
		kp := keyPart{depth: r.depth}
		if r.depth == len(p.path) && !p.exists {
			kp.value = r.term
			h = (h ^ r.hash) * 1099511628211
		}
		h = (h ^ uint64(kp.depth)) * 1099511628211
		buf = append(buf, kp)
	}
	return buf, h
}

// resolvedPath is how far one of Program.keyPaths resolves in the
// evaluation's input: depth keys, to term (when all did), whose hash is hash.
type resolvedPath struct {
	depth int
	term  *ast.Term
	hash  uint64
	done  bool
}

// resolve walks key path i in the evaluation's input the first time a key
// asks for it; rules that share a path (input.namespace) share the walk.
func (st *state) resolve(i int) *resolvedPath {
	r := &st.paths[i]
	if r.done {
		return r
	}
	q := st.p.keyPaths[i]
	cur := st.input
	for _, k := range q {
		if cur = dot(cur, k); cur == nil {
			break
		}
		r.depth++
	}
	if r.depth == len(q) {
		r.term, r.hash = cur, uint64(cur.Hash())
	}
	r.done = true
	return r
}

func sameKey(a, b []keyPart) bool {
	return slices.EqualFunc(a, b, func(x, y keyPart) bool {
		if x.depth != y.depth || (x.value == nil) != (y.value == nil) {
			return false
		}
		return x.value == y.value || ast.Compare(x.value.Value, y.value.Value) == 0
	})
}

// active reports whether the cache is still on.
func (c *ruleCache) active() bool { return !c.off.Load() }

func (c *ruleCache) get(key []keyPart, h uint64) (*ast.Term, bool) {
	n := c.lookups.Add(1)
	e, ok := c.entries.Load(h)
	if !ok || !sameKey(e.(*cacheEntry).key, key) {
		if n == probeLookups && c.hits.Load()*4 < n {
			c.off.Store(true)
			c.entries.Clear()
		}
		return nil, false
	}
	c.hits.Add(1)
	return e.(*cacheEntry).value, true
}

func (c *ruleCache) put(key []keyPart, h uint64, v *ast.Term) {
	if c.off.Load() {
		return
	}
	if c.n.Load() >= maxCacheEntries {
		c.entries.Clear()
		c.n.Store(0)
	}
	// A different key with the same hash keeps its place: the rule is
	// simply evaluated for the newcomer.
	if _, loaded := c.entries.LoadOrStore(h, &cacheEntry{key: slices.Clone(key), value: v}); !loaded {
		c.n.Add(1)
	}
}

// CacheStats describes the rule caches of a Program.
type CacheStats struct {
	Rules   int   // rules with a cache (turned off ones included)
	Off     int   // caches turned off for serving too few lookups
	Lookups int64 // lookups so far, over every rule
	Hits    int64 // lookups served from a cache
}

// CacheStats reports how the rule caches have done so far.
func (p *Program) CacheStats() CacheStats {
	var s CacheStats
	for _, fn := range p.funcs {
		if c := fn.cache; c != nil {
			s.Rules++
			if c.off.Load() {
				s.Off++
			}
			s.Lookups += c.lookups.Load()
			s.Hits += c.hits.Load()
		}
	}
	return s
}
