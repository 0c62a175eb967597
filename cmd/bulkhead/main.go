// Command bulkhead is the operator's CLI: policy bundles, MIG planning and the
// node's state. Each subcommand lives in its own file and registers itself.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
)

// command is one subcommand. run returns the process exit code.
type command struct {
	summary string
	run     func(args []string) int
}

// commands is filled by init functions of the subcommand files.
var commands = map[string]command{}

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "bulkhead: unknown command %q\n", args[0])
		usage()
		return 2
	}
	return cmd.run(args[1:])
}

// newFlagSet is the flag set of subcommand name ("mig plan"); errors and
// usage go to stderr and carry the full command name.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bulkhead "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: bulkhead <command> [arguments]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", name, commands[name].summary)
	}
}
