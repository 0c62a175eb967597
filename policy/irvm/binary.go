package irvm

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
)

// A Program has a binary form, so that a process can skip what Load does
// (OPA's IR read back, every reference resolved, the analyses behind
// literal folding, base-data lookups and rule caches) when an earlier
// process of the same build did it for the same plan: AppendBinary writes
// what Load derived, LoadBinary reads it back into the Program Load made,
// with fresh evaluation state.
//
// The form belongs to a build: nothing but the build that wrote it should
// read it (the policy plan cache keys its entries by the binary), and
// binaryFormat only tells it from other bytes. LoadBinary checks every
// index the evaluator follows (a local within its frame, a callee and its
// arity, a block, a memo slot, a key path, a built-in in the capabilities),
// bounds every count and size by the length of the form, and refuses a
// cycle of calls, so that damaged bytes are an error, never a panic in
// LoadBinary or Eval. It cannot tell a damaged program that is still well
// formed from the one written: that is for the caller to check (the plan
// cache keeps a digest of its entries).
//
// Values, the constants of a plan and the data it runs on, have a binary
// form of their own: AppendValue and ReadValue.

// binaryFormat starts a Program's binary form; it changes whenever what
// the form holds does.
const binaryFormat = "irvm-program/2"

// maxDepth bounds the nesting of blocks and of values in a binary form.
const maxDepth = 1000

// Kinds of value in a binary form.
const (
	kindNull byte = iota
	kindFalse
	kindTrue
	kindNumber
	kindString
	kindArray
	kindObject
	kindSet
)

// AppendValue appends the binary form of v to b. v must be a plain value
// (null, a boolean, a number, a string, or an array, object or set of
// plain values), as data and a plan's constants are; anything else (a
// variable, a reference, a comprehension) is an error.
func AppendValue(b []byte, v ast.Value) ([]byte, error) {
	w := writer{b: b}
	err := w.value(v, 0)
	return w.b, err
}

// ReadValue reads back the value whose binary form is b.
func ReadValue(b []byte) (ast.Value, error) {
	r := reader{s: string(b)}
	v := r.value(0)
	if r.err == nil && len(r.s) > 0 {
		r.fail("%d bytes after the value", len(r.s))
	}
	if r.err != nil {
		return nil, fmt.Errorf("irvm: binary form of a value: %w", r.err)
	}
	return v, nil
}

// AppendBinary appends p's binary form to b. It fails for a constant that
// is not a plain value (AppendValue).
func (p *Program) AppendBinary(b []byte) ([]byte, error) {
	e := &encoder{
		strings: map[string]int{}, locs: map[locationKey]int{}, terms: map[*ast.Term]int{},
		funcs: make(map[*function]int, len(p.funcs)), builtins: map[string]int{},
	}
	for i, fn := range p.funcs {
		e.funcs[fn] = i
	}
	// The body first: writing it fills the tables that precede it. Every
	// function's header comes before any statement, so that a statement
	// is checked against its frame and its callee as it is read.
	body := &writer{}
	body.uint(len(p.keyPaths))
	for _, q := range p.keyPaths {
		e.termList(body, q)
	}
	body.uint(len(p.funcs))
	body.int(p.nmemo)
	fns := append(slices.Clone(p.funcs), p.plan)
	for _, fn := range fns {
		e.header(body, fn)
	}
	for _, fn := range fns {
		e.blocks(body, fn.blocks)
	}
	body.uint(len(p.byPath))
	for _, key := range slices.Sorted(maps.Keys(p.byPath)) {
		body.string(key)
		body.uint(e.funcs[p.byPath[key]])
	}

	w := &writer{b: b}
	w.string(binaryFormat)
	w.uint(e.blockCount)
	w.uint(e.instrCount)
	w.uint(e.operandCount)
	w.uint(len(e.stringList))
	for _, s := range e.stringList {
		w.string(s)
	}
	w.uint(len(e.builtinList))
	for _, name := range e.builtinList {
		w.uint(e.strings[name])
	}
	w.uint(len(e.locList))
	for _, loc := range e.locList {
		w.uint(e.strings[loc.file])
		w.int(loc.row)
		w.int(loc.col)
		w.uint(e.strings[loc.text])
	}
	w.uint(len(e.constList))
	for _, t := range e.constList {
		if err := w.value(t.Value, 0); err != nil {
			return b, fmt.Errorf("irvm: constant %v: %w", t, err)
		}
	}
	return append(w.b, body.b...), nil
}

// encoder gathers the tables of a Program's binary form: every string,
// built-in, location and constant once, referred to by its index.
type encoder struct {
	strings     map[string]int
	stringList  []string
	builtins    map[string]int
	builtinList []string
	locs        map[locationKey]int
	locList     []locationKey
	terms       map[*ast.Term]int
	constList   []*ast.Term
	funcs       map[*function]int
	// How many blocks, statements and operands (of calls) the program
	// holds: LoadBinary allocates each kind at once.
	blockCount, instrCount, operandCount int
}

// locationKey is an ast.Location as the binary form keeps it: an empty
// text is no text.
type locationKey struct {
	file     string
	row, col int
	text     string
}

// index returns the index of x in the table (m, list), added if new.
func index[K comparable](m map[K]int, list *[]K, x K) int {
	i, ok := m[x]
	if !ok {
		i = len(*list)
		m[x] = i
		*list = append(*list, x)
	}
	return i
}

// term writes a reference to t in the term table, 0 for none.
func (e *encoder) term(w *writer, t *ast.Term) {
	if t == nil {
		w.uint(0)
		return
	}
	w.uint(index(e.terms, &e.constList, t) + 1)
}

func (e *encoder) termList(w *writer, ts []*ast.Term) {
	w.uint(len(ts))
	for _, t := range ts {
		e.term(w, t)
	}
}

// header writes every field of fn but its blocks.
func (e *encoder) header(w *writer, fn *function) {
	w.string(fn.name)
	w.uint(len(fn.params))
	for _, prm := range fn.params {
		w.int(prm)
	}
	w.int(fn.ret)
	w.int(fn.nlocals)
	w.int(fn.memo)
	w.bool(fn.cache != nil)
	if fn.cache != nil {
		w.uint(len(fn.cache.paths))
		for _, d := range fn.cache.paths {
			w.uint(d.idx) // d.path is p.keyPaths[d.idx]
			w.bool(d.exists)
		}
	}
}

func (e *encoder) blocks(w *writer, blocks [][]instr) {
	w.uint(len(blocks))
	e.blockCount += len(blocks)
	for _, code := range blocks {
		w.uint(len(code))
		e.instrCount += len(code)
		for i := range code {
			e.instr(w, &code[i])
		}
	}
}

// The fields of an instr besides its op, a bit each, in the order instr
// declares them: a statement's form is its op, the bits of the fields it
// sets (holds other than their zero value), then those fields.
const (
	hasA = 1 << iota
	hasB
	hasT
	hasS
	hasK
	hasV
	hasN
	hasKonst
	hasBlocks
	hasFn
	hasArgs
	hasBi
	hasLoc
	hasPath
	hasDyn
	hasBase
	hasAny = 1<<iota - 1
)

func (e *encoder) instr(w *writer, in *instr) {
	set := 0
	for bit, isSet := range [...]bool{ // in the order of hasA...hasBase

		in.a != (operand{}), in.b != (operand{}), in.t != 0, in.s != 0, in.k != 0, in.v != 0, in.n != 0,
		in.konst != nil, len(in.blocks) > 0, in.fn != nil, len(in.args) > 0, in.bi != nil, in.loc != nil,
		len(in.path) > 0, len(in.dyn) > 0, in.base,
	} {
		if isSet {
			set |= 1 << bit
		}
	}
	w.uint(int(in.op))
	w.uint(set)
	if set&hasA != 0 {
		e.operand(w, in.a)
	}
	if set&hasB != 0 {
		e.operand(w, in.b)
	}
	if set&hasT != 0 {
		w.int(in.t)
	}
	if set&hasS != 0 {
		w.int(in.s)
	}
	if set&hasK != 0 {
		w.int(in.k)
	}
	if set&hasV != 0 {
		w.int(in.v)
	}
	if set&hasN != 0 {
		w.int(int(in.n))
	}
	if set&hasKonst != 0 {
		e.term(w, in.konst)
	}
	if set&hasBlocks != 0 {
		e.blocks(w, in.blocks)
	}
	if set&hasFn != 0 {
		w.uint(e.funcs[in.fn])
	}
	if set&hasArgs != 0 {
		e.operands(w, in.args)
	}
	if set&hasBi != 0 {
		index(e.strings, &e.stringList, in.bi.name)
		w.uint(index(e.builtins, &e.builtinList, in.bi.name))
	}
	if set&hasLoc != 0 {
		loc := locationKey{file: in.loc.File, row: in.loc.Row, col: in.loc.Col, text: string(in.loc.Text)}
		index(e.strings, &e.stringList, loc.file)
		index(e.strings, &e.stringList, loc.text)
		w.uint(index(e.locs, &e.locList, loc))
	}
	if set&hasPath != 0 {
		e.termList(w, in.path)
	}
	if set&hasDyn != 0 {
		e.operands(w, in.dyn)
	}
}

func (e *encoder) operand(w *writer, o operand) {
	e.term(w, o.konst)
	if o.konst == nil {
		w.int(o.local)
	}
}

func (e *encoder) operands(w *writer, os []operand) {
	w.uint(len(os))
	e.operandCount += len(os)
	for _, o := range os {
		e.operand(w, o)
	}
}

// LoadBinary reads back a Program from the binary form AppendBinary wrote
// in this build. caps lists the built-ins the bundle was compiled with, as
// for Load; a call to anything else is refused.
func LoadBinary(b []byte, caps *ast.Capabilities) (*Program, error) {
	p := &Program{caps: caps}
	d := &decoder{r: reader{s: string(b)}, l: newLoader(p), size: len(b)}
	if err := d.program(); err != nil {
		return nil, fmt.Errorf("irvm: binary form of a program: %w", err)
	}
	p.needsTime = d.l.readsClock()
	return p, nil
}

// decoder reads a Program's binary form and checks, as it reads, what
// Load guarantees by construction and the evaluator relies on. Reads after
// an error return zero values; d.r.err holds the first error.
type decoder struct {
	r        reader
	l        *loader
	size     int // of the form: it bounds every count
	strings  []string
	builtins []*builtin
	locs     []ast.Location
	terms    []*ast.Term
	// What is left of the blocks, statements and operands allocated at
	// once: each list is cut from them.
	blockSlab   [][]instr
	instrSlab   []instr
	operandSlab []operand
	// fn is the function whose statements are being read. callees are
	// the functions every function calls, by index in Program.funcs, in
	// the order the functions are read (the plan last): function i's are
	// callees[firstCallee[i]:firstCallee[i+1]].
	fn          *function
	callees     []int
	firstCallee []int
}

func (d *decoder) program() error {
	r := &d.r
	if format := r.string(); r.err == nil && format != binaryFormat {
		return fmt.Errorf("format %q, want %q", format, binaryFormat)
	}
	d.blockSlab = make([][]instr, r.count())
	d.instrSlab = make([]instr, r.count())
	d.operandSlab = make([]operand, r.count())
	d.strings = make([]string, r.count())
	for i := range d.strings {
		d.strings[i] = r.string()
	}
	d.builtins = make([]*builtin, r.count())
	for i := range d.builtins {
		name := d.str()
		if r.err != nil {
			return r.err
		}
		if err := d.l.declare(&ir.BuiltinFunc{Name: name}); err != nil {
			return err
		}
		d.builtins[i] = d.l.builtins[name]
	}
	d.locs = make([]ast.Location, r.count())
	texts := make([][]byte, len(d.strings)) // one copy of each text
	for i := range d.locs {
		loc := &d.locs[i]
		loc.File, loc.Row, loc.Col = d.str(), r.int(), r.int()
		if text := r.index(len(d.strings)); r.err == nil && d.strings[text] != "" {
			if texts[text] == nil {
				texts[text] = []byte(d.strings[text])
			}
			loc.Text = texts[text]
		}
	}
	terms := make([]ast.Term, r.count())
	d.terms = make([]*ast.Term, len(terms))
	for i := range terms {
		terms[i].Value = r.value(0)
		d.terms[i] = &terms[i]
	}

	p := d.l.p
	p.keyPaths = make([]path, r.count())
	for i := range p.keyPaths {
		p.keyPaths[i] = d.termList()
	}
	funcs := make([]function, r.count())
	p.funcs = make([]*function, len(funcs))
	for i := range funcs {
		p.funcs[i] = &funcs[i]
	}
	if p.nmemo = r.int(); p.nmemo < 0 || p.nmemo > len(funcs) {
		r.fail("%d memoised functions of %d", p.nmemo, len(funcs))
	}
	p.plan = &function{}
	fns := append(slices.Clone(p.funcs), p.plan)
	for _, fn := range fns {
		d.header(fn)
	}
	for _, fn := range fns {
		d.fn = fn
		d.firstCallee = append(d.firstCallee, len(d.callees))
		fn.blocks = d.readBlocks(0)
	}
	d.firstCallee = append(d.firstCallee, len(d.callees))
	if n := r.count(); n > 0 {
		p.byPath = make(map[string]*function, n)
		for range n {
			key, i := r.string(), r.index(len(p.funcs))
			if r.err != nil {
				break
			}
			p.byPath[key] = p.funcs[i]
		}
	}
	if r.err == nil && len(r.s) > 0 {
		r.fail("%d bytes after the program", len(r.s))
	}
	if r.err != nil {
		return r.err
	}
	return d.acyclic()
}

// str reads a reference to the string table.
func (d *decoder) str() string {
	i := d.r.index(len(d.strings))
	if d.r.err != nil {
		return ""
	}
	return d.strings[i]
}

// term reads a reference to the term table, nil for none.
func (d *decoder) term() *ast.Term {
	i := d.r.index(len(d.terms) + 1)
	if i == 0 {
		return nil
	}
	return d.terms[i-1]
}

// termList reads a list of references to the term table, none of them
// empty.
func (d *decoder) termList() []*ast.Term {
	n := d.r.count()
	if n == 0 {
		return nil
	}
	ts := make([]*ast.Term, n)
	for i := range ts {
		if ts[i] = d.term(); ts[i] == nil {
			d.r.fail("a list of terms with a hole")
		}
	}
	return ts
}

// header reads the fields encoder.header wrote and checks that fn's frame
// holds its parameters and return local, and its memo slot exists; the
// plan takes input and data in locals 0 and 1 and returns nothing.
func (d *decoder) header(fn *function) {
	r := &d.r
	fn.name = r.string()
	if n := r.count(); n > 0 {
		fn.params = make([]int, n)
		for i := range fn.params {
			fn.params[i] = r.int()
		}
	}
	fn.ret, fn.nlocals, fn.memo = r.int(), r.int(), r.int()
	if r.bool() {
		fn.cache = &ruleCache{}
		if n := r.count(); n > 0 {
			fn.cache.paths = make([]dep, n)
			keyPaths := d.l.p.keyPaths
			for i := range fn.cache.paths {
				dp := &fn.cache.paths[i]
				if dp.idx = r.index(len(keyPaths)); r.err == nil {
					dp.path = keyPaths[dp.idx]
				}
				dp.exists = r.bool()
			}
		}
	}
	p := d.l.p
	ok := fn.nlocals >= 1 && fn.nlocals <= d.size && !slices.ContainsFunc(fn.params, fn.outside)
	if fn == p.plan {
		ok = ok && len(fn.params) == 0 && fn.ret == -1 && fn.memo == -1 && fn.cache == nil && fn.nlocals > int(ir.Data)
	} else {
		ok = ok && len(fn.params) > 0 && !fn.outside(fn.ret) && fn.memo >= -1 && fn.memo < p.nmemo && (fn.cache == nil || fn.memo >= 0)
	}
	if !ok && r.err == nil {
		r.fail("function %s: malformed", fn.name)
	}
}

// outside reports whether local is outside fn's frame.
func (fn *function) outside(local int) bool { return local < 0 || local >= fn.nlocals }

func (d *decoder) readBlocks(depth int) [][]instr {
	n := d.r.count()
	if n == 0 {
		return nil
	}
	if depth > maxDepth {
		d.r.fail("blocks nested deeper than %d", maxDepth)
		return nil
	}
	blocks := cut(&d.blockSlab, n, &d.r)
	for i := range blocks {
		code := cut(&d.instrSlab, d.r.count(), &d.r)
		for j := range code {
			d.instr(&code[j], depth)
		}
		blocks[i] = code
	}
	return blocks
}

// cut returns the first n elements of what is left of a slab and leaves
// the rest; a slab too short is a damaged form.
func cut[T any](slab *[]T, n int, r *reader) []T {
	if n > len(*slab) {
		r.fail("more elements than the form announced")
		return nil
	}
	s := (*slab)[:n:n]
	*slab = (*slab)[n:]
	return s
}

// instr reads the fields encoder.instr wrote and checks them.
func (d *decoder) instr(in *instr, depth int) {
	r := &d.r
	in.op = opcode(r.index(int(numOpcodes)))
	set := r.index(hasAny + 1)
	if set&hasA != 0 {
		in.a = d.operand()
	}
	if set&hasB != 0 {
		in.b = d.operand()
	}
	if set&hasT != 0 {
		in.t = r.int()
	}
	if set&hasS != 0 {
		in.s = r.int()
	}
	if set&hasK != 0 {
		in.k = r.int()
	}
	if set&hasV != 0 {
		in.v = r.int()
	}
	if set&hasN != 0 {
		in.n = int64(r.int())
	}
	if set&hasKonst != 0 {
		in.konst = d.term()
	}
	if set&hasBlocks != 0 {
		in.blocks = d.readBlocks(depth + 1)
	}
	if set&hasFn != 0 {
		if i := r.index(len(d.l.p.funcs)); r.err == nil {
			in.fn = d.l.p.funcs[i]
			d.callees = append(d.callees, i)
		}
	}
	if set&hasArgs != 0 {
		in.args = d.operands()
	}
	if set&hasBi != 0 {
		if i := r.index(len(d.builtins)); r.err == nil {
			in.bi = d.builtins[i]
		}
	}
	if set&hasLoc != 0 {
		if i := r.index(len(d.locs)); r.err == nil {
			in.loc = &d.locs[i]
		}
	}
	if set&hasPath != 0 {
		in.path = d.termList()
	}
	if set&hasDyn != 0 {
		in.dyn = d.operands()
	}
	in.base = set&hasBase != 0
	if r.err == nil && !d.wellFormed(in) {
		r.fail("function %s: a malformed statement (op %d)", d.fn.name, in.op)
	}
}

func (d *decoder) operand() operand {
	if t := d.term(); t != nil {
		return operand{konst: t}
	}
	return operand{local: d.r.int()}
}

func (d *decoder) operands() []operand {
	n := d.r.count()
	if n == 0 {
		return nil
	}
	os := cut(&d.operandSlab, n, &d.r)
	for i := range os {
		os[i] = d.operand()
	}
	return os
}

// wellFormed reports whether the evaluator can run in in d.fn's frame:
// every local it names is in the frame, the blocks and arguments its op
// reads are there, a capacity is no larger than the form.
func (d *decoder) wellFormed(in *instr) bool {
	outside := d.fn.outside
	badOperand := func(o operand) bool { return o.konst == nil && outside(o.local) }
	if outside(in.t) || outside(in.s) || outside(in.k) || outside(in.v) || badOperand(in.a) || badOperand(in.b) ||
		slices.ContainsFunc(in.args, badOperand) || slices.ContainsFunc(in.dyn, badOperand) ||
		in.n < 0 || in.n > int64(d.size) {
		return false
	}
	switch in.op {
	case opScan, opNot, opWith:
		return len(in.blocks) == 1
	case opCall:
		return in.fn != nil && len(in.args) == len(in.fn.params)
	case opCallBuiltin:
		return in.bi != nil
	case opCallDynamic:
		return len(in.args) == 2
	}
	return true
}

// acyclic refuses a function that calls itself, directly or not.
func (d *decoder) acyclic() error {
	const (
		unseen = iota
		onPath
		done
	)
	state := make([]int, len(d.firstCallee)-1)
	var visit func(fn int) error
	visit = func(fn int) error {
		switch state[fn] {
		case onPath:
			return fmt.Errorf("function %s calls itself", d.l.p.funcs[fn].name)
		case done:
			return nil
		}
		state[fn] = onPath
		for _, callee := range d.callees[d.firstCallee[fn]:d.firstCallee[fn+1]] {
			if err := visit(callee); err != nil {
				return err
			}
		}
		state[fn] = done
		return nil
	}
	return visit(len(state) - 1) // the plan
}

// writer appends a binary form to b.
type writer struct{ b []byte }

func (w *writer) uint(x int)  { w.b = binary.AppendUvarint(w.b, uint64(x)) }
func (w *writer) int(x int)   { w.b = binary.AppendVarint(w.b, int64(x)) }
func (w *writer) byte(x byte) { w.b = append(w.b, x) }

func (w *writer) bool(x bool) {
	if x {
		w.byte(1)
	} else {
		w.byte(0)
	}
}

func (w *writer) string(s string) {
	w.uint(len(s))
	w.b = append(w.b, s...)
}

func (w *writer) value(v ast.Value, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	switch x := v.(type) {
	case ast.Null:
		w.byte(kindNull)
	case ast.Boolean:
		if x {
			w.byte(kindTrue)
		} else {
			w.byte(kindFalse)
		}
	case ast.Number:
		if !isNumber(string(x)) {
			return fmt.Errorf("number %q", string(x))
		}
		w.byte(kindNumber)
		w.string(string(x))
	case ast.String:
		w.byte(kindString)
		w.string(string(x))
	case *ast.Array:
		w.byte(kindArray)
		w.uint(x.Len())
		for i := range x.Len() {
			if err := w.value(x.Elem(i).Value, depth+1); err != nil {
				return err
			}
		}
	case ast.Object:
		w.byte(kindObject)
		w.uint(x.Len())
		return x.Iter(func(k, v *ast.Term) error {
			if err := w.value(k.Value, depth+1); err != nil {
				return err
			}
			return w.value(v.Value, depth+1)
		})
	case ast.Set:
		w.byte(kindSet)
		w.uint(x.Len())
		return x.Iter(func(t *ast.Term) error { return w.value(t.Value, depth+1) })
	default:
		return fmt.Errorf("%s is not a plain value", ast.ValueName(v))
	}
	return nil
}

// isNumber reports whether s is a number ast.Compare can order (it panics
// on any other): every number of a plan or of data that OPA itself
// compares.
func isNumber(s string) bool {
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return true
	}
	_, isFloat := new(big.Float).SetString(s)
	_, isRat := new(big.Rat).SetString(s)
	return isFloat && isRat
}

// reader reads a binary form from s. After the first error (err) every
// read returns a zero value.
type reader struct {
	s   string
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	r.s = ""
}

func (r *reader) uvarint() uint64 {
	var x uint64
	for i := 0; i < len(r.s) && i < binary.MaxVarintLen64; i++ {
		c := r.s[i]
		if c < 0x80 {
			if i == binary.MaxVarintLen64-1 && c > 1 {
				break // more than 64 bits
			}
			r.s = r.s[i+1:]
			return x | uint64(c)<<(7*i)
		}
		x |= uint64(c&0x7f) << (7 * i)
	}
	r.fail("truncated or overlong number")
	return 0
}

func (r *reader) int() int {
	u := r.uvarint()
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return int(x)
}

// count reads the length of a list whose every element takes a byte or
// more of what is left.
func (r *reader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.s)) {
		r.fail("%d elements in %d bytes", n, len(r.s))
		return 0
	}
	return int(n)
}

// index reads an index below n.
func (r *reader) index(n int) int {
	i := r.uvarint()
	if i >= uint64(n) {
		r.fail("index %d out of %d", i, n)
		return 0
	}
	return int(i)
}

func (r *reader) byte() byte {
	if len(r.s) == 0 {
		r.fail("truncated")
		return 0
	}
	c := r.s[0]
	r.s = r.s[1:]
	return c
}

func (r *reader) bool() bool {
	switch r.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	r.fail("not a boolean")
	return false
}

func (r *reader) string() string {
	n := r.uvarint()
	if n > uint64(len(r.s)) {
		r.fail("a string of %d bytes in %d", n, len(r.s))
		return ""
	}
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}

func (r *reader) value(depth int) ast.Value {
	if depth > maxDepth {
		r.fail("a value nested deeper than %d", maxDepth)
		return ast.Null{}
	}
	switch kind := r.byte(); kind {
	case kindNull:
		return ast.Null{}
	case kindFalse:
		return ast.Boolean(false)
	case kindTrue:
		return ast.Boolean(true)
	case kindNumber:
		s := r.string()
		if r.err == nil && !isNumber(s) {
			r.fail("number %q", s)
		}
		return ast.Number(s)
	case kindString:
		return ast.String(r.string())
	case kindArray:
		elems := make([]*ast.Term, r.count())
		for i := range elems {
			elems[i] = ast.NewTerm(r.value(depth + 1))
		}
		return ast.NewArray(elems...)
	case kindObject:
		n := r.count()
		obj := ast.NewObjectWithCapacity(n)
		for range n {
			k := ast.NewTerm(r.value(depth + 1))
			obj.Insert(k, ast.NewTerm(r.value(depth+1)))
		}
		if r.err == nil && obj.Len() != n {
			r.fail("an object with a key twice")
		}
		return obj
	case kindSet:
		n := r.count()
		set := ast.NewSetWithCapacity(n)
		for range n {
			set.Add(ast.NewTerm(r.value(depth + 1)))
		}
		if r.err == nil && set.Len() != n {
			r.fail("a set with an element twice")
		}
		return set
	default:
		r.fail("value of kind %d", kind)
		return ast.Null{}
	}
}
