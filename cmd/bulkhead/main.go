// Command bulkhead is the operator's CLI: policy bundles, MIG planning and the
// node's state. Each subcommand lives in its own file and registers itself.
//
// Every subcommand keeps the same conventions: help (-h, --help, help)
// prints on stdout and exits 0; a usage error (an unknown flag, a missing or
// extra argument, a bad value) prints what is wrong and the usage on stderr
// and exits 2; a failure while doing the work exits 1.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// Exit codes every subcommand shares (policy eval adds exitDeny).
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// command is one subcommand. run returns the process exit code.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

// commands is filled by init functions of the subcommand files.
var commands = map[string]command{}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help":
		usage(stdout)
		return exitOK
	case "help":
		// `bulkhead help mig plan` is `bulkhead mig plan --help`.
		if len(args) == 1 {
			usage(stdout)
			return exitOK
		}
		cmd, ok := commands[args[1]]
		if !ok {
			fmt.Fprintf(stderr, "bulkhead help: unknown command %q\n", args[1])
			usage(stderr)
			return exitUsage
		}
		return cmd.run(append(args[2:len(args):len(args)], "--help"), stdout, stderr)
	case "-version", "--version":
		return versionMain(args[1:], stdout, stderr)
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "bulkhead: unknown command %q\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return cmd.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: bulkhead <command> [arguments]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-8s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\n`bulkhead help <command>` or `bulkhead <command> --help` shows a command's usage.")
	fmt.Fprintln(w, "exit status: 0 done, 1 failure, 2 usage error (policy eval: 3 deny)")
}

// newFlagSet is the flag set of subcommand name ("mig plan"); errors and
// usage go to stderr and carry the full command name. Its usage is the
// synopsis line, then the flags; parseFlags prints it on stdout for help.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bulkhead "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\nflags:\n", strings.TrimSpace(fs.Name()+" "+synopsis))
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs, flags before or after the positional
// arguments (`netpol stats TENANT --help`, `policy test PATH -v`); "--" ends
// the flags. It returns the positional arguments and -1 to go on, or the
// exit code: exitOK after printing the usage on stdout for -h or --help,
// exitUsage after printing the error and the usage on stderr.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, int) {
	usage := fs.Usage
	if usage == nil {
		usage = fs.PrintDefaults
	}
	// The flag package prints the usage where errors go; print it here
	// instead, on the stream the outcome calls for.
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			stderr := fs.Output()
			fs.SetOutput(stdout)
			usage()
			fs.SetOutput(stderr)
			return nil, exitOK
		}
		if err != nil { // the flag package has printed it
			usage()
			return nil, exitUsage
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(positional, rest...), -1
		}
		if len(rest) == 0 {
			return positional, -1
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// parseNoArgs is parseFlags for a command that takes no positional
// argument: one is a usage error.
func parseNoArgs(fs *flag.FlagSet, args []string, stdout io.Writer) int {
	rest, rc := parseFlags(fs, args, stdout)
	if rc < 0 && len(rest) > 0 {
		return usageError(fs, "unexpected argument %q", rest[0])
	}
	return rc
}

// usageError prints "bulkhead mig plan: <what is wrong>" and fs's usage on
// its output (stderr), and returns exitUsage.
func usageError(fs *flag.FlagSet, format string, a ...any) int {
	fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	fs.Usage()
	return exitUsage
}
