// Package regotest runs a bundle's Rego unit tests (rules named test_*) with
// OPA's own test runner and measures line coverage of the policy, so that
// `go test` and `bulkhead policy test` enforce the same gate.
package regotest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Result is the outcome of one Rego test.
type Result struct {
	// Name is package.rule, e.g. "data.bulkhead.gpu_test.test_profile_table".
	Name string
	// Location is file:row of the test.
	Location string
	Pass     bool
	// Detail says why a test failed or errored.
	Detail   string
	Duration time.Duration
}

// FileCoverage is the line coverage of one policy file (tests excluded).
type FileCoverage struct {
	File         string
	Covered      int
	NotCovered   int
	Percent      float64
	MissingLines []int
}

// Report is the outcome of a run.
type Report struct {
	Results []Result
	// Coverage is the line coverage, in percent, of the bundle's modules
	// that are not tests (files not ending in _test.rego).
	Coverage float64
	// CoverageWithTests is what `opa test --coverage` reports: every module,
	// tests included.
	CoverageWithTests float64
	Files             []FileCoverage
}

// Failed returns the results that did not pass.
func (r *Report) Failed() []Result {
	var out []Result
	for _, res := range r.Results {
		if !res.Pass {
			out = append(out, res)
		}
	}
	return out
}

// Run loads path as a bundle (directory or .tar.gz, signatures not checked:
// this is an authoring tool), compiles it with policy.Capabilities and runs
// its tests with coverage.
func Run(ctx context.Context, path string) (*Report, error) {
	popts := ast.ParserOptions{RegoVersion: ast.RegoV1, Capabilities: policy.Capabilities(), ProcessAnnotation: true}
	bundles, store, err := tester.LoadBundlesWithParserOptions([]string{path}, nil, popts)
	if err != nil {
		return nil, err
	}
	modules := map[string]*ast.Module{}
	for _, b := range bundles {
		for _, m := range b.Modules {
			if m.Parsed != nil && m.Parsed.Package != nil && m.Parsed.Package.Location != nil {
				// Coverage is recorded under the file of each location.
				modules[m.Parsed.Package.Location.File] = m.Parsed
			}
		}
	}
	txn, err := store.NewTransaction(ctx, storage.WriteParams)
	if err != nil {
		return nil, err
	}
	defer store.Abort(ctx, txn)

	cov := cover.New()
	compiler := ast.NewCompiler().
		WithCapabilities(policy.Capabilities()).
		WithEnablePrintStatements(true)
	runner := tester.NewRunner().
		SetCompiler(compiler).
		SetStore(store).
		SetBundles(bundles).
		CapturePrintOutput(true).
		RaiseBuiltinErrors(true).
		SetCoverageRuns(nil).
		SetCoverageQueryTracer(cov).
		SetTimeout(30 * time.Second)
	ch, err := runner.RunTests(ctx, txn)
	if err != nil {
		return nil, err
	}
	rep := &Report{}
	for tr := range ch {
		res := Result{
			Name:     tr.Package + "." + tr.Name,
			Pass:     tr.Pass(),
			Duration: tr.Duration,
		}
		if tr.Location != nil {
			res.Location = fmt.Sprintf("%s:%d", tr.Location.File, tr.Location.Row)
		}
		switch {
		case tr.Error != nil:
			res.Detail = "error: " + tr.Error.Error()
		case tr.Fail:
			res.Detail = "fail"
			if len(tr.Output) > 0 {
				res.Detail += ": " + strings.TrimSpace(string(tr.Output))
			}
		case tr.Skip:
			res.Detail = "skipped"
		}
		rep.Results = append(rep.Results, res)
	}
	if len(rep.Results) == 0 {
		return rep, errors.New("no Rego tests found (rules named test_* in *_test.rego)")
	}

	cr := cov.Report(modules)
	rep.CoverageWithTests = cr.Coverage
	var covered, notCovered int
	for _, file := range slices.Sorted(maps.Keys(cr.Files)) {
		if strings.HasSuffix(file, "_test.rego") {
			continue
		}
		fr := cr.Files[file]
		fc := FileCoverage{File: file, Covered: fr.CoveredLines, NotCovered: fr.NotCoveredLines, Percent: fr.Coverage}
		for _, rng := range fr.NotCovered {
			for row := rng.Start.Row; row <= rng.End.Row; row++ {
				fc.MissingLines = append(fc.MissingLines, row)
			}
		}
		covered += fr.CoveredLines
		notCovered += fr.NotCoveredLines
		rep.Files = append(rep.Files, fc)
	}
	if covered+notCovered > 0 {
		rep.Coverage = 100 * float64(covered) / float64(covered+notCovered)
	}
	return rep, nil
}
