package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/simulate"
)

func init() {
	commands["mig"] = command{
		summary: "MIG geometry, placement plans and packing simulations",
		run:     func(args []string) int { return migMain(args, os.Stdout, os.Stderr) },
	}
}

const migUsage = `usage: bulkhead mig <subcommand> [flags]

subcommands:
  profiles --gpu MODEL                      the MIG profiles of a GPU model
  plan --gpu MODEL [--gpus N] --request P,P  place slices on an empty node (exit 1 if they do not fit)
  simulate --gpu MODEL [--gpus N] --synthetic SEED | --trace FILE
                                            acceptance, fragmentation and utilisation per strategy

models: ` + "h200, h100, a100-40gb, a100-80gb, b200" + `
`

func migMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, migUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch args[0] {
	case "profiles":
		return migProfiles(args[1:], stdout, stderr)
	case "plan":
		return migPlan(args[1:], stdout, stderr)
	case "simulate":
		return migSimulate(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "bulkhead mig: unknown subcommand %q\n%s", args[0], migUsage)
	return 2
}

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("bulkhead mig "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags and refuses positional arguments; it returns the exit
// code to use, or -1 to go on.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2
	}
	return -1
}

func migProfiles(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("profiles", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	m, err := mig.Model(*gpu)
	if err != nil {
		fmt.Fprintf(stderr, "%s: --gpu: %v\n", fs.Name(), err)
		return 2
	}
	fmt.Fprintf(stdout, "%s: %d compute slices, %d memory slots, %d GB\n", m.Product, mig.ComputeSlices, mig.MemorySlots, m.MemoryGB)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROFILE\tCOMPUTE\tMEMORY\tSLOTS\tINSTANCES\tPLACEMENTS")
	for _, p := range m.Profiles {
		starts := make([]string, len(p.Starts))
		for i, s := range p.Starts {
			starts[i] = fmt.Sprint(s)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d GB\t%d\t%d\t{%s}:%d\n", p.Name, p.Compute, p.MemoryGB, p.Slots, p.Instances, strings.Join(starts, ","), p.Slots)
	}
	tw.Flush()
	return 0
}

func strategyFlag(s string) (mig.Strategy, error) {
	switch s {
	case "best-fit":
		return mig.BestFit, nil
	case "first-fit":
		return mig.FirstFit, nil
	case "spread":
		return mig.Spread, nil
	}
	return 0, fmt.Errorf("--strategy %q: want best-fit, first-fit or spread", s)
}

func migPlan(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("plan", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	gpus := fs.Int("gpus", 1, "GPUs on the node")
	request := fs.String("request", "", "comma-separated profiles to place, in order (e.g. 3g.71gb,2g.35gb)")
	tenant := fs.String("tenant", "default", "tenant of every request")
	isolation := fs.String("isolation", "", `co-tenancy rule of every request: "", tenant or exclusive`)
	strategy := fs.String("strategy", "best-fit", "best-fit, first-fit or spread")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	strat, err := strategyFlag(*strategy)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2
	}
	if _, err := mig.Model(*gpu); err != nil {
		fmt.Fprintf(stderr, "%s: --gpu: %v\n", fs.Name(), err)
		return 2
	}
	if *gpus < 1 || *gpus > 64 {
		fmt.Fprintf(stderr, "%s: --gpus %d: must be 1..64\n", fs.Name(), *gpus)
		return 2
	}
	if strings.TrimSpace(*request) == "" {
		fmt.Fprintf(stderr, "%s: --request: name at least one profile\n", fs.Name())
		return 2
	}
	a, err := mig.NewAllocator(mig.NodeGPUs(*gpu, *gpus), nil, mig.WithStrategy(strat))
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2
	}
	names := strings.Split(*request, ",")
	var placed []mig.Placement
	for i, name := range names {
		req := mig.Request{Owner: fmt.Sprintf("request-%d", i+1), Tenant: *tenant, Profile: strings.TrimSpace(name), Isolation: mig.Isolation(*isolation)}
		p, err := a.Allocate(req)
		if errors.Is(err, mig.ErrInsufficientResources) {
			fmt.Fprintf(stderr, "%v (request %d of %d)\n", err, i+1, len(names))
			return 1
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: --request %d (%q): %v\n", fs.Name(), i+1, name, err)
			return 2
		}
		placed = append(placed, p)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST\tGPU\tPROFILE\tSTART\tSIZE\tCOMPUTE")
	for i, p := range placed {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%d\t%d\n", i+1, p.GPU, p.Profile, p.Start, p.Size, p.Compute)
	}
	tw.Flush()
	return 0
}

func migSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("simulate", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	gpus := fs.Int("gpus", 8, "GPUs on the node")
	seed := fs.Int64("synthetic", -1, "generate a synthetic trace with this seed")
	trace := fs.String("trace", "", "replay this trace file (see docs/mig.md for the format)")
	arrivals := fs.Int("arrivals", 2000, "synthetic: number of requests")
	load := fs.Float64("load", 1.5, "synthetic: offered compute as a share of the node's (above 1 is overload)")
	isolated := fs.Float64("isolated", 0, "synthetic: share of requests that keep their GPU to their tenant")
	writeTrace := fs.String("write-trace", "", "synthetic: also write the generated trace to this file")
	if rc := parse(fs, args, stderr); rc >= 0 {
		return rc
	}
	if _, err := mig.Model(*gpu); err != nil {
		fmt.Fprintf(stderr, "%s: --gpu: %v\n", fs.Name(), err)
		return 2
	}
	if *gpus < 1 || *gpus > 64 {
		fmt.Fprintf(stderr, "%s: --gpus %d: must be 1..64\n", fs.Name(), *gpus)
		return 2
	}
	if (*seed >= 0) == (*trace != "") {
		fmt.Fprintf(stderr, "%s: give exactly one of --synthetic SEED and --trace FILE\n", fs.Name())
		return 2
	}
	var events []simulate.Event
	source := ""
	if *trace != "" {
		f, err := os.Open(*trace)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --trace: %v\n", fs.Name(), err)
			return 2
		}
		events, err = simulate.ParseTrace(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "%s: --trace %s: %v\n", fs.Name(), *trace, err)
			return 2
		}
		source = "trace " + *trace
	} else {
		var err error
		events, err = simulate.Synthetic(simulate.SyntheticOptions{Model: *gpu, GPUs: *gpus, Seed: uint64(*seed),
			Arrivals: *arrivals, Load: *load, IsolatedShare: *isolated})
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
			return 2
		}
		source = fmt.Sprintf("synthetic seed %d, %d arrivals, load %.2f, isolated %.2f", *seed, *arrivals, *load, *isolated)
		if *writeTrace != "" {
			if err := writeTraceFile(*writeTrace, events); err != nil {
				fmt.Fprintf(stderr, "%s: --write-trace: %v\n", fs.Name(), err)
				return 2
			}
		}
	}
	results, err := simulate.Compare(events, *gpu, *gpus)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2
	}
	fmt.Fprintf(stdout, "%d x %s, %s\n", *gpus, *gpu, source)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATEGY\tACCEPTED\tACCEPTANCE\tSERVED COMPUTE\tFRAGMENTATION\tUTILISATION")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\n", r.Strategy, r.Accepted, r.Arrivals, pct(r.Acceptance), pct(r.ServedCompute), pct(r.Fragmentation), pct(r.Utilisation))
	}
	tw.Flush()
	if len(results) > 1 && results[1].Acceptance > 0 {
		fmt.Fprintf(stdout, "best-fit vs first-fit: acceptance x%.3f, served compute x%.3f\n",
			results[0].Acceptance/results[1].Acceptance, results[0].ServedCompute/results[1].ServedCompute)
	}
	for _, r := range results {
		if r.Strategy == "exact optimum" && r.Acceptance > 0 {
			fmt.Fprintf(stdout, "best-fit vs exact optimum: acceptance x%.3f\n", results[0].Acceptance/r.Acceptance)
		}
	}
	if *gpus > simulate.MaxExactGPUs {
		fmt.Fprintf(stdout, "exact optimum: skipped (at most %d GPUs and %d arrivals)\n", simulate.MaxExactGPUs, simulate.MaxExactArrivals)
	}
	return 0
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func writeTraceFile(path string, events []simulate.Event) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := simulate.WriteTrace(f, events); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
