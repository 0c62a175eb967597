package irvm

import (
	"encoding/binary"
	"errors"
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
const binaryFormat = "irvm-program/1"

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
	// The body first: writing it fills the tables that precede it.
	body := &writer{}
	body.uint(len(p.keyPaths))
	for _, q := range p.keyPaths {
		e.termList(body, q)
	}
	body.int(p.nmemo)
	body.uint(len(p.funcs))
	for _, fn := range p.funcs {
		e.function(body, fn)
	}
	e.function(body, p.plan)
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

func (e *encoder) function(w *writer, fn *function) {
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
	e.blocks(w, fn.blocks)
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

// instr writes every field of in, in the order instr declares them.
func (e *encoder) instr(w *writer, in *instr) {
	w.uint(int(in.op))
	e.operand(w, in.a)
	e.operand(w, in.b)
	w.int(in.t)
	w.int(in.s)
	w.int(in.k)
	w.int(in.v)
	w.int(int(in.n))
	e.term(w, in.konst)
	e.blocks(w, in.blocks)
	if in.fn == nil {
		w.uint(0)
	} else {
		w.uint(e.funcs[in.fn] + 1)
	}
	e.operands(w, in.args)
	if in.bi == nil {
		w.uint(0)
	} else {
		index(e.strings, &e.stringList, in.bi.name)
		w.uint(index(e.builtins, &e.builtinList, in.bi.name) + 1)
	}
	if in.loc == nil {
		w.uint(0)
	} else {
		loc := locationKey{file: in.loc.File, row: in.loc.Row, col: in.loc.Col, text: string(in.loc.Text)}
		index(e.strings, &e.stringList, loc.file)
		index(e.strings, &e.stringList, loc.text)
		w.uint(index(e.locs, &e.locList, loc) + 1)
	}
	e.termList(w, in.path)
	e.operands(w, in.dyn)
	w.bool(in.base)
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
	d := &decoder{r: reader{s: string(b)}, l: newLoader(p)}
	err := d.program()
	if err == nil {
		err = p.check(len(b))
	}
	if err != nil {
		return nil, fmt.Errorf("irvm: binary form of a program: %w", err)
	}
	p.needsTime = d.l.readsClock()
	return p, nil
}

// decoder reads a Program's binary form. Reads after an error return zero
// values; d.r.err holds the first error.
type decoder struct {
	r        reader
	l        *loader
	strings  []string
	builtins []*builtin
	locs     []ast.Location
	terms    []*ast.Term
	// What is left of the blocks, statements and operands allocated at
	// once: each list is cut from them.
	blockSlab   [][]instr
	instrSlab   []instr
	operandSlab []operand
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
	p.nmemo = r.int()
	funcs := make([]function, r.count())
	p.funcs = make([]*function, len(funcs))
	for i := range funcs {
		p.funcs[i] = &funcs[i]
	}
	for _, fn := range p.funcs {
		d.function(fn)
	}
	p.plan = &function{}
	d.function(p.plan)
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
	return r.err
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

func (d *decoder) function(fn *function) {
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
	fn.blocks = d.readBlocks(0)
}

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

// instr reads the fields encoder.instr wrote.
func (d *decoder) instr(in *instr, depth int) {
	r := &d.r
	in.op = opcode(r.index(int(numOpcodes)))
	in.a, in.b = d.operand(), d.operand()
	in.t, in.s, in.k, in.v = r.int(), r.int(), r.int(), r.int()
	in.n = int64(r.int())
	in.konst = d.term()
	in.blocks = d.readBlocks(depth + 1)
	if i := r.index(len(d.l.p.funcs) + 1); i > 0 {
		in.fn = d.l.p.funcs[i-1]
	}
	in.args = d.operands()
	if i := r.index(len(d.builtins) + 1); i > 0 {
		in.bi = d.builtins[i-1]
	}
	if i := r.index(len(d.locs) + 1); i > 0 {
		in.loc = &d.locs[i-1]
	}
	in.path = d.termList()
	in.dyn = d.operands()
	in.base = r.bool()
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

// check verifies what Load guarantees by construction and the evaluator
// relies on; size is the length of the binary form, which bounds every
// count (a frame's locals, a collection's capacity).
func (p *Program) check(size int) error {
	if p.nmemo < 0 || p.nmemo > len(p.funcs) {
		return fmt.Errorf("%d memoised functions of %d", p.nmemo, len(p.funcs))
	}
	if pl := p.plan; len(pl.params) > 0 || pl.ret != -1 || pl.memo != -1 || pl.cache != nil || pl.nlocals <= int(ir.Data) {
		return errors.New("the plan is not shaped as one")
	}
	for _, fn := range append([]*function{p.plan}, p.funcs...) {
		if err := p.checkFunction(fn, size); err != nil {
			return fmt.Errorf("function %s: %w", fn.name, err)
		}
	}
	return p.checkAcyclic()
}

func (p *Program) checkFunction(fn *function, size int) error {
	if fn.nlocals < 1 || fn.nlocals > size {
		return fmt.Errorf("%d locals", fn.nlocals)
	}
	local := func(x int) bool { return x >= 0 && x < fn.nlocals }
	if fn != p.plan && (len(fn.params) == 0 || !local(fn.ret)) {
		return errors.New("no parameters or no return local")
	}
	outside := func(x int) bool { return !local(x) }
	if slices.ContainsFunc(fn.params, outside) {
		return errors.New("a parameter outside the frame")
	}
	if fn.memo < -1 || fn.memo >= p.nmemo || (fn.cache != nil && fn.memo < 0) {
		return fmt.Errorf("memo slot %d", fn.memo)
	}
	badOperand := func(o operand) bool { return o.konst == nil && !local(o.local) }
	var err error
	var walk func(code []instr)
	walk = func(code []instr) {
		for i := range code {
			in := &code[i]
			switch {
			case err != nil:
				return
			case slices.ContainsFunc([]int{in.t, in.s, in.k, in.v}, outside) ||
				slices.ContainsFunc([]operand{in.a, in.b}, badOperand) ||
				slices.ContainsFunc(in.args, badOperand) || slices.ContainsFunc(in.dyn, badOperand):
				err = fmt.Errorf("statement %d: a local outside the frame", i)
			case (in.op == opScan || in.op == opNot || in.op == opWith) && len(in.blocks) != 1,
				in.op == opCall && (in.fn == nil || len(in.args) != len(in.fn.params)),
				in.op == opCallBuiltin && in.bi == nil,
				in.op == opCallDynamic && len(in.args) != 2,
				in.n < 0 || in.n > int64(size):
				err = fmt.Errorf("statement %d: malformed", i)
			}
			for _, b := range in.blocks {
				walk(b)
			}
		}
	}
	for _, b := range fn.blocks {
		walk(b)
	}
	return err
}

// checkAcyclic refuses a function that calls itself, directly or not.
func (p *Program) checkAcyclic() error {
	const (
		unseen = iota
		onPath
		done
	)
	state := map[*function]int{}
	var visit func(fn *function) error
	visit = func(fn *function) error {
		switch state[fn] {
		case onPath:
			return fmt.Errorf("function %s calls itself", fn.name)
		case done:
			return nil
		}
		state[fn] = onPath
		var err error
		var walk func(code []instr)
		walk = func(code []instr) {
			for i := range code {
				if err == nil && code[i].fn != nil {
					err = visit(code[i].fn)
				}
				for _, b := range code[i].blocks {
					walk(b)
				}
			}
		}
		for _, b := range fn.blocks {
			walk(b)
		}
		state[fn] = done
		return err
	}
	return visit(p.plan)
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
