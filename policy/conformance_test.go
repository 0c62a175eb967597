package policy

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/ir"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/test/cases"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// The conformance test holds the compiled plan to OPA's interpreter on
// OPA's own conformance suite: every case of v1/test/cases/testdata/{v0,v1}
// in the OPA module this module builds with, compiled as the engine
// compiles a bundle. For every case, irvm either refuses the plan (the
// engine then decides with the interpreter) or returns exactly the
// interpreter's result set or error class: on the case's input, on a second
// evaluation of the same program, on unrelated inputs evaluated after it
// (the rule caches), and on the case's input once more.
//
// testdata/conformance/refusals.json lists every refused case with the
// reason irvm gives; it may list nothing else. A case refused for another
// reason, a listed case that runs, or a disagreement fails the test.
// `go test ./policy -run TestConformance -update-refusals` rewrites the list.

var updateRefusals = flag.Bool("update-refusals", false, "rewrite testdata/conformance/refusals.json from this run")

const refusalsFile = "testdata/conformance/refusals.json"

// conformanceTarget runs a captured plan in irvm through rego, so that
// both evaluators' results reach the test through rego's own result
// generation (capture variables, generated names, bindings).
const conformanceTarget = "bulkhead-conformance"

func init() { rego.RegisterPlugin(conformanceTarget, conformancePlugin{}) }

type conformancePlugin struct{}

func (conformancePlugin) IsTarget(t string) bool { return t == conformanceTarget }

func (conformancePlugin) PrepareForEval(_ context.Context, p *ir.Policy, _ ...rego.PrepareOption) (rego.TargetPluginEval, error) {
	prog, err := loadPlan(p)
	if err != nil {
		return nil, err
	}
	// The suite runs the program as the plan cache serves it: read back
	// from its binary form.
	bin, err := prog.AppendBinary(nil)
	if err != nil {
		return nil, fmt.Errorf("binary form: %w", err)
	}
	if prog, err = irvm.LoadBinary(bin, Capabilities()); err != nil {
		return nil, fmt.Errorf("binary form: %w", err)
	}
	return &planEval{prog: prog}, nil
}

type planEval struct{ prog *irvm.Program }

type conformanceDataKey struct{}

func (e *planEval) Eval(ctx context.Context, ectx *rego.EvalContext, _ ast.Value) (ast.Value, error) {
	var input *ast.Term
	if v := ectx.ParsedInput(); v != nil {
		input = ast.NewTerm(v)
	}
	data, _ := ctx.Value(conformanceDataKey{}).(*ast.Term)
	rs, err := e.prog.Eval(ctx, input, data)
	if err != nil {
		return nil, err
	}
	return ast.NewSet(rs...), nil
}

// opaModuleDir is the OPA module's directory in the module cache.
func opaModuleDir(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/open-policy-agent/opa").Output()
	if err != nil {
		t.Fatalf("go list the OPA module: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		t.Fatal("go list: the OPA module has no directory (go mod download github.com/open-policy-agent/opa)")
	}
	return dir
}

// conformanceCase is one case of the suite with the Rego version of its set.
type conformanceCase struct {
	name    string // "v0/<note>" or "v1/<note>"
	version ast.RegoVersion
	tc      cases.TestCase
}

func loadConformanceCases(t testing.TB) []conformanceCase {
	t.Helper()
	root := filepath.Join(opaModuleDir(t), "v1", "test", "cases", "testdata")
	var out []conformanceCase
	for _, set := range []struct {
		dir     string
		version ast.RegoVersion
	}{{"v0", ast.RegoV0}, {"v1", ast.RegoV1}} {
		s, err := cases.Load(filepath.Join(root, set.dir))
		if err != nil {
			t.Fatalf("load OPA's conformance cases: %v", err)
		}
		for _, tc := range s.Sorted().Cases {
			out = append(out, conformanceCase{name: set.dir + "/" + tc.Note, version: set.version, tc: tc})
		}
	}
	return out
}

// conformanceProgram is one case compiled as the engine compiles bundles.
type conformanceProgram struct {
	topdown rego.PreparedEvalQuery
	plan    rego.PreparedEvalQuery
	data    *ast.Term
	refusal string // why irvm refuses the plan; "" when it runs it
}

// outcome classes of a case that does not reach both evaluators.
const (
	outcomeCompile = "does not compile as a Bulkhead bundle (both evaluators refuse it)"
	outcomeQuery   = "query does not prepare (both evaluators refuse it)"
)

// compileOutcome classes a compile error of a case.
func compileOutcome(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "undefined function"), strings.Contains(msg, "undefined ref"),
		strings.Contains(msg, "with keyword target must reference existing"): // mocks of such a built-in
		return outcomeCompile + ": calls or mocks a built-in Bulkhead's capabilities leave out (non-deterministic)"
	case strings.Contains(msg, "conflicting rule for data path"):
		return outcomeCompile + ": rules define a path the data holds (OPA's path-conflicts check)"
	}
	return outcomeCompile + ": another compile error"
}

// prepareCase compiles c. A non-empty skip says why neither evaluator can
// run it (the bundle would be refused at load).
func prepareCase(ctx context.Context, c conformanceCase) (p *conformanceProgram, skip string, err error) {
	popts := ast.ParserOptions{RegoVersion: c.version, ProcessAnnotation: true}
	modules := map[string]*ast.Module{}
	for i, src := range c.tc.Modules {
		name := fmt.Sprintf("test-%d.rego", i)
		m, err := ast.ParseModuleWithOpts(name, src, popts)
		if err != nil {
			return nil, outcomeCompile, nil
		}
		modules[name] = m
	}
	var data map[string]any
	if c.tc.Data != nil {
		data = *c.tc.Data
	} else {
		data = map[string]any{}
	}
	store := newStore(data)
	compiler, err := newCompiler(ctx, modules, store)
	if err != nil {
		return nil, compileOutcome(err), nil
	}
	query := queryText(c)
	td, err := rego.New(
		rego.Query(query),
		rego.Compiler(compiler),
		rego.Store(store),
		rego.StrictBuiltinErrors(true),
		rego.GenerateJSON(keepAST),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, outcomeQuery, nil
	}
	p = &conformanceProgram{topdown: td}
	if p.data, err = dataTerm(ctx, store); err != nil {
		return nil, "", err
	}
	// The engine's own path decides whether the plan runs.
	if _, err := planQuery(ctx, compiler, query); err != nil {
		if !errors.Is(err, irvm.ErrUnsupported) {
			return nil, "", fmt.Errorf("plan: %w", err)
		}
		p.refusal = refusalReason(err)
		return p, "", nil
	}
	defer compiler.WithEvalMode(ast.EvalModeTopdown)
	p.plan, err = rego.New(
		rego.Query(query),
		rego.Compiler(compiler),
		rego.Store(store),
		rego.StrictBuiltinErrors(true),
		rego.GenerateJSON(keepAST),
		rego.Target(conformanceTarget),
	).PrepareForEval(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("the engine plans the query, the test's target does not: %w", err)
	}
	return p, "", nil
}

// queryText is the case's query as the engine would be given it: a v0
// query is printed from its v0 parse, which the v1 parser reads alike.
func queryText(c conformanceCase) string {
	if c.version != ast.RegoV0 {
		return c.tc.Query
	}
	body, err := ast.ParseBodyWithOpts(c.tc.Query, ast.ParserOptions{RegoVersion: ast.RegoV0})
	if err != nil {
		return c.tc.Query
	}
	return body.String()
}

var locationPrefix = regexp.MustCompile(`^(function [^:]+: |plan [^:]+: )?([^:]*:\d+:\d+: )?`)

// refusalReason is irvm's refusal without the function and place, so
// that one reason groups many cases.
func refusalReason(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, irvm.ErrUnsupported.Error()+": "); i >= 0 {
		msg = msg[i+len(irvm.ErrUnsupported.Error())+2:]
	} else {
		msg = locationPrefix.ReplaceAllString(msg, "")
	}
	if len(msg) > 160 {
		msg = msg[:160]
	}
	return msg
}

// evalOutcome is a result set (sorted canonical results) or an error class.
type evalOutcome struct {
	results []string
	errCode string
	err     error
}

func (o evalOutcome) String() string {
	if o.err != nil {
		return "error " + o.errCode + " (" + o.err.Error() + ")"
	}
	if len(o.results) == 0 {
		return "undefined"
	}
	return strings.Join(o.results, " ")
}

func sameOutcome(a, b evalOutcome) bool {
	if (a.err == nil) != (b.err == nil) {
		return false
	}
	if a.err != nil {
		return a.errCode == b.errCode
	}
	return slices.Equal(a.results, b.results)
}

// errorCode is the class of an evaluation error: OPA's error code.
func errorCode(err error) string {
	var te *topdown.Error
	if errors.As(err, &te) {
		return te.Code
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "cancelled"
	}
	return "other"
}

func evalCase(ctx context.Context, pq rego.PreparedEvalQuery, input *ast.Term, data *ast.Term) evalOutcome {
	opts := []rego.EvalOption{}
	if input != nil {
		opts = append(opts, rego.EvalParsedInput(input.Value))
	}
	rs, err := pq.Eval(context.WithValue(ctx, conformanceDataKey{}, data), opts...)
	if err != nil {
		return evalOutcome{err: err, errCode: errorCode(err)}
	}
	seen := map[string]bool{}
	var out []string
	for _, r := range rs {
		obj := ast.NewObject()
		for k, v := range r.Bindings {
			obj.Insert(ast.StringTerm(k), ast.NewTerm(asValue(v)))
		}
		exprs := make([]*ast.Term, 0, len(r.Expressions))
		for _, e := range r.Expressions {
			exprs = append(exprs, ast.NewTerm(asValue(e.Value)))
		}
		s := ast.NewObject(
			ast.Item(ast.StringTerm("bindings"), ast.NewTerm(obj)),
			ast.Item(ast.StringTerm("expressions"), ast.ArrayTerm(exprs...)),
		).String()
		if !seen[s] { // a result set: topdown may find one result twice
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return evalOutcome{results: out}
}

func asValue(v any) ast.Value {
	if x, ok := v.(ast.Value); ok {
		return x
	}
	x, err := ast.InterfaceToValue(v)
	if err != nil {
		return ast.String(fmt.Sprintf("%T %v", v, v))
	}
	return x
}

// unrelatedInputs are evaluated between the case's own evaluations, so
// that a rule cache filled by one input must not answer another.
var unrelatedInputs = []*ast.Term{
	nil,
	ast.MustParseTerm(`{}`),
	ast.MustParseTerm(`{"x": 1, "y": "a", "a": {"b": 2}}`),
	ast.MustParseTerm(`1`),
	ast.MustParseTerm(`"s"`),
	ast.MustParseTerm(`[1, 2, {"a": 1}]`),
}

func caseInput(c conformanceCase) (*ast.Term, error) {
	switch {
	case c.tc.InputTerm != nil:
		return ast.ParseTerm(*c.tc.InputTerm)
	case c.tc.Input != nil:
		v, err := ast.InterfaceToValue(*c.tc.Input)
		if err != nil {
			return nil, err
		}
		return ast.NewTerm(v), nil
	}
	return nil, nil
}

// deferralCause classes why irvm handed an evaluation to the interpreter.
func deferralCause(err error) string {
	var d *irvm.DeferredError
	if !errors.As(err, &d) {
		return "not deferred"
	}
	var te *topdown.Error
	if errors.As(d.Cause, &te) {
		return "error " + te.Code
	}
	return "a key read by path in base data"
}

// checkCase returns the first disagreement between the evaluators on c.
// An evaluation irvm defers (irvm.ErrDeferred) is answered by the
// interpreter, as the engine does; deferred counts them by cause.
func checkCase(ctx context.Context, c conformanceCase, p *conformanceProgram, deferred map[string]int) error {
	input, err := caseInput(c)
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	want := evalCase(ctx, p.topdown, input, p.data)
	check := func(step string, in *ast.Term, want evalOutcome) error {
		got := evalCase(ctx, p.plan, in, p.data)
		if errors.Is(got.err, irvm.ErrDeferred) {
			cause := deferralCause(got.err)
			switch {
			case want.err == nil:
				cause += ", topdown answers without error"
			case "error "+want.errCode == cause:
				cause += ", topdown errs alike"
			default:
				cause += ", topdown errs otherwise (" + want.errCode + ")"
			}
			deferred[cause]++
			return nil
		}
		if !sameOutcome(got, want) {
			return fmt.Errorf("%s: input %v:\n  topdown: %v\n  irvm:    %v", step, in, want, got)
		}
		return nil
	}
	if err := check("first evaluation", input, want); err != nil {
		return err
	}
	if err := check("second evaluation", input, want); err != nil {
		return err
	}
	for _, u := range unrelatedInputs {
		if err := check("unrelated input", u, evalCase(ctx, p.topdown, u, p.data)); err != nil {
			return err
		}
	}
	return check("evaluation after unrelated inputs", input, want)
}

func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("OPA's conformance suite takes a while; not in -short")
	}
	ctx := context.Background()
	all := loadConformanceCases(t)
	listed := map[string]string{}
	if raw, err := os.ReadFile(refusalsFile); err == nil {
		if err := json.Unmarshal(raw, &listed); err != nil {
			t.Fatalf("%s: %v", refusalsFile, err)
		}
	} else if !*updateRefusals {
		t.Fatalf("%s: %v", refusalsFile, err)
	}
	var (
		agree      int
		skipped    = map[string]int{}
		refusedBy  = map[string]int{}
		refusals   = map[string]string{}
		deferred   = map[string]int{}
		disagree   []string
		listIssues []string
	)
	for _, c := range all {
		p, skip, err := func() (p *conformanceProgram, skip string, err error) {
			for k, v := range c.tc.Env {
				t.Setenv(k, v)
			}
			return prepareCase(ctx, c)
		}()
		switch {
		case err != nil:
			disagree = append(disagree, fmt.Sprintf("%s: %v", c.name, err))
			continue
		case skip != "":
			skipped[skip]++
			continue
		case p.refusal != "":
			refusedBy[p.refusal]++
			refusals[c.name] = p.refusal
			if want, ok := listed[c.name]; !ok {
				listIssues = append(listIssues, fmt.Sprintf("%s: refused (%s) but not listed in %s", c.name, p.refusal, refusalsFile))
			} else if want != p.refusal {
				listIssues = append(listIssues, fmt.Sprintf("%s: refused (%s), listed for %q", c.name, p.refusal, want))
			}
			continue
		}
		if _, ok := listed[c.name]; ok {
			listIssues = append(listIssues, fmt.Sprintf("%s: listed in %s but irvm runs it", c.name, refusalsFile))
		}
		if err := checkCase(ctx, c, p, deferred); err != nil {
			disagree = append(disagree, fmt.Sprintf("%s: %v", c.name, err))
			continue
		}
		agree++
	}
	nrefused := len(refusals)
	t.Logf("OPA conformance cases: %d; irvm agrees with topdown on %d; refused (topdown decides) %d; disagree %d", len(all), agree, nrefused, len(disagree))
	for _, reason := range sortedKeys(skipped) {
		t.Logf("  not run, %s: %d", reason, skipped[reason])
	}
	for _, reason := range sortedKeys(refusedBy) {
		t.Logf("  refused, %s: %d", reason, refusedBy[reason])
	}
	for _, cause := range sortedKeys(deferred) {
		t.Logf("  evaluations deferred to topdown (of %d per case), %s: %d", 3+len(unrelatedInputs), cause, deferred[cause])
	}
	t.Logf("  exceptions (refusals listed in %s): %d", refusalsFile, len(listed))
	if *updateRefusals {
		raw, err := json.MarshalIndent(refusals, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(refusalsFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(refusalsFile, append(raw, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		listIssues = nil
	}
	for _, d := range disagree {
		t.Errorf("irvm disagrees with topdown: %s", d)
	}
	for _, l := range listIssues {
		t.Error(l)
	}
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
