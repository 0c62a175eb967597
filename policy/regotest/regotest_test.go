package regotest

import (
	"context"
	"path/filepath"
	"testing"
)

// CoverageGate is the minimum line coverage of rego/ (tests excluded).
const CoverageGate = 90.0

// regoDir is the default bundle; go test runs in the package directory.
func regoDir(t *testing.T) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "rego"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDefaultBundleRegoTestsAndCoverage runs every _test.rego of the default
// bundle and fails below CoverageGate percent line coverage of rego/.
func TestDefaultBundleRegoTestsAndCoverage(t *testing.T) {
	rep, err := Run(context.Background(), regoDir(t))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, r := range rep.Results {
		if !r.Pass {
			t.Errorf("%s (%s): %s", r.Name, r.Location, r.Detail)
		}
	}
	for _, f := range rep.Files {
		t.Logf("coverage %-28s %6.2f%% (%d/%d lines) missing %v", f.File, f.Percent, f.Covered, f.Covered+f.NotCovered, f.MissingLines)
	}
	t.Logf("Rego tests: %d; line coverage of rego/ (tests excluded): %.2f%%; with tests (as opa test --coverage): %.2f%%",
		len(rep.Results), rep.Coverage, rep.CoverageWithTests)
	if rep.Coverage < CoverageGate {
		t.Errorf("line coverage of rego/ is %.2f%%, below the %.0f%% gate", rep.Coverage, CoverageGate)
	}
}
