package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// TestFlagsExitCodes: --version and --help answer on stdout with 0 before
// any required flag is checked; a bad flag exits 2 on stderr.
func TestFlagsExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     []string
		stderr     string
		quietError bool // stderr must stay empty
	}{
		{[]string{"--version"}, 0, []string{"bulkhead-webhook ", " commit ", runtime.Version()}, "", true},
		{[]string{"-version"}, 0, []string{"bulkhead-webhook ", runtime.Version()}, "", true},
		{[]string{"--help"}, 0, []string{"-tls-cert", "-version"}, "", true},
		{[]string{"-h"}, 0, []string{"-bundle"}, "", true},
		{[]string{"--no-such-flag"}, 2, nil, "-no-such-flag", false},
		{[]string{"--bundle", "b"}, 2, nil, "--tls-cert and --tls-key are required", false},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			ok := code == tc.code && strings.Contains(stderr.String(), tc.stderr) && (!tc.quietError || stderr.Len() == 0)
			for _, w := range tc.stdout {
				ok = ok && strings.Contains(stdout.String(), w)
			}
			if !ok {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d, stdout with %q, stderr with %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
