package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/regotest"
)

func init() {
	commands["policy"] = command{
		summary: "policy bundles: eval, test, verify, audit",
		run:     policyMain,
	}
}

// Exit codes of `bulkhead policy eval` beside exitError and exitUsage.
const (
	exitAllow = 0
	exitDeny  = 3
)

func policyUsage(w io.Writer) {
	fmt.Fprint(w, `usage:
  bulkhead policy eval --bundle PATH --input FILE [--data FILE] [--key PEM --key-id ID --scope S] [--decision-log FILE|-]
      print the decision as JSON; exit 0 allow, 3 deny, 1 error
  bulkhead policy test [--threshold PERCENT] [-v] PATH
      run the bundle's Rego tests with line coverage; exit 0 pass, 1 fail
  bulkhead policy verify --bundle PATH --key PEM --key-id ID [--scope S]
      check a bundle's signature; exit 0 valid, 1 refused
  bulkhead policy audit --bundle PATH [--data FILE] [--key PEM --key-id ID --scope S] [--kubeconfig FILE] [--json]
      judge the cluster's running pods against the bundle, as the webhook would judge
      them now; list those it would refuse; exit 0 none, 3 some, 1 error

bulkhead policy <subcommand> --help lists a subcommand's flags; exit 2 is a usage error.
`)
}

func policyMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		policyUsage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "eval":
		return policyEval(args[1:], stdout, stderr)
	case "test":
		return policyTest(args[1:], stdout, stderr)
	case "verify":
		return policyVerify(args[1:], stdout, stderr)
	case "audit":
		return policyAudit(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		policyUsage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "bulkhead policy: unknown subcommand %q\n", args[0])
	policyUsage(stderr)
	return exitUsage
}

// bundleFlags are the flags that open a bundle: eval's and audit's.
type bundleFlags struct {
	bundle, data, key, keyID, scope, evaluator *string
}

func addBundleFlags(fs *flag.FlagSet) bundleFlags {
	return bundleFlags{
		bundle:    fs.String("bundle", "", "bundle directory or .tar.gz (required)"),
		data:      fs.String("data", "", "extra data JSON merged into the bundle's data, e.g. tenants"),
		key:       fs.String("key", "", "PEM public key (file) to verify the bundle with; without it the bundle is NOT verified"),
		keyID:     fs.String("key-id", "", "key id the bundle must be signed with (required with --key, refused without)"),
		scope:     fs.String("scope", "", "scope the signature must carry (required with --key, refused without)"),
		evaluator: fs.String("evaluator", policy.EvaluatorPlan, "plan (OPA's compiled plan, interpreter as fallback) or topdown (OPA's interpreter)"),
	}
}

// check returns the exit code of a usage error, or -1 to go on.
func (b bundleFlags) check(fs *flag.FlagSet) int {
	if *b.bundle == "" {
		return usageError(fs, "--bundle is required")
	}
	// Without --key nothing is verified: a key id or scope given alone
	// would read as a check that never happens.
	if *b.key == "" && (*b.keyID != "" || *b.scope != "") {
		return usageError(fs, "--key-id and --scope need --key (the public key to verify the bundle with); without --key the bundle is not verified")
	}
	if *b.key != "" && (*b.keyID == "" || *b.scope == "") {
		return usageError(fs, "--key-id and --scope are required with --key")
	}
	if !policy.KnownEvaluator(*b.evaluator) {
		return usageError(fs, "--evaluator %q: want %s or %s", *b.evaluator, policy.EvaluatorPlan, policy.EvaluatorTopdown)
	}
	return -1
}

// options are the policy.Options the flags give; cmd names the command in
// the warning an unverified bundle gets.
func (b bundleFlags) options(cmd string, stderr io.Writer) policy.Options {
	opts := policy.Options{
		BundlePath: *b.bundle,
		DataPath:   *b.data,
		Evaluator:  *b.evaluator,
		Logger:     slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if *b.key != "" {
		opts.Keys, opts.KeyID, opts.Scope = map[string]string{*b.keyID: *b.key}, *b.keyID, *b.scope
	} else {
		opts.InsecureSkipVerification = true
		fmt.Fprintf(stderr, "bulkhead %s: WARNING: no --key given, the bundle's signature is NOT verified\n", cmd)
	}
	return opts
}

func policyEval(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy eval", "--bundle PATH --input FILE [flags]", stderr)
	bf := addBundleFlags(fs)
	inputPath := fs.String("input", "", "input document, JSON (contract v1, docs/policy.md); - for stdin (required)")
	decisionLog := fs.String("decision-log", "", "write the decision log line to FILE, or - for stdout")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	if *bf.bundle == "" || *inputPath == "" {
		return usageError(fs, "--bundle and --input are required")
	}
	if rc := bf.check(fs); rc >= 0 {
		return rc
	}
	in, err := readInput(*inputPath)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy eval:", err)
		return exitError
	}
	opts := bf.options("policy eval", stderr)
	opts.DecisionLogFile = *decisionLog
	ctx := context.Background()
	e, err := policy.Open(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy eval:", flagNames(err))
		return exitError
	}
	defer e.Close()
	// Reasons stay in the decision's order: the bundle's, which in the
	// default bundle puts the decisive one first (policy.Decision.Reasons).
	d, decideErr := e.Decide(ctx, in)
	out, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy eval:", err)
		return exitError
	}
	fmt.Fprintln(stdout, string(out))
	switch {
	case decideErr != nil:
		fmt.Fprintln(stderr, "bulkhead policy eval:", decideErr)
		return exitError
	case d.Allow:
		return exitAllow
	default:
		return exitDeny
	}
}

// readInput decodes a contract input, refusing unknown fields so that a
// misspelt field is an error rather than a silently missing value.
func readInput(path string) (policy.Input, error) {
	var in policy.Input
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return in, fmt.Errorf("--input: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("--input %s: %w", path, err)
	}
	if in.Version == "" {
		in.Version = policy.ContractVersion
	}
	return in, nil
}

func policyTest(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy test", "[--threshold PERCENT] [-v] PATH", stderr)
	threshold := fs.Float64("threshold", 0, "fail when line coverage of the non-test modules is below PERCENT")
	verbose := fs.Bool("v", false, "list every test and the lines not covered")
	paths, rc := parseFlags(fs, args, stdout)
	if rc >= 0 {
		return rc
	}
	if len(paths) != 1 {
		return usageError(fs, "want exactly one bundle PATH, got %d", len(paths))
	}
	if !(*threshold >= 0 && *threshold <= 100) {
		return usageError(fs, "--threshold %v must be between 0 and 100", *threshold)
	}
	rep, err := regotest.Run(context.Background(), paths[0])
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy test:", err)
		return exitError
	}
	failed := rep.Failed()
	for _, r := range rep.Results {
		if *verbose || !r.Pass {
			status := "PASS"
			if !r.Pass {
				status = "FAIL"
			}
			fmt.Fprintf(stdout, "%s %s (%s)", status, r.Name, r.Location)
			if r.Detail != "" {
				fmt.Fprintf(stdout, ": %s", r.Detail)
			}
			fmt.Fprintln(stdout)
		}
	}
	for _, f := range rep.Files {
		fmt.Fprintf(stdout, "coverage %6.2f%% %s", f.Percent, f.File)
		if *verbose && len(f.MissingLines) > 0 {
			fmt.Fprintf(stdout, " (not covered: %s)", strings.Trim(fmt.Sprint(f.MissingLines), "[]"))
		}
		fmt.Fprintln(stdout)
	}
	fmt.Fprintf(stdout, "%d tests, %d failed; line coverage %.2f%% (policy files), %.2f%% (with tests)\n",
		len(rep.Results), len(failed), rep.Coverage, rep.CoverageWithTests)
	if len(failed) > 0 {
		return exitError
	}
	if rep.Coverage < *threshold {
		fmt.Fprintf(stderr, "bulkhead policy test: coverage %.2f%% is below --threshold %.2f%%\n", rep.Coverage, *threshold)
		return exitError
	}
	return 0
}

func policyVerify(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("policy verify", "--bundle PATH --key PEM --key-id ID [--scope S]", stderr)
	bundlePath := fs.String("bundle", "", "bundle .tar.gz or directory (required)")
	key := fs.String("key", "", "PEM public key, or a file holding it (required)")
	keyID := fs.String("key-id", "", "key id the bundle must be signed with (required)")
	scope := fs.String("scope", "", "scope the signature must carry (default: none)")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	if *bundlePath == "" || *key == "" || *keyID == "" {
		return usageError(fs, "--bundle, --key and --key-id are required")
	}
	rev, err := policy.VerifyBundle(*bundlePath, *key, *keyID, *scope)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead policy verify: REFUSED:", flagNames(err))
		return exitError
	}
	fmt.Fprintf(stdout, "bundle %s: signature valid (key id %s, scope %q), revision %s\n", *bundlePath, *keyID, *scope, rev)
	return 0
}

// policyFlags maps the policy package's Options fields, which its errors
// name for Go callers, to this command's flags.
var policyFlags = strings.NewReplacer(
	"Options.BundlePath", "--bundle",
	"Options.DataPath", "--data",
	"Options.DecisionLogFile", "--decision-log",
	"Options.Evaluator", "--evaluator",
	"Options.KeyID", "--key-id",
	"Options.Keys", "--key",
	"Options.Scope", "--scope",
	"Options.InsecureSkipVerification", "(no --key given)",
	"required with Keys", "required with --key",
)

var keysField = regexp.MustCompile(`Options\.Keys\["[^"]*"\]`)

// flagNames rewrites an error of the policy package in the CLI's words.
func flagNames(err error) string {
	msg := keysField.ReplaceAllString(err.Error(), "--key")
	msg = policyFlags.Replace(msg)
	return strings.Replace(msg, "policy: ", "", 1)
}
