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
		run:     migMain,
	}
}

const migUsage = `usage: bulkhead mig <subcommand> [flags]

subcommands:
  profiles --gpu MODEL                      the MIG profiles of a GPU model
  plan --gpu MODEL [--gpus N] --request P,P  place slices on an empty node (exit 1 if they do not fit)
  simulate --gpu MODEL [--gpus N] --synthetic SEED | --trace FILE
                                            acceptance, fragmentation and utilisation per strategy
  discover [--json]                         this node's GPUs through NVML, read only: the driver's
                                            profiles and placements against the devices the DRA
                                            driver publishes (exit 1 if they differ)

models: ` + "h200, h100, a100-40gb, a100-80gb, b200" + `
bulkhead mig <subcommand> --help lists a subcommand's flags.
exit status: 0 done, 1 failure (plan: the requests do not fit; discover: a difference
or no NVML), 2 usage error
`

func migMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, migUsage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, migUsage)
		return exitOK
	case "profiles":
		return migProfiles(args[1:], stdout, stderr)
	case "plan":
		return migPlan(args[1:], stdout, stderr)
	case "simulate":
		return migSimulate(args[1:], stdout, stderr)
	case "discover":
		return migDiscover(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "bulkhead mig: unknown subcommand %q\n%s", args[0], migUsage)
	return exitUsage
}

// checkNodeFlags validates --gpu and --gpus; it returns the exit code to
// use, or -1 to go on.
func checkNodeFlags(fs *flag.FlagSet, gpu string, gpus int) int {
	if _, err := mig.Model(gpu); err != nil {
		return usageError(fs, "--gpu: %v", err)
	}
	if gpus < 1 || gpus > 64 {
		return usageError(fs, "--gpus %d: must be 1..64", gpus)
	}
	return -1
}

func migProfiles(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("mig profiles", "--gpu MODEL", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	m, err := mig.Model(*gpu)
	if err != nil {
		return usageError(fs, "--gpu: %v", err)
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
	case "driver-order":
		return mig.DriverOrder, nil
	}
	return 0, fmt.Errorf("--strategy %q: want best-fit, first-fit, driver-order or spread", s)
}

func migPlan(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("mig plan", "--gpu MODEL [--gpus N] --request PROFILE,... [flags]", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	gpus := fs.Int("gpus", 1, "GPUs on the node")
	request := fs.String("request", "", "comma-separated profiles to place, in order (e.g. 3g.71gb,2g.35gb)")
	tenant := fs.String("tenant", "default", "tenant of every request")
	isolation := fs.String("isolation", "", `co-tenancy rule of every request: "", tenant or exclusive`)
	strategy := fs.String("strategy", "best-fit", "best-fit, first-fit, driver-order or spread")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	strat, err := strategyFlag(*strategy)
	if err != nil {
		return usageError(fs, "%v", err)
	}
	if rc := checkNodeFlags(fs, *gpu, *gpus); rc >= 0 {
		return rc
	}
	if strings.TrimSpace(*request) == "" {
		return usageError(fs, "--request: name at least one profile")
	}
	a, err := mig.NewAllocator(mig.NodeGPUs(*gpu, *gpus), nil, mig.WithStrategy(strat))
	if err != nil {
		return usageError(fs, "%v", err)
	}
	names := strings.Split(*request, ",")
	var placed []mig.Placement
	for i, name := range names {
		req := mig.Request{Owner: fmt.Sprintf("request-%d", i+1), Tenant: *tenant, Profile: strings.TrimSpace(name), Isolation: mig.Isolation(*isolation)}
		p, err := a.Allocate(req)
		if errors.Is(err, mig.ErrInsufficientResources) {
			fmt.Fprintf(stderr, "%v (request %d of %d)\n", err, i+1, len(names))
			return exitError
		}
		if err != nil {
			return usageError(fs, "--request %d (%q): %v", i+1, name, err)
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

// maxArrivals bounds --arrivals. Every arrival is held as two events and
// replayed once per strategy: 100 000 on 8 GPUs take about 4 s, so a
// mistyped count (a zero or three too many) would run for minutes and
// gigabytes rather than answer, and a plan needs far fewer to converge.
const maxArrivals = 100_000

func migSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("mig simulate", "--gpu MODEL [--gpus N] --synthetic SEED | --trace FILE [flags]", stderr)
	gpu := fs.String("gpu", "", "GPU model: "+strings.Join(mig.Models(), ", "))
	gpus := fs.Int("gpus", 8, "GPUs on the node")
	seed := fs.Int64("synthetic", -1, "generate a synthetic trace with this seed")
	trace := fs.String("trace", "", "replay this trace file (see docs/mig.md for the format)")
	arrivals := fs.Int("arrivals", 2000, fmt.Sprintf("synthetic: number of requests, 1..%d", maxArrivals))
	load := fs.Float64("load", 1.5, "synthetic: offered compute as a share of the node's (above 1 is overload)")
	isolated := fs.Float64("isolated", 0, "synthetic: share of requests that keep their GPU to their tenant")
	mix := fs.String("mix", "mixed", "synthetic: request mix, one of "+strings.Join(simulate.MixNames(), ", "))
	lifetimes := fs.String("lifetimes", simulate.Exponential, "synthetic: lifetime distribution, "+simulate.Exponential+" or "+simulate.Bimodal)
	writeTrace := fs.String("write-trace", "", "synthetic: also write the generated trace to this file")
	seeds := fs.Int("seeds", 1, "synthetic: replay this many traces (seeds SEED, SEED+1, ...) and pool the figures")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	if rc := checkNodeFlags(fs, *gpu, *gpus); rc >= 0 {
		return rc
	}
	if *seeds < 1 || *seeds > 1000 || (*seeds > 1 && (*writeTrace != "" || *trace != "")) {
		return usageError(fs, "--seeds %d: must be 1..1000, and 1 with --trace or --write-trace", *seeds)
	}
	if (*seed >= 0) == (*trace != "") {
		return usageError(fs, "give exactly one of --synthetic SEED and --trace FILE")
	}
	shares, ok := simulate.Mixes[*mix]
	if !ok {
		return usageError(fs, "--mix %q: want one of %s", *mix, strings.Join(simulate.MixNames(), ", "))
	}
	// The generator replaces zero values by its defaults; a value the user
	// wrote must never be silently swapped for another.
	if *arrivals < 1 || *arrivals > maxArrivals {
		return usageError(fs, "--arrivals %d: must be 1..%d", *arrivals, maxArrivals)
	}
	if !(*load > 0) || math.IsInf(*load, 0) {
		return usageError(fs, "--load %v: must be a number above 0 (1 offers the node's whole compute)", *load)
	}
	if !(*isolated >= 0 && *isolated <= 1) {
		return usageError(fs, "--isolated %v: must be between 0 and 1", *isolated)
	}
	var runs [][]simulate.Result
	source := ""
	if *trace != "" {
		// The file is data, not usage: reading or replaying it fails with 1.
		f, err := os.Open(*trace)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --trace: %v\n", fs.Name(), err)
			return exitError
		}
		events, err := simulate.ParseTrace(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "%s: --trace %s: %v\n", fs.Name(), *trace, err)
			return exitError
		}
		source = "trace " + *trace
		results, err := simulate.Compare(events, *gpu, *gpus)
		if err != nil {
			fmt.Fprintf(stderr, "%s: --trace %s: %v\n", fs.Name(), *trace, err)
			return exitError
		}
		runs = append(runs, results)
	} else {
		skipped := 0
		for s := *seed; s < *seed+int64(*seeds); s++ {
			events, err := simulate.Synthetic(simulate.SyntheticOptions{Model: *gpu, GPUs: *gpus, Seed: uint64(s),
				Arrivals: *arrivals, Load: *load, IsolatedShare: *isolated, Mix: shares, Lifetimes: *lifetimes})
			if err != nil { // the options, as --lifetimes, are the user's
				return usageError(fs, "%v", err)
			}
			if *writeTrace != "" {
				if err := writeTraceFile(*writeTrace, events); err != nil {
					fmt.Fprintf(stderr, "%s: --write-trace: %v\n", fs.Name(), err)
					return exitError
				}
			}
			results, err := simulate.Compare(events, *gpu, *gpus)
			if err != nil {
				fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
				return exitError
			}
			if *gpus <= simulate.MaxExactGPUs && *arrivals <= simulate.MaxExactArrivals && !hasExact(results) {
				skipped++ // the exact optimum gave up: keep every row on the same traces
				continue
			}
			runs = append(runs, results)
		}
		source = fmt.Sprintf("synthetic seed %d, %d arrivals, load %.2f, isolated %.2f, mix %s, %s lifetimes", *seed, *arrivals, *load, *isolated, *mix, *lifetimes)
		if *seeds > 1 {
			source = fmt.Sprintf("synthetic seeds %d..%d (%d pooled), %d arrivals each, load %.2f, isolated %.2f, mix %s, %s lifetimes",
				*seed, *seed+int64(*seeds)-1, len(runs), *arrivals, *load, *isolated, *mix, *lifetimes)
		}
		if skipped > 0 {
			source += fmt.Sprintf("; %d traces skipped: too large for the exact optimum", skipped)
		}
		if len(runs) == 0 {
			fmt.Fprintf(stderr, "%s: every trace was too large for the exact optimum; use fewer arrivals\n", fs.Name())
			return exitError
		}
	}
	results := simulate.Pool(runs)
	fmt.Fprintf(stdout, "%d x %s, %s\n", *gpus, *gpu, source)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATEGY\tACCEPTED\tACCEPTANCE\tSERVED COMPUTE\tFRAGMENTATION\tUTILISATION")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\n", r.Strategy, r.Accepted, r.Arrivals, pct(r.Acceptance), pct(r.ServedCompute), pct(r.Fragmentation), pct(r.Utilisation))
	}
	tw.Flush()
	printByProfile(stdout, *gpu, results)
	byName := map[string]simulate.Result{}
	for _, r := range results {
		byName[r.Strategy] = r
	}
	best := results[0]
	for _, base := range []string{"first-fit", "driver-order", simulate.DRAFirstFit} {
		if b, ok := byName[base]; ok && b.Acceptance > 0 {
			fmt.Fprintf(stdout, "%s vs %s: acceptance x%.3f, served compute x%.3f\n", best.Strategy, base,
				best.Acceptance/b.Acceptance, best.ServedCompute/b.ServedCompute)
		}
	}
	if r, ok := byName["exact optimum"]; ok && r.Acceptance > 0 {
		fmt.Fprintf(stdout, "%s vs exact optimum: acceptance x%.3f\n", best.Strategy, best.Acceptance/r.Acceptance)
	}
	if r, ok := byName["exact optimum (compute)"]; ok && r.ServedCompute > 0 {
		fmt.Fprintf(stdout, "%s vs exact optimum (compute): served compute x%.3f\n", best.Strategy, best.ServedCompute/r.ServedCompute)
	}
	if !hasExact(results) {
		fmt.Fprintf(stdout, "exact optimum: skipped (at most %d GPUs and %d arrivals)\n", simulate.MaxExactGPUs, simulate.MaxExactArrivals)
	}
	return exitOK
}

// printByProfile prints each strategy's acceptance per profile, for the
// profiles that arrived: what a headline acceptance trades between sizes.
func printByProfile(w io.Writer, model string, results []simulate.Result) {
	m, err := mig.Model(model)
	if err != nil || len(results) == 0 {
		return
	}
	var names []string
	for _, p := range m.Profiles {
		if results[0].ByProfile[p.Name].Arrivals > 0 {
			names = append(names, p.Name)
		}
	}
	fmt.Fprintln(w, "acceptance by profile:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STRATEGY\t%s\n", strings.Join(names, "\t"))
	for _, r := range results {
		fmt.Fprint(tw, r.Strategy)
		for _, n := range names {
			c := r.ByProfile[n]
			fmt.Fprintf(tw, "\t%s", pct(float64(c.Accepted)/float64(c.Arrivals)))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func hasExact(results []simulate.Result) bool {
	for _, r := range results {
		if r.Strategy == "exact optimum" {
			return true
		}
	}
	return false
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
