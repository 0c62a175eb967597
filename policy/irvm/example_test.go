package irvm_test

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// A plan comes from OPA's planner through a rego target plugin (registered
// once per process, here by this package's tests as "irvm-test"); irvm
// then runs it on input and data.
func ExampleProgram_Eval() {
	module := ast.MustParseModule(`package example

default allow := false

allow if input.user in data.admins`)
	compiler := ast.NewCompiler()
	compiler.Compile(map[string]*ast.Module{"example.rego": module})
	if compiler.Failed() {
		panic(compiler.Errors)
	}
	var plan *ir.Policy
	ctx := context.WithValue(context.Background(), sinkKey{}, &plan)
	if _, err := rego.New(rego.Query("data.example.allow"), rego.Compiler(compiler), rego.Target(target)).PrepareForEval(ctx); err != nil {
		panic(err)
	}
	p, err := irvm.Load(plan, ast.CapabilitiesForThisVersion())
	if err != nil {
		panic(err) // errors.Is(err, irvm.ErrUnsupported): evaluate with rego instead
	}
	data := ast.NewTerm(ast.MustParseTerm(`{"admins": ["alice"]}`).Value)
	for _, user := range []string{"alice", "bob"} {
		rs, err := p.Eval(context.Background(), ast.ObjectTerm(ast.Item(ast.StringTerm("user"), ast.StringTerm(user))), data)
		if err != nil {
			panic(err)
		}
		// One result: an object holding the query's value under a variable
		// the planner named.
		rs[0].Value.(ast.Object).Foreach(func(_, v *ast.Term) { fmt.Println(user, v) })
	}
	// Output:
	// alice true
	// bob false
}
