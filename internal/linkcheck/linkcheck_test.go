package linkcheck

import "testing"

// recorder is a testing.TB that records the errors it is told.
type recorder struct {
	testing.TB
	errors int
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.errors++ }

func TestForbid(t *testing.T) {
	deps := []string{"a/b", "a/b/c", "a/bc", "x/y"}
	for _, tc := range []struct {
		forbidden string
		errors    int
	}{
		{"a/b", 1},      // exactly that package
		{"a/b/...", 1},  // it and those below it, not a/bc
		{"a/bc/...", 1}, // a/bc itself
		{"x/z/...", 0},
		{"x", 0},
	} {
		r := &recorder{TB: t}
		Forbid(r, "bin", deps, []string{tc.forbidden})
		if r.errors != tc.errors {
			t.Errorf("Forbid(%q): %d errors, want %d", tc.forbidden, r.errors, tc.errors)
		}
	}
}

func TestNoMoreThan(t *testing.T) {
	r := &recorder{TB: t}
	NoMoreThan(r, "ours", []string{"c/ebpf", "c/ebpf/link", "d"}, "c/ebpf", "theirs", []string{"c/ebpf"})
	if r.errors != 1 {
		t.Errorf("%d errors, want 1 (c/ebpf/link)", r.errors)
	}
}
