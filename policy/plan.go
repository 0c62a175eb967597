package policy

import (
	"context"
	"errors"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// Evaluators an Engine can decide with (Options.Evaluator).
const (
	// EvaluatorPlan runs OPA's compiled plan of the decision query
	// (policy/irvm) and falls back to EvaluatorTopdown, with a logged
	// reason, for a bundle whose plan uses what irvm does not implement.
	EvaluatorPlan = "plan"
	// EvaluatorTopdown is OPA's Rego interpreter, the reference: opa eval
	// and opa test use it.
	EvaluatorTopdown = "topdown"
)

// KnownEvaluator reports whether name is an evaluator Options accepts; the
// empty name is EvaluatorPlan.
func KnownEvaluator(name string) bool {
	return name == "" || name == EvaluatorPlan || name == EvaluatorTopdown
}

// planTarget is the rego target under which the engine asks OPA's planner
// for the decision query's plan. The target plugin only hands the plan
// over; rego never evaluates through it.
const planTarget = "bulkhead-plan"

func init() { rego.RegisterPlugin(planTarget, planCapture{}) }

type planSinkKey struct{}

type planCapture struct{}

func (planCapture) IsTarget(t string) bool { return t == planTarget }

func (planCapture) PrepareForEval(ctx context.Context, p *ir.Policy, _ ...rego.PrepareOption) (rego.TargetPluginEval, error) {
	sink, _ := ctx.Value(planSinkKey{}).(**ir.Policy)
	if sink == nil {
		return nil, errors.New("policy: target " + planTarget + " is internal to the policy engine")
	}
	*sink = p
	return refuseRegoEval{}, nil
}

type refuseRegoEval struct{}

func (refuseRegoEval) Eval(context.Context, *rego.EvalContext, ast.Value) (ast.Value, error) {
	return nil, errors.New("policy: a captured plan runs in irvm, not through rego")
}

// planQuery has OPA's planner plan query on the bundle's compiled modules
// and loads the plan. errors.Is(err, irvm.ErrUnsupported) means the bundle
// is fine but needs the interpreter.
func planQuery(ctx context.Context, compiler *ast.Compiler, query string) (*irvm.Program, error) {
	// A rego target plugin switches the compiler to IR mode, which only
	// skips index building for queries compiled later: switch it back.
	defer compiler.WithEvalMode(ast.EvalModeTopdown)
	var plan *ir.Policy
	_, err := rego.New(
		rego.Query(query),
		rego.Compiler(compiler),
		rego.Target(planTarget),
	).PrepareForEval(context.WithValue(ctx, planSinkKey{}, &plan))
	if err != nil {
		return nil, fmt.Errorf("%w: OPA's planner: %v", irvm.ErrUnsupported, err)
	}
	return loadPlan(plan)
}

// loadPlan loads a plan OPA's planner made for a bundle compiled with
// Capabilities.
func loadPlan(plan *ir.Policy) (*irvm.Program, error) { return irvm.Load(plan, Capabilities()) }

// evalPlan decides with the loaded plan: the first result's only value.
func (s *snapshot) evalPlan(ctx context.Context, input ast.Value) (ast.Value, error) {
	return s.evalProgram(ctx, s.program, input)
}

// evalProgram runs p on input and the bundle's data: the first result's
// only value, nil when undefined.
func (s *snapshot) evalProgram(ctx context.Context, p *irvm.Program, input ast.Value) (ast.Value, error) {
	rs, err := p.Eval(ctx, ast.NewTerm(input), s.data)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	obj, ok := rs[0].Value.(ast.Object)
	if !ok || obj.Len() != 1 {
		return nil, fmt.Errorf("plan result %v is not a one-variable binding", rs[0])
	}
	var v ast.Value
	obj.Foreach(func(_, t *ast.Term) { v = t.Value })
	return v, nil
}
