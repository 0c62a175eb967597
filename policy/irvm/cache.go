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
// input-derived values to a function adds those values. The analysis does
// not follow control flow: a local that may hold several paths holds all
// of them, which only adds dependencies.
func inputDeps(fn *function, memo map[*function]*deps) deps {
	if d, ok := memo[fn]; ok {
		if d == nil { // a cycle cannot occur in a plan; be safe
			return deps{all: true}
		}
		return *d
	}
	memo[fn] = nil
	var d deps
	if len(fn.params) == 0 {
		d.all = true
		memo[fn] = &d
		return d
	}
	held := map[int][]path{fn.params[0]: {path{}}} // locals holding input-derived values
	use := func(o operand) {
		if o.konst != nil {
			return
		}
		for _, p := range held[o.local] {
			d.add(p)
		}
	}
	hold := func(dst int, ps []path) bool {
		grew := false
		for _, p := range ps {
			if !slices.ContainsFunc(held[dst], func(q path) bool { return equalPath(p, q) }) {
				held[dst] = append(held[dst], p)
				grew = true
			}
		}
		return grew
	}
	// Aliases and derived paths may flow backwards through loops of blocks:
	// repeat until nothing new is held.
	for changed := true; changed; {
		changed = false
		var walk func(code []instr)
		walk = func(code []instr) {
			for i := range code {
				in := &code[i]
				switch in.op {
				case opDot:
					if in.a.konst == nil {
						var next []path
						for _, p := range held[in.a.local] {
							if in.b.konst == nil {
								d.add(p)
								continue
							}
							q := append(slices.Clone(p), in.b.konst)
							d.addExists(q) // the statement fails where q does not resolve
							next = append(next, q)
						}
						changed = hold(in.t, next) || changed
					}
					use(in.b)
				case opAssignVar, opAssignVarOnce:
					if in.a.konst == nil {
						changed = hold(in.t, held[in.a.local]) || changed
					}
				case opCall:
					for j, a := range in.args {
						if j == 0 && a.konst == nil && a.local == fn.params[0] && len(held[a.local]) == 1 && len(held[a.local][0]) == 0 {
							d.merge(inputDeps(in.fn, memo)) // input itself, as the callee's input
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
					d.all = true // which rule runs is known only at evaluation time
				case opReturn, opIsDefined, opIsUndefined, opResultSetAdd:
					use(operand{local: in.s})
				case opEqual, opNotEqual, opObjectInsert, opObjectInsertOnce:
					use(in.a)
					use(in.b)
				case opIsArray, opIsObject, opIsSet, opLen, opArrayAppend, opSetAdd, opWith:
					use(in.a)
				}
				for _, b := range in.blocks {
					walk(b)
				}
			}
		}
		for _, b := range fn.blocks {
			walk(b)
		}
	}
	// The rule's value leaves through its return local.
	for _, p := range held[fn.ret] {
		d.add(p)
	}
	memo[fn] = &d
	return d
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
		fn.cache = &ruleCache{paths: d.paths}
	}
}

// key reads the cache key of c from input.
func (c *ruleCache) key(input *ast.Term, buf []keyPart) ([]keyPart, uint64) {
	var h uint64 = 14695981039346656037
	for _, p := range c.paths {
		kp := keyPart{}
		cur := input
		for _, k := range p.path {
			if cur = dot(cur, k); cur == nil {
				break
			}
			kp.depth++
		}
		if kp.depth == len(p.path) && !p.exists {
			kp.value = cur
			h = (h ^ uint64(cur.Hash())) * 1099511628211
		}
		h = (h ^ uint64(kp.depth)) * 1099511628211
		buf = append(buf, kp)
	}
	return buf, h
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
