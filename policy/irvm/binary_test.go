package irvm_test

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// FuzzLoadBinary: whatever the bytes, LoadBinary returns an error or a
// Program that writes and reads back as itself and evaluates without a
// panic. The seeds are programs of the constructs TestPlanMatchesInterpreter
// covers; the fuzzer damages them.
func FuzzLoadBinary(f *testing.F) {
	for _, module := range []string{
		`package t
r := "a" if input.x == 1
else := "b" if input.x == 2
else := "c"`,
		`package t
s contains x if { some x in input.xs; x > 1 }
o[k] := v if { some k, v in input.m; v != "skip" }
r := {"s": s, "o": o, "a": [y | some x in input.xs; y := x * 2], "n": count(s)}`,
		`package t
f(x) := "small" if x < 10
f(x) := "big" if x >= 10
r := [f(input.n), sprintf("%v", [input.n]), object.get(input, ["o", "b"], "none")]`,
		`package t
f := input.x
g := data.d.k
h := [f, g]
r := [v, w] if { v := h with input.x as 7; w := h with data.d.k as "dk" }`,
		`package t
a.b.c := 1
a.e[input.k] := true
r := {"a": a, "with_data": data.t.a, "every": every_positive}
every_positive if every x in input.xs { x > 0 }`,
	} {
		p, err := plan(f, module, "data.t.r")
		if err != nil {
			f.Fatalf("seed %q: %v", module, err)
		}
		b, err := p.AppendBinary(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	caps := ast.CapabilitiesForThisVersion()
	data := ast.MustParseTerm(`{"d": {"k": "base"}, "t": {"a": {"b": {"x": 1}}}}`)
	inputs := []*ast.Term{
		nil,
		ast.MustParseTerm(`{"x": 1, "n": 12, "xs": [1, 2, 3], "m": {"a": "1", "b": "skip"}, "k": "key", "o": {"b": 2}}`),
		ast.MustParseTerm(`{"x": "s", "n": "n", "xs": "no", "m": [], "k": 1}`),
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := irvm.LoadBinary(b, caps)
		if err != nil {
			return
		}
		if _, err := irvm.RoundTrip(p, caps); err != nil {
			t.Fatalf("a program read back does not read back as itself: %v", err)
		}
		if p.CallsDynamically() {
			return // a cycle through a dynamic call would recurse without end
		}
		for _, in := range inputs {
			_, _ = p.Eval(context.Background(), in, data)
		}
	})
}
