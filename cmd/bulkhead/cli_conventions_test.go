package main

import (
	"bytes"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// subcommands is every command line that has a usage of its own, the
// registered commands first. TestEveryCommandHasARow keeps it complete.
var subcommands = [][]string{
	nil, // bulkhead itself
	{"version"},
	{"mig"}, {"mig", "profiles"}, {"mig", "plan"}, {"mig", "simulate"}, {"mig", "discover"},
	{"netpol"}, {"netpol", "endpoints"}, {"netpol", "stats"}, {"netpol", "stats", "TENANT"}, {"netpol", "gc"},
	{"node"}, {"node", "status"}, {"node", "gc"},
	{"policy"}, {"policy", "eval"}, {"policy", "test"}, {"policy", "verify"}, {"policy", "audit"},
}

// runCLI runs bulkhead with args as main does, with a node configuration
// path that does not exist, so that no command can read the host's.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	t.Setenv(config.PathEnv, filepath.Join(t.TempDir(), "absent.toml"))
	var out, errb bytes.Buffer
	code = dispatch(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestEveryCommandHasARow(t *testing.T) {
	for name := range commands {
		found := false
		for _, sc := range subcommands {
			found = found || (len(sc) > 0 && sc[0] == name)
		}
		if !found {
			t.Errorf("command %q has no row in subcommands: add it and its subcommands", name)
		}
	}
}

// TestHelpOnStdout: -h, --help and help print the usage on stdout, nothing
// on stderr, and exit 0, from every command, whatever comes before them.
func TestHelpOnStdout(t *testing.T) {
	var cases [][]string
	for _, sc := range subcommands {
		cases = append(cases, append(sc[:len(sc):len(sc)], "--help"), append(sc[:len(sc):len(sc)], "-h"))
		if len(sc) < 2 {
			cases = append(cases, append([]string{"help"}, sc...))
		}
	}
	cases = append(cases,
		[]string{"mig", "help"}, []string{"node", "help"}, []string{"policy", "help"}, []string{"netpol", "help"},
		[]string{"help", "mig", "simulate"},
		[]string{"netpol", "-pin-dir", "/nonexistent", "stats", "TENANT", "--help"},
		[]string{"policy", "test", "PATH", "-v", "--help"},
		[]string{"mig", "plan", "--gpu", "h200", "--help"},
	)
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, args...)
			if code != exitOK || !strings.Contains(stdout, "usage") || stderr != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0, the usage on stdout, nothing on stderr", code, stdout, stderr)
			}
		})
	}
}

// TestUnknownFlagIsUsage: an unknown flag anywhere exits 2 with its name
// and the usage on stderr, and nothing on stdout.
func TestUnknownFlagIsUsage(t *testing.T) {
	for _, sc := range subcommands {
		args := append(sc[:len(sc):len(sc)], "--no-such-flag")
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, args...)
			if code != exitUsage || !strings.Contains(stderr, "-no-such-flag") || !strings.Contains(stderr, "usage") || stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and the flag's name and the usage on stderr", code, stdout, stderr)
			}
		})
	}
}

// TestUsageErrors: missing, extra and bad arguments exit 2 and say what is
// wrong on stderr, before the usage; runtime failures exit 1.
func TestUsageErrors(t *testing.T) {
	input := writeJSON(t, agentInput("bulkhead"))
	simulate := []string{"mig", "simulate", "--gpu", "h200", "--gpus", "1", "--synthetic", "1"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "usage: bulkhead <command>"},
		{[]string{"help", "frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"version", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"netpol", "stats"}, exitUsage, "stats takes one TENANT, got 0"},
		{[]string{"netpol", "stats", "a", "b"}, exitUsage, "stats takes one TENANT, got 2"},
		{[]string{"netpol", "endpoints", "extra"}, exitUsage, `endpoints: unexpected argument "extra"`},
		{[]string{"netpol", "frobnicate"}, exitUsage, `unknown verb "frobnicate"`},
		{[]string{"mig", "plan", "--gpu", "h200", "--request", "1g.18gb", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"mig", "plan", "--gpu", "h200", "--gpus", "x"}, exitUsage, `invalid value "x" for flag -gpus`},
		{[]string{"policy", "test"}, exitUsage, "want exactly one bundle PATH, got 0"},
		{[]string{"policy", "test", "a", "b"}, exitUsage, "want exactly one bundle PATH, got 2"},
		{[]string{"policy", "verify", "--bundle", "b.tar.gz"}, exitUsage, "--bundle, --key and --key-id are required"},
		// Failures of the work itself are not usage errors.
		{[]string{"policy", "eval", "--bundle", "/nonexistent", "--input", input}, exitError, "--bundle"},
		{append(simulate, "--write-trace", "/nonexistent/dir/trace"), exitError, "--write-trace"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.code, tc.want)
			}
			if tc.code == exitUsage && !strings.Contains(stderr[strings.Index(stderr, tc.want):], "usage") {
				t.Errorf("stderr %q: want the usage after the error", stderr)
			}
		})
	}
}

// TestSimulateArrivalsBounds: --arrivals outside 1..maxArrivals is refused
// with the flag and the bound named, not run for minutes or replaced by
// the generator's default.
func TestSimulateArrivalsBounds(t *testing.T) {
	simulate := []string{"mig", "simulate", "--gpu", "h200", "--gpus", "1", "--synthetic", "1"}
	for _, n := range []string{"0", "-5", "100001", "2000000000"} {
		code, stdout, stderr := runCLI(t, append(simulate, "--arrivals", n)...)
		if want := "--arrivals " + n + ": must be 1..100000"; code != exitUsage || !strings.Contains(stderr, want) || stdout != "" {
			t.Errorf("--arrivals %s: exit %d, stderr %q; want exit 2 and %q", n, code, stderr, want)
		}
	}
	for _, n := range []string{"1", "12"} {
		if code, stdout, stderr := runCLI(t, append(simulate, "--arrivals", n)...); code != exitOK || !strings.Contains(stdout, n+" arrivals") {
			t.Errorf("--arrivals %s: exit %d, stdout %q, stderr %q; want a run", n, code, stdout, stderr)
		}
	}
}

// TestKeyIDNeedsKey: without --key nothing is verified, so a --key-id (or
// --scope) alone is refused rather than read as a check that never happens.
func TestKeyIDNeedsKey(t *testing.T) {
	input := writeJSON(t, agentInput("bulkhead"))
	for _, extra := range [][]string{{"--key-id", "prod"}, {"--scope", "node"}, {"--key-id", "prod", "--scope", "node"}} {
		args := append([]string{"policy", "eval", "--bundle", "../../rego", "--input", input}, extra...)
		code, stdout, stderr := runCLI(t, args...)
		if code != exitUsage || !strings.Contains(stderr, "--key-id and --scope need --key") || stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and the refusal", extra, code, stdout, stderr)
		}
	}
}

// TestVersion: `bulkhead version` and `bulkhead --version` name the
// version, the commit and the Go release the binary was built with.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, stdout, stderr := runCLI(t, args...)
		if code != exitOK || stderr != "" || !strings.HasPrefix(stdout, "bulkhead ") ||
			!strings.Contains(stdout, " commit ") || !strings.Contains(stdout, runtime.Version()) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0 and bulkhead VERSION commit COMMIT %s", args, code, stdout, stderr, runtime.Version())
		}
	}
}
