package policy

import (
	"context"
	"errors"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"
)

// IndexQuery is the package of rules that depend on the bundle's data alone
// (rego/index.rego). The engine evaluates it once per load and serves the
// result as data, so that decisions look tenants and tiers up by key
// instead of deriving them on every call. The rules stay the policy's: Go
// only memoises them, and opa eval and opa test evaluate them as written.
const IndexQuery = "data.bulkhead.index"

var indexRef = ast.MustParseRef(IndexQuery)

// precomputeIndex evaluates the bundle's index package on data and returns
// the modules without it, together with its value. It returns modules
// unchanged and a nil value when the bundle has no index package. An index
// rule that reads input, directly or through the rules it uses, is refused:
// its value would differ from one decision to the next.
func precomputeIndex(ctx context.Context, compiler *ast.Compiler, modules map[string]*ast.Module, data map[string]any) (map[string]*ast.Module, ast.Value, error) {
	var roots []util.T
	for _, m := range compiler.Modules {
		if m.Package.Path.HasPrefix(indexRef) {
			for _, r := range m.Rules {
				roots = append(roots, r)
			}
		}
	}
	if len(roots) == 0 {
		return modules, nil, nil
	}
	if err := checkDataOnly(compiler.Graph, roots); err != nil {
		return nil, nil, err
	}
	if bulkhead, ok := data["bulkhead"].(map[string]any); ok {
		if _, set := bulkhead["index"]; set {
			return nil, nil, errors.New("data.bulkhead.index is set by data and defined by rules; it may only be defined by rules")
		}
	}
	store := inmem.NewFromObjectWithOpts(data, inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	rs, err := rego.New(
		rego.Query(IndexQuery),
		rego.Compiler(compiler),
		rego.Store(store),
		rego.StrictBuiltinErrors(true),
		rego.GenerateJSON(keepAST),
	).Eval(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("evaluate %s: %w", IndexQuery, err)
	}
	var index ast.Value = ast.NewObject()
	if len(rs) > 0 && len(rs[0].Expressions) > 0 {
		v, ok := rs[0].Expressions[0].Value.(ast.Value)
		if !ok {
			return nil, nil, fmt.Errorf("evaluate %s: got %T", IndexQuery, rs[0].Expressions[0].Value)
		}
		index = v
	}
	rest := make(map[string]*ast.Module, len(modules))
	for name, m := range modules {
		if !m.Package.Path.HasPrefix(indexRef) {
			rest[name] = m
		}
	}
	return rest, index, nil
}

// checkDataOnly refuses rules that read input, directly or through the
// rules and functions they depend on.
func checkDataOnly(graph *ast.Graph, roots []util.T) error {
	seen := map[util.T]bool{}
	stack := roots
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[n] {
			continue
		}
		seen[n] = true
		rule, ok := n.(*ast.Rule)
		if !ok {
			continue
		}
		var bad bool
		ast.WalkRefs(rule, func(r ast.Ref) bool {
			bad = bad || r.HasPrefix(ast.InputRootRef)
			return bad
		})
		if bad {
			return fmt.Errorf("%s: rule %s at %s reads input; %s may depend on data only", IndexQuery, rule.Head.Ref(), rule.Location, IndexQuery)
		}
		for d := range graph.Dependencies(n) {
			stack = append(stack, d)
		}
	}
	return nil
}

// withIndex returns data with index set at data.bulkhead.index, copying
// the maps it changes so that the bundle's own data stays untouched.
func withIndex(data map[string]any, index ast.Value) map[string]any {
	out := make(map[string]any, len(data)+1)
	for k, v := range data {
		out[k] = v
	}
	bulkhead := map[string]any{}
	if old, ok := data["bulkhead"].(map[string]any); ok {
		for k, v := range old {
			bulkhead[k] = v
		}
	}
	bulkhead["index"] = index
	out["bulkhead"] = bulkhead
	return out
}
