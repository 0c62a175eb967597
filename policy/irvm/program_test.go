package irvm_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

const target = "irvm-test"

type sinkKey struct{}

type capture struct{}

func (capture) IsTarget(t string) bool { return t == target }
func (capture) PrepareForEval(ctx context.Context, p *ir.Policy, _ ...rego.PrepareOption) (rego.TargetPluginEval, error) {
	*ctx.Value(sinkKey{}).(**ir.Policy) = p
	return nil, nil
}

func init() { rego.RegisterPlugin(target, capture{}) }

// plan compiles module for OPA's planner and loads the plan of query.
func plan(t testing.TB, module, query string) (*irvm.Program, error) {
	t.Helper()
	m, err := ast.ParseModule("m.rego", module)
	if err != nil {
		t.Fatal(err)
	}
	c := ast.NewCompiler().WithEvalMode(ast.EvalModeIR)
	c.Compile(map[string]*ast.Module{"m.rego": m})
	if c.Failed() {
		t.Fatal(c.Errors)
	}
	var p *ir.Policy
	if _, err := rego.New(rego.Query(query), rego.Compiler(c), rego.Target(target)).
		PrepareForEval(context.WithValue(context.Background(), sinkKey{}, &p)); err != nil {
		t.Fatal(err)
	}
	return loadBoth(t, p)
}

// loadBoth loads p, writes the program's binary form and reads it back:
// the tests run what was read back, which must be what Load made.
func loadBoth(t testing.TB, p *ir.Policy) (*irvm.Program, error) {
	t.Helper()
	caps := ast.CapabilitiesForThisVersion()
	prog, err := irvm.Load(p, caps)
	if err != nil {
		return nil, err
	}
	read, err := irvm.RoundTrip(prog, caps)
	if err != nil {
		t.Fatalf("binary form: %v", err)
	}
	return read, nil
}

// interpret is what OPA's interpreter answers, the reference.
func interpret(t *testing.T, module, query string, input, data ast.Value) (ast.Value, error) {
	t.Helper()
	store := inmem.NewFromObject(map[string]any{})
	if data != nil {
		var d map[string]any
		if err := util.Unmarshal([]byte(data.String()), &d); err != nil {
			t.Fatal(err)
		}
		store = inmem.NewFromObject(d)
	}
	keepAST := func(t *ast.Term, _ *rego.EvalContext) (any, error) { return t.Value, nil }
	opts := []func(*rego.Rego){rego.Query(query), rego.Module("m.rego", module), rego.Store(store),
		rego.StrictBuiltinErrors(true), rego.GenerateJSON(keepAST)}
	if input != nil {
		opts = append(opts, rego.ParsedInput(input))
	}
	rs, err := rego.New(opts...).Eval(context.Background())
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return rs[0].Expressions[0].Value.(ast.Value), nil
}

// run evaluates p on input and data; d is data as a term, kept for the
// whole test as an engine keeps it for a bundle revision.
func run(p *irvm.Program, input ast.Value, d *ast.Term) (ast.Value, error) {
	var in *ast.Term
	if input != nil {
		in = ast.NewTerm(input)
	}
	rs, err := p.Eval(context.Background(), in, d)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	var v ast.Value
	rs[0].Value.(ast.Object).Foreach(func(_, t *ast.Term) { v = t.Value })
	return v, nil
}

// TestPlanMatchesInterpreter runs each Rego construct the planner lowers to
// a different mix of statements, on inputs that take every branch, and
// holds the result to OPA's interpreter.
func TestPlanMatchesInterpreter(t *testing.T) {
	cases := []struct {
		name, module string
		inputs       []string
		data         string
		wantErr      string // both must fail, the plan with this in its error
		// deferred are inputs on which the plan defers to the interpreter
		// (irvm.ErrDeferred); the interpreter's answer is then the answer.
		deferred []string
	}{
		{name: "else chain", module: `package t
r := "a" if input.x == 1
else := "b" if input.x == 2
else := "c"`, inputs: []string{`{"x": 1}`, `{"x": 2}`, `{"x": 3}`, `{}`}},
		{name: "default and undefined", module: `package t
default r := false
r if { input.a; not input.b }
s := input.missing.deep`, inputs: []string{`{"a": true}`, `{"a": true, "b": true}`, `{}`, `null`}},
		{name: "partial set and object", module: `package t
s contains x if { some x in input.xs; x > 1 }
o[k] := v if { some k, v in input.m; v != "skip" }
r := {"s": s, "o": o}`, inputs: []string{`{"xs": [1, 2, 3, 2], "m": {"a": "1", "b": "skip"}}`, `{"xs": [], "m": {}}`, `{"xs": "no"}`}},
		{name: "comprehensions", module: `package t
r := {
	"a": [y | some x in input.xs; y := x * 2],
	"s": {x | some x in input.xs; x > 1},
	"o": {sprintf("k%d", [x]): x | some x in input.xs},
	"n": count([x | some x in input.xs; x > 100]),
}`, inputs: []string{`{"xs": [1, 2, 3]}`, `{"xs": []}`}},
		{name: "every and not", module: `package t
r if {
	every x in input.xs { x > 0 }
	not any_negative
}
any_negative if { some x in input.xs; x < 0 }`, inputs: []string{`{"xs": [1, 2]}`, `{"xs": [1, -2]}`, `{"xs": []}`, `{"xs": [0]}`}},
		{name: "functions", module: `package t
f(x) := "small" if x < 10
f(x) := "big" if x >= 10
g(x, y) := x + y
r := [f(input.n), g(input.n, 1), h(input.n)]
h(x) := y if { y := x * 3; y > 5 } else := 0`, inputs: []string{`{"n": 1}`, `{"n": 20}`, `{"n": 2}`}},
		{name: "iteration over sets objects arrays and data", module: `package t
r := [k | some k, _ in data.d.obj]
s := [x | some x in {"c", "a", "b"}]
t := [[i, x] | some i, x in input.arr]
u := data.d.obj[input.key]`, data: `{"d": {"obj": {"b": 2, "a": 1}}}`,
			inputs: []string{`{"arr": ["x", "y"], "key": "a"}`, `{"arr": [], "key": "zz"}`}},
		{name: "membership and builtins", module: `package t
r := {
	"in": input.x in {"a", "b"},
	"cidr": net.cidr_contains("10.0.0.0/8", input.ip),
	"glob": glob.match("*.local", ["."], input.host),
	"re": regex.match("^v[0-9]+$", input.version),
	"union": object.union({"a": 1, "b": 2}, input.o),
	"get": object.get(input, ["o", "b"], "none"),
	"units": units.parse_bytes(input.mem),
	"sort": sort(input.list),
}`, inputs: []string{`{"x": "a", "ip": "10.1.2.3", "host": "a.local", "version": "v12", "o": {"b": 3}, "mem": "64Gi", "list": [3, 1, 2]}`,
			`{"x": "z", "ip": "192.168.0.1", "host": "a.b.c", "version": "x", "o": {}, "mem": "1K", "list": []}`}},
		{name: "with", module: `package t
f := input.x
g := data.d.k
h := [f, g]
default input_path := "-"
input_path := v if { v := h with input.x as 7 }
default input_whole := "-"
input_whole := v if { v := h with input as {"x": "whole"} }
default data_path := "-"
data_path := v if { v := h with data.d.k as "dk" }
default deep_new_path := "-"
deep_new_path := v if { v := input.a.b.c with input.a.b.c as 3 }
default from_input := "-"
from_input := v if { v := h with input.x as input.z }
default nested := "-"
nested := v if { v := h with input.x as 1 with data.d.k as 2 }
default outside := "-"
outside := h
# h is computed (and memoised) before the with, and again inside it.
default both := "-"
both := [a, b] if {
	a := h
	b := h with input.x as 8
}
r := {
	"both": both,
	"outside": outside, "input_path": input_path, "input_whole": input_whole, "data_path": data_path,
	"deep_new_path": deep_new_path, "from_input": from_input, "nested": nested,
}`, data: `{"d": {"k": "base", "other": 1}}`, inputs: []string{`{"x": 1, "z": "zz", "a": {"b": {"q": 1}}}`, `{"x": "s", "z": 0}`, `{}`}},
		{name: "ref heads merged with data", module: `package t
a.b.c := 1
a.b.d := input.n
a.e[input.k] := true
r := {"a": a, "a_with_data": data.t.a}`, data: `{"t": {"a": {"b": {"x": "base"}, "y": [1]}, "z": 3}}`,
			inputs: []string{`{"n": 2, "k": "key"}`, `{}`, `{"k": "b"}`}},
		{name: "rules chosen at evaluation time", module: `package t
pkgs.a.v := 1
pkgs.b.v := input.n
pkgs.c.v := 3 if input.n > 5
default r := "none"
r := pkgs[input.p].v`, data: `{"t": {"pkgs": {"d": {"v": "from data"}}}}`,
			inputs:   []string{`{"p": "a"}`, `{"p": "b", "n": 4}`, `{"p": "c", "n": 1}`, `{"p": "c", "n": 9}`, `{"p": "d"}`, `{"p": "zz"}`, `{"p": 1}`, `{}`},
			deferred: []string{`{"p": 1}`}},
		{name: "number keys into base data", module: `package t
default r := "allow"
r := "deny" if blocked
blocked if data.blocked[input.uid]
blocked if { b := data.blocked; b[input.uid] }`, data: `{"blocked": {"1000": true}}`,
			// OPA's interpreter finds data.blocked["1000"] for the number
			// 1000: a deny the plan would turn into an allow. It defers.
			inputs:   []string{`{"uid": 1000}`, `{"uid": "1000"}`, `{"uid": "7"}`, `{"uid": true}`, `{}`},
			deferred: []string{`{"uid": 1000}`, `{"uid": true}`}},
		{name: "string index into a base array", module: `package t
r := data.list[input.i]`, data: `{"t": {}, "list": ["a", "b"]}`,
			inputs: []string{`{"i": 1}`, `{"i": "1"}`, `{"i": 2}`}, deferred: []string{`{"i": "1"}`}},
		{name: "with restores an undefined input", module: `package t
f if input.x == 1
r if { f with input.x as 1; not input.x }`, inputs: []string{``, `{}`, `{"x": 2}`}},
		{name: "with into an input that is not an object", module: `package t
f := input.a.b
r := [x, input] if { x := f with input.a.b as 1 }`, inputs: []string{`1`, `"s"`, `{"a": 5}`, `{"a": {"c": 1}}`, `[1]`}},
		{name: "with makes a rule undefined", module: `package t
f if input.x > 1
r := "yes" if { f with input.x as 0 } else := "no"`, inputs: []string{`{"x": 5}`, `{}`}},
		{name: "complete rule conflict", module: `package t
r := 1 if input.a
r := 2 if input.b`, inputs: []string{`{"a": true, "b": true}`}, wantErr: "multiple outputs"},
		{name: "function conflict", module: `package t
f(x) := 1 if x > 0
f(x) := 2 if x > 1
r := f(input.n)`, inputs: []string{`{"n": 5}`}, wantErr: "multiple outputs"},
		{name: "object key conflict", module: `package t
o[k] := v if { some k, v in input.m }
o[k] := "other" if { some k, _ in input.m }
r := o`, inputs: []string{`{"m": {"a": "x"}}`}, wantErr: "unique"},
		{name: "strict built-in error", module: `package t
r := sprintf("%d", input.notarray)`, inputs: []string{`{"notarray": 1}`}, wantErr: "sprintf"},
		{name: "arithmetic on a string is undefined, not an error, after a type check", module: `package t
r := y if { is_number(input.x); y := input.x + 1 } else := "nan"`, inputs: []string{`{"x": 1}`, `{"x": "a"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			query := "data.t.r"
			p, err := plan(t, tc.module, query)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			var data ast.Value = ast.NewObject()
			if tc.data != "" {
				data = ast.MustParseTerm(tc.data).Value
			}
			dataTerm := ast.NewTerm(data)
			for _, raw := range tc.inputs {
				var input ast.Value // "" stands for no input at all
				if raw != "" {
					input = ast.MustParseTerm(raw).Value
				}
				want, werr := interpret(t, tc.module, query, input, data)
				got, gerr := run(p, input, dataTerm)
				if tc.wantErr != "" {
					if werr == nil || gerr == nil || !strings.Contains(gerr.Error(), tc.wantErr) {
						t.Fatalf("input %s: want both to fail (%q): interpreter %v, plan %v", raw, tc.wantErr, werr, gerr)
					}
					continue
				}
				if errors.Is(gerr, irvm.ErrDeferred) && slices.Contains(tc.deferred, raw) {
					continue // the caller asks the interpreter
				}
				if werr != nil || gerr != nil {
					t.Fatalf("input %s: interpreter error %v, plan error %v", raw, werr, gerr)
				}
				if slices.Contains(tc.deferred, raw) {
					t.Fatalf("input %s: want the plan to defer to the interpreter, got %v", raw, got)
				}
				if (want == nil) != (got == nil) || (want != nil && ast.Compare(want, got) != 0) {
					t.Fatalf("input %s:\ninterpreter %v\nplan        %v", raw, want, got)
				}
			}
		})
	}
}

// TestLoadRefusesWhatItDoesNotRun: a plan irvm cannot run exactly is
// refused with ErrUnsupported instead of being run approximately: a
// relation (a built-in with several answers), a statement it does not know
// (named with its place in the module, once), a built-in outside the
// capabilities.
func TestLoadRefusesWhatItDoesNotRun(t *testing.T) {
	_, err := plan(t, "package t\nr := [p | walk(input, [p, _])]", "data.t.r")
	if !errors.Is(err, irvm.ErrUnsupported) || !strings.Contains(err.Error(), "walk") {
		t.Fatalf("walk: want ErrUnsupported naming walk, got %v", err)
	}

	m, err := ast.ParseModule("m.rego", "package t\nr := input.x")
	if err != nil {
		t.Fatal(err)
	}
	c := ast.NewCompiler().WithEvalMode(ast.EvalModeIR)
	c.Compile(map[string]*ast.Module{"m.rego": m})
	var pol *ir.Policy
	if _, err := rego.New(rego.Query("data.t.r"), rego.Compiler(c), rego.Target(target)).
		PrepareForEval(context.WithValue(context.Background(), sinkKey{}, &pol)); err != nil {
		t.Fatal(err)
	}
	block := pol.Funcs.Funcs[0].Blocks[0]
	stranger := &unknownStmt{}
	stranger.SetLocation(block.Stmts[0].GetLocation().File, 2, 6, "m.rego", []byte("input.x"))
	block.Stmts = append([]ir.Stmt{stranger}, block.Stmts...)
	_, err = irvm.Load(pol, ast.CapabilitiesForThisVersion())
	if !errors.Is(err, irvm.ErrUnsupported) || strings.Count(err.Error(), ":2:6:") != 1 {
		t.Fatalf("unknown statement: want ErrUnsupported naming :2:6: once, got %v", err)
	}

	// A built-in outside the capabilities is refused too.
	c = ast.NewCompiler().WithEvalMode(ast.EvalModeIR)
	c.Compile(map[string]*ast.Module{"m.rego": ast.MustParseModule("package t\nr := upper(input.s)")})
	var p *ir.Policy
	if _, err := rego.New(rego.Query("data.t.r"), rego.Compiler(c), rego.Target(target)).
		PrepareForEval(context.WithValue(context.Background(), sinkKey{}, &p)); err != nil {
		t.Fatal(err)
	}
	caps := &ast.Capabilities{Builtins: []*ast.Builtin{ast.Equality}}
	if _, err := irvm.Load(p, caps); !errors.Is(err, irvm.ErrUnsupported) || !strings.Contains(err.Error(), "upper") {
		t.Fatalf("want ErrUnsupported naming upper, got %v", err)
	}
}

// TestEvalHonoursCancellation: a context cancelled before the evaluation
// starts stops it at once.
func TestEvalHonoursCancellation(t *testing.T) {
	p, err := plan(t, `package t
r := count([x | some x in numbers.range(1, 100000); x % 7 == 0; y := f(x); y > 0])
f(x) := x + 1`, "data.t.r")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Eval(ctx, nil, ast.NewTerm(ast.NewObject())); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
}

// TestRuleCacheFollowsInput evaluates one plan over a sequence of inputs
// that change, one at a time, a value some rule reads and values none
// reads, so that rules cached across evaluations must notice exactly the
// changes that matter. Every answer is held to the interpreter, and the
// caches must have served lookups (or the test proves nothing).
func TestRuleCacheFollowsInput(t *testing.T) {
	const module = `package t
import rego.v1

# Rules of every shape the planner lowers. Each has a default so that r,
# which shows them all, is defined whatever the input lacks.
default tenant := "-"
default settings := "-"
default flag := "-"
default deep := "-"
default exists := "-"
default pod := "-"
default names := "-"
default first := "-"
default allowed := "-"
default by_key := "-"
default via_func := "-"
default ex1 := "-"
default ex2 := "-"
default up := "-"
default n_containers := "-"
default forced := "-"

tenant := data.tenants[input.namespace]
settings := object.union({"limit": 0, "tags": []}, data.tiers[tenant.tier])
flag if input.a.b
deep := sprintf("%v/%v", [input.a.b, count(settings.tags)])
exists if { _ := input.a.c }
pod := input.pod
names := [c.name | some c in input.pod.containers]
first := input.pod.containers[0].image
allowed if { not input.deny; settings.limit > 2 }
by_key := data.lookup[input.key]
via_func := f(input.n)
f(x) := y if { y := x * settings.limit; y > 0 } else := -1
whole := count(input)
ex1 if { _ = input.a.c }
ex2 := "yes" if { input.a.c } else := "no"
up := upper(input.s)
n_containers := count(input.pod.containers)
# up is cached by input.s; inside with it must see the replaced value.
forced := [up, v] if { v := up with input.s as "forced" }
r := {
	"ex1": ex1, "ex2": ex2, "up": up, "n_containers": n_containers, "forced": forced,
	"tenant": tenant, "settings": settings, "flag": flag, "deep": deep, "exists": exists,
	"pod": pod, "names": names, "first": first, "allowed": allowed, "by_key": by_key,
	"via_func": via_func, "whole": whole,
}`
	data := ast.MustParseTerm(`{
		"tenants": {"a": {"tier": "t1"}, "b": {"tier": "t2"}},
		"tiers": {"t1": {"limit": 3, "tags": ["x"]}, "t2": {"limit": 1}},
		"lookup": {"k1": "one", "k2": "two"}
	}`).Value
	inputs := []string{
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "b", "a": {"b": true}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "b", "a": {"b": false}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "b", "a": {"b": false, "c": 1}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "b", "a": {"b": false, "c": false}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2, "s": "x"}`,
		`{"namespace": "b", "a": {"b": false, "c": null}, "pod": {"containers": [{"name": "c", "image": "i"}, {"name": "e"}]}, "key": "k1", "n": 2, "s": "y"}`,
		`{"namespace": "b", "a": 7, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "b", "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": [{"name": "d", "image": "i"}]}, "key": "k1", "n": 2}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": [{"name": "d", "image": "j"}], "extra": 1}, "key": "k2", "n": 2}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": []}, "key": "k2", "n": 5, "deny": true}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": []}, "key": "k2", "n": 5, "deny": true, "unread": 1}`,
		`{"namespace": "zz", "a": {"b": true}, "pod": {}, "key": "nope", "n": 0}`,
		`{"namespace": "a"}`,
		`{"namespace": "a", "a": {"b": true}, "pod": {"containers": [{"name": "c", "image": "i"}]}, "key": "k1", "n": 2}`,
	}
	defer irvm.CacheEveryRule()()
	p, err := plan(t, module, "data.t.r")
	if err != nil {
		t.Fatal(err)
	}
	cachedAsInterpreted(t, p, module, inputs, data)
	s := p.CacheStats()
	if s.Rules < 10 || s.Hits == 0 {
		t.Fatalf("the caches were not exercised: %+v", s)
	}
	t.Logf("rule caches: %+v", s)
	for name, key := range p.CachedRules() {
		t.Logf("%s: %s", name, key)
	}
}

// cachedAsInterpreted evaluates data.t.r of module on every input twice
// over (the second round starts with full caches) and holds the plan p to
// OPA's interpreter.
func cachedAsInterpreted(t *testing.T, p *irvm.Program, module string, inputs []string, data ast.Value) {
	t.Helper()
	dataTerm := ast.NewTerm(data)
	for round := range 2 {
		for i, raw := range inputs {
			input := ast.MustParseTerm(raw).Value
			want, werr := interpret(t, module, "data.t.r", input, data)
			got, gerr := run(p, input, dataTerm)
			if werr != nil || gerr != nil {
				t.Fatalf("round %d input %d: interpreter error %v, plan error %v", round, i, werr, gerr)
			}
			if (want == nil) != (got == nil) || (want != nil && ast.Compare(want, got) != 0) {
				t.Fatalf("round %d input %d %s:\ninterpreter %v\nplan        %v", round, i, raw, want, got)
			}
		}
	}
}

// cancelLater is a context that turns cancelled after its Err has been
// asked n times: a cancellation that arrives mid-evaluation, with no clock.
type cancelLater struct {
	context.Context
	n int
}

func (c *cancelLater) Err() error {
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// TestEvalStopsInALongScan: cancellation is noticed inside an iteration
// that calls no function, not only before the evaluation starts.
func TestEvalStopsInALongScan(t *testing.T) {
	p, err := plan(t, `package t
r := count([x | some x in numbers.range(1, 200000); x % 3 == 0])`, "data.t.r")
	if err != nil {
		t.Fatal(err)
	}
	ctx := &cancelLater{Context: context.Background(), n: 1} // Eval's own check passes
	if _, err := p.Eval(ctx, nil, ast.NewTerm(ast.NewObject())); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled from inside the scan, got %v", err)
	}
	if ctx.n > -1 {
		t.Fatalf("the scan never asked the context (%d asks left)", ctx.n)
	}
}

// TestMergeConflictIsAnError: where data and a rule both hold a value at
// one path (a bundle OPA refuses to activate: "conflicting rule for data
// path"), the plan fails instead of choosing one.
func TestMergeConflictIsAnError(t *testing.T) {
	p, err := plan(t, "package t\na.b.c := 1\nr := a", "data.t.r")
	if err != nil {
		t.Fatal(err)
	}
	data := ast.NewTerm(ast.MustParseTerm(`{"t": {"a": {"b": {"c": 5}}}}`).Value)
	if _, err := run(p, ast.NewObject(), data); err == nil || !strings.Contains(err.Error(), "rules and data both define") {
		t.Fatalf("want a conflict error, got %v", err)
	}
	// Disjoint keys merge.
	data = ast.NewTerm(ast.MustParseTerm(`{"t": {"a": {"b": {"x": 5}}}}`).Value)
	got, err := run(p, ast.NewObject(), data)
	if err != nil || ast.Compare(got, ast.MustParseTerm(`{"b": {"c": 1, "x": 5}}`).Value) != 0 {
		t.Fatalf("got %v, %v", got, err)
	}
}

// unknownStmt stands for a statement a newer OPA might plan.
type unknownStmt struct{ ir.Location }

// TestRuleCacheKeysFollowStatementOrder: the planner numbers locals per
// rule body, so one local holds a rule's value in one body and input.pod
// in the next. The key of such a rule must come from what each body reads
// (input.namespace, input.pod.annotations), not from every value a local
// number held anywhere: a key with the whole pod in it changes with every
// pod and the cache never serves. Values must still follow the input.
func TestRuleCacheKeysFollowStatementOrder(t *testing.T) {
	const module = `package t
tenant := data.tenants[input.namespace]
findings contains "unknown namespace" if not tenant
findings contains "tenant found" if tenant
findings contains sprintf("annotation %s", [k]) if {
	some k, v in input.pod.annotations
	v != tenant
}
findings contains "loop" if {
	some c in input.pod.containers
	x := c.name
	x == input.pod.main
}
r := findings`
	defer irvm.CacheEveryRule()()
	p, err := plan(t, module, "data.t.r")
	if err != nil {
		t.Fatal(err)
	}
	key, ok := p.CachedRules()["g0.data.t.findings"]
	if !ok {
		t.Fatalf("findings has no cache: %v", p.CachedRules())
	}
	for _, want := range []string{"input.namespace ", "input.pod.annotations ", "input.pod.containers ", "input.pod.main "} {
		if !strings.Contains(key, want) {
			t.Errorf("key %q lacks %q", key, want)
		}
	}
	if strings.Contains(key, "input.pod ") || strings.Contains(key, "input ") {
		t.Errorf("key %q depends on the whole pod or input", key)
	}
	data := ast.MustParseTerm(`{"tenants": {"a": "ta"}}`).Value
	inputs := []string{
		`{"namespace": "a", "pod": {"name": "p1", "annotations": {"x": "ta"}}}`,
		`{"namespace": "a", "pod": {"name": "p2", "annotations": {"x": "ta"}}}`,
		`{"namespace": "a", "pod": {"name": "p3", "annotations": {"x": "tb"}}}`,
		`{"namespace": "b", "pod": {"name": "p4", "annotations": {"x": "tb"}}}`,
		`{"namespace": "b", "pod": {"name": "p5"}}`,
		`{"namespace": "b", "pod": {"name": "p6", "containers": [{"name": "m"}], "main": "m"}}`,
		`{"namespace": "b", "pod": {"name": "p7", "containers": [{"name": "m"}], "main": "n"}}`,
		`{"namespace": "a", "pod": {"name": "p8", "annotations": {"x": "ta"}}}`,
	}
	cachedAsInterpreted(t, p, module, inputs, data)
	if s := p.CacheStats(); s.Hits == 0 {
		t.Fatalf("no lookup was served: %+v", s)
	}
}

// TestRuleCacheKeysSeeThroughNestedBlocks: a local that takes a value
// from input inside a nested block (which may stop early) or in one round
// of an iteration, and is used after it or in the next round, must put that
// path in the rule's key. The planner rarely emits these shapes, so the
// rules are built by hand; each returns what input.a holds.
func TestRuleCacheKeysSeeThroughNestedBlocks(t *testing.T) {
	const ret, x, y, arr, k, v, res = ir.Local(2), ir.Local(3), ir.Local(4), ir.Local(5), ir.Local(6), ir.Local(7), ir.Local(8)
	local := func(l ir.Local) ir.Operand { return ir.Operand{Value: l} }
	dotA := &ir.DotStmt{Source: local(ir.Input), Key: ir.Operand{Value: ir.StringIndex(0)}, Target: x}
	cases := []struct {
		name  string
		stmts []ir.Stmt
	}{
		// { x := input.a }; return x
		{"nested block", []ir.Stmt{
			&ir.BlockStmt{Blocks: []*ir.Block{{Stmts: []ir.Stmt{dotA}}}},
			&ir.AssignVarStmt{Source: local(x), Target: ret},
		}},
		// x := 0; for _ in [1, 2] { y := x; x := input.a }; return y:
		// y holds input.a only from the second round on.
		{"loop-carried", []ir.Stmt{
			&ir.MakeNumberIntStmt{Value: 0, Target: x},
			&ir.MakeArrayStmt{Capacity: 2, Target: arr},
			&ir.ArrayAppendStmt{Value: local(x), Array: arr},
			&ir.ArrayAppendStmt{Value: local(x), Array: arr},
			&ir.ScanStmt{Source: arr, Key: k, Value: v, Block: &ir.Block{Stmts: []ir.Stmt{
				&ir.AssignVarStmt{Source: local(x), Target: y},
				dotA,
			}}},
			&ir.AssignVarStmt{Source: local(y), Target: ret},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stmts := append(slices.Clone(tc.stmts), &ir.ReturnLocalStmt{Source: ret})
			pol := &ir.Policy{
				Static: &ir.Static{Strings: []*ir.StringConst{{Value: "a"}, {Value: "r"}}},
				Plans: &ir.Plans{Plans: []*ir.Plan{{Name: "q", Blocks: []*ir.Block{{Stmts: []ir.Stmt{
					&ir.CallStmt{Func: "g0.rule", Args: []ir.Operand{local(ir.Input), local(ir.Data)}, Result: x},
					&ir.MakeObjectStmt{Target: res},
					&ir.ObjectInsertStmt{Key: ir.Operand{Value: ir.StringIndex(1)}, Value: local(x), Object: res},
					&ir.ResultSetAddStmt{Value: res},
				}}}}}},
				Funcs: &ir.Funcs{Funcs: []*ir.Func{{Name: "g0.rule", Params: []ir.Local{ir.Input, ir.Data}, Return: ret,
					Blocks: []*ir.Block{{Stmts: stmts}}}}},
			}
			defer irvm.CacheEveryRule()()
			p, err := loadBoth(t, pol)
			if err != nil {
				t.Fatal(err)
			}
			if key := p.CachedRules()["g0.rule"]; !strings.Contains(key, "input.a ") {
				t.Fatalf("key %q: want the value at input.a in it", key)
			}
			data := ast.NewTerm(ast.NewObject())
			for _, want := range []string{"1", "2", "1", "3"} {
				got, err := run(p, ast.MustParseTerm(`{"a": `+want+`}`).Value, data)
				if err != nil || got == nil || got.String() != want {
					t.Fatalf("input.a = %s: got %v, %v", want, got, err)
				}
			}
		})
	}
}
