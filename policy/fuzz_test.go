package policy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/test/cases"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// FuzzEvaluatorsAgree feeds drawn inputs, and drawn data values, to the
// default bundle, to modules built on the constructs where irvm and topdown
// once differed, and to OPA conformance cases that read input, through
// both evaluators; any difference fails. An evaluation the plan defers
// (irvm.ErrDeferred) is answered by topdown, as in the engine.
//
// Arguments: target picks the bundle; path ("a/b/0") says where value (a
// Rego term, ground) goes into a valid input of the target (empty: value is
// the whole input); data (a Rego term) is data.d for the fuzz modules.
// `make test` runs it for a bounded time; the corpus is testdata/fuzz.
func FuzzEvaluatorsAgree(f *testing.F) {
	seeds := []struct {
		target      uint8
		path, value string
		data        string
	}{
		{0, "", `{}`, ``},
		{0, "namespace", `"team-a"`, ``},
		{0, "request/gpu/profile", `-3`, ``},
		{0, "request/gpu/profile", `"1g.10gb"`, ``},
		{0, "pod/containers/0/image", `7`, ``},
		{0, "kind", `"admission"`, ``},
		{1, "uid", `1000`, `{"1000": true}`},
		{1, "uid", `"1000"`, `{"1000": true}`},
		{2, "i", `"1"`, `["a", "b"]`},
		{3, "", `1`, `{}`},
		{3, "a", `{"b": 1}`, `{}`},
		{4, "x", `5`, `{}`},
		{4, "x", `"abc"`, `{}`},
		{5, "k", `"p"`, `{"p": {"q": 1}}`},
		{6, "", `{"xs": [1, 2, "a"]}`, `{}`},
		{7, "", `{"x": 1}`, ``},
		{8, "", `{"x": "a"}`, ``},
	}
	for _, s := range seeds {
		f.Add(s.target, s.path, s.value, s.data)
	}
	f.Fuzz(func(t *testing.T, target uint8, path, value, data string) {
		tg := fuzzTargets(t)
		v, ok := groundTerm(value)
		if !ok {
			t.Skip()
		}
		i := int(target) % (1 + len(tg.modules) + len(tg.cases))
		ctx := context.Background()
		switch {
		case i == 0:
			input := fuzzInput(tg.base[int(target/16)%len(tg.base)], path, v)
			want, werr := tg.snap.evalTopdown(ctx, input.Value)
			got, gerr := tg.snap.evalValue(ctx, input.Value)
			if (werr != nil) != (gerr != nil) || !sameValue(got, want) {
				t.Fatalf("default bundle, input %v:\ntopdown: %v (error %v)\nengine:  %v (error %v)", input, want, werr, got, gerr)
			}
		case i <= len(tg.modules):
			c := tg.modules[i-1]
			d, ok := groundTerm(data)
			if !ok {
				t.Skip()
			}
			js, err := ast.JSON(ast.NewObject(ast.Item(ast.StringTerm("d"), d)))
			if err != nil {
				t.Skip() // data is JSON: no sets, no keys that are not strings
			}
			doc := js.(map[string]any)
			c.tc.Data = &doc
			p, skip, err := prepareCase(ctx, c)
			switch {
			case err != nil || skip != "":
				t.Fatalf("fuzz module %s: %v %s", c.name, err, skip)
			case p.refusal != "":
				t.Fatalf("fuzz module %s: irvm refuses it: %s", c.name, p.refusal)
			}
			agree(ctx, t, c.name, p, fuzzInput(ast.NewObject(), path, v))
		default:
			c := tg.cases[i-1-len(tg.modules)]
			agree(ctx, t, c.c.name, c.p, fuzzInput(ast.NewObject(), path, v))
		}
	})
}

func agree(ctx context.Context, t *testing.T, name string, p *conformanceProgram, input *ast.Term) {
	want := evalCase(ctx, p.topdown, input, p.data)
	got := evalCase(ctx, p.plan, input, p.data)
	if errors.Is(got.err, irvm.ErrDeferred) {
		return
	}
	if !sameOutcome(got, want) {
		t.Fatalf("%s, input %v:\ntopdown: %v\nirvm:    %v", name, input, want, got)
	}
}

// fuzzModules are built on the constructs where the evaluators differed
// (numbered as in issue 14) and on what a bundle commonly does with input.
var fuzzModules = []struct{ name, module string }{
	{"number keys into base data (2)", `package fz
default r := "allow"
r := "deny" if blocked
blocked if data.d[input.uid]
blocked if { b := data.d; b[input.uid] }`},
	{"string index into base data (2)", `package fz
r := data.d[input.i]
r2 := [x | x := data.d[_][input.i]]`},
	{"with on input (1, 5)", `package fz
f := input.a.b
r := [x, input] if { x := f with input.a.b as 1 }
r2 := y if { y := input with input as {"z": 1} }`},
	{"index before a built-in (4)", `package fz
r := 1 if { count(input.x) > 2; input.x == "abcd" }
r := 2 if { startswith(input.x, "a"); upper(input.x) == "ABC" }`},
	{"base and virtual documents under one path (3)", `package fz
v[k] := x if { some k, x in data.d[input.k] }
r := [data.fz.v, object.keys(data.fz.v)] if input.k`},
	{"every, comprehensions and sets", `package fz
r := {"all": all, "nums": nums, "strs": strs} if {
	all := every_num
	nums := {x | some x in input.xs; is_number(x)}
	strs := [upper(x) | some x in input.xs; is_string(x)]
}
every_num if { every x in input.xs { is_number(x) } }`},
}

type fuzzCase struct {
	c conformanceCase
	p *conformanceProgram
}

type fuzzTargetSet struct {
	snap    *snapshot
	base    []ast.Value // valid inputs of the default bundle
	modules []conformanceCase
	cases   []fuzzCase // OPA conformance cases that read input
}

var (
	fuzzOnce sync.Once
	fuzzSet  *fuzzTargetSet
)

// fuzzConformanceCases is how many of OPA's cases that read input the fuzz
// target takes (the first ones, in the suite's order).
const fuzzConformanceCases = 8

func fuzzTargets(t testing.TB) *fuzzTargetSet {
	fuzzOnce.Do(func() {
		s := &fuzzTargetSet{}
		e := openDefault(t)
		s.snap = e.active.Load()
		if s.snap.program == nil {
			t.Fatalf("the default bundle must run as a plan: %s", s.snap.planNote)
		}
		for _, in := range benchInputs() {
			s.base = append(s.base, in.astValue())
		}
		for _, m := range fuzzModules {
			s.modules = append(s.modules, conformanceCase{name: "fuzz/" + m.name, version: ast.RegoV1,
				tc: cases.TestCase{Query: "data.fz.r = x", Modules: []string{m.module}}})
		}
		ctx := context.Background()
		for _, c := range loadConformanceCases(t) {
			if len(s.cases) == fuzzConformanceCases {
				break
			}
			if c.version != ast.RegoV1 || !strings.Contains(strings.Join(c.tc.Modules, "\n"), "input.") || len(c.tc.Env) > 0 {
				continue
			}
			p, skip, err := prepareCase(ctx, c)
			if err != nil || skip != "" || p.refusal != "" {
				continue
			}
			s.cases = append(s.cases, fuzzCase{c: c, p: p})
		}
		fuzzSet = s
	})
	if fuzzSet == nil {
		t.Fatal("fuzz targets failed to load")
	}
	return fuzzSet
}

// groundTerm parses s as a constant Rego term.
func groundTerm(s string) (*ast.Term, bool) {
	if len(s) > 4096 {
		return nil, false
	}
	t, err := ast.ParseTerm(s)
	if err != nil || !ast.IsConstant(t.Value) {
		return nil, false
	}
	return t, true
}

// fuzzInput is base with v at path ("a/0/b": object keys, array indexes),
// the objects on the way made when missing; an empty path: v itself.
func fuzzInput(base ast.Value, path string, v *ast.Term) *ast.Term {
	if path == "" {
		return v
	}
	return ast.NewTerm(setAt(base, strings.Split(path, "/"), v))
}

func setAt(doc ast.Value, path []string, v *ast.Term) ast.Value {
	if len(path) == 0 {
		return v.Value
	}
	switch d := doc.(type) {
	case *ast.Array:
		var i int
		if n, ok := ast.Number(path[0]).Int(); ok && n >= 0 && n < d.Len() {
			i = n
			out := d.Copy()
			out.Set(i, ast.NewTerm(setAt(d.Elem(i).Value, path[1:], v)))
			return out
		}
	case ast.Object:
		out := d.Copy()
		var child ast.Value = ast.NewObject()
		if c := d.Get(ast.StringTerm(path[0])); c != nil {
			child = c.Value
		}
		out.Insert(ast.StringTerm(path[0]), ast.NewTerm(setAt(child, path[1:], v)))
		return out
	}
	return setAt(ast.NewObject(), path, v)
}
