package main

import (
	"fmt"
	"io"

	"github.com/bulkhead-runtime/bulkhead/internal/version"
)

func init() {
	commands["version"] = command{
		summary: "the version, commit and Go release of this build (also --version)",
		run:     versionMain,
	}
}

func versionMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("version", "", stderr)
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	fmt.Fprintln(stdout, "bulkhead", version.String())
	return exitOK
}
