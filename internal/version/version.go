// Package version names the build every Bulkhead binary reports.
package version

import "runtime/debug"

// Version is the release, set at link time
// (-X github.com/bulkhead-runtime/bulkhead/internal/version.Version=v0.x.y).
var Version = "dev"

// String is the version, the commit it was built from (when the build
// recorded one) and the Go release, as `--version` prints them.
func String() string {
	commit, goVersion := "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				commit = s.Value
			}
		}
	}
	return Version + " commit " + commit + " " + goVersion
}
