// Package version names the build every Bulkhead binary reports.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the release, set at link time (make build:
// -X github.com/bulkhead-runtime/bulkhead/internal/version.Version=v0.x.y,
// from `git describe --tags --always --dirty`).
var Version = "dev"

// Commit is the commit the build came from, set at link time like Version.
// Empty means the one the go command stamped (vcs.revision), which it does
// only when it builds inside a checkout with VCS stamping on.
var Commit = ""

// String is the version, the commit it was built from and the Go release,
// as `--version` prints them: "v0.3.0 commit 1a2b3c… go1.26.10".
func String() string {
	commit, modified := Commit, false
	if bi, ok := debug.ReadBuildInfo(); ok && commit == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if commit == "" {
		commit = "unknown"
	}
	if modified {
		commit += "-dirty"
	}
	// runtime.Version is the release the binary was linked with, the one
	// whose fixes it carries.
	return Version + " commit " + commit + " " + runtime.Version()
}
