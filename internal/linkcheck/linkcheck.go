// Package linkcheck says what a Go package links, for the tests that keep
// Bulkhead's shims thin (each shim's main_test.go, with go list -deps).
package linkcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Deps lists the packages pkg links (go list -deps), or skips the test
// when no go tool is at hand.
func Deps(tb testing.TB, pkg string) []string {
	tb.Helper()
	gotool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gotool); err != nil {
		tb.Skipf("no go tool at %s (%v): cannot list %s's dependencies", gotool, err, pkg)
	}
	out, err := exec.Command(gotool, "list", "-deps", pkg).CombinedOutput()
	if err != nil {
		tb.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}

// Forbid fails tb for each of forbidden that deps (what binary links)
// contains: an entry ending in "/..." names a package and those below it,
// any other one package.
func Forbid(tb testing.TB, binary string, deps, forbidden []string) {
	tb.Helper()
	for _, f := range forbidden {
		tree, isTree := strings.CutSuffix(f, "/...")
		var linked []string
		for _, pkg := range deps {
			if pkg == f || isTree && (pkg == tree || strings.HasPrefix(pkg, tree+"/")) {
				linked = append(linked, pkg)
			}
		}
		if len(linked) > 0 {
			tb.Errorf("%s links %d packages of %s, want none; the first: %s", binary, len(linked), f, strings.Join(linked[:min(len(linked), 5)], ", "))
		}
	}
}

// NoMoreThan fails tb for each package under prefix that deps (what binary
// links) has and upstream's (what upstreamName links) has not.
func NoMoreThan(tb testing.TB, binary string, deps []string, prefix, upstreamName string, upstream []string) {
	tb.Helper()
	for _, pkg := range deps {
		if strings.HasPrefix(pkg, prefix) && !slices.Contains(upstream, pkg) {
			tb.Errorf("%s links %s, which %s does not", binary, pkg, upstreamName)
		}
	}
}
