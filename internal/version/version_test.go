package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	s := String()
	if !strings.HasPrefix(s, Version+" commit ") || !strings.HasSuffix(s, " "+runtime.Version()) {
		t.Fatalf("String() = %q, want %q commit COMMIT %s", s, Version, runtime.Version())
	}
	defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
	Version, Commit = "v1.2.3", "0123456789abcdef"
	if got, want := String(), "v1.2.3 commit 0123456789abcdef "+runtime.Version(); got != want {
		t.Fatalf("with Version and Commit linked in: %q, want %q", got, want)
	}
}
