package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/bulkhead-runtime/bulkhead/mig/nvmlbackend"
)

// discoverReport is `bulkhead mig discover --json`: each GPU as NVML
// reports it and, for GPUs with a MIG geometry, the comparison with what
// the DRA driver publishes.
type discoverReport struct {
	GPUs        []nvmlbackend.Discovery  `json:"gpus"`
	Comparisons []nvmlbackend.Comparison `json:"comparisons"`
	Match       bool                     `json:"match"`
}

// migDiscover reads the node's GPUs through real NVML (it changes nothing:
// no MIG mode, no instance) and sets the devices the DRA driver would
// publish for each against the driver's own profiles and placements.
func migDiscover(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("mig discover", "[--json]", stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	if rc := parseNoArgs(fs, args, stdout); rc >= 0 {
		return rc
	}
	found, err := nvmlbackend.Discover(nvml.New(), nvmlbackend.DiscoverOptions{ProfileNames: true})
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead mig discover: %v (needs an NVIDIA driver and GPU)\n", err)
		return exitError
	}
	rep := discoverReport{GPUs: found, Match: true}
	for _, d := range found {
		if d.Model == "" {
			continue
		}
		c, err := nvmlbackend.Compare(d)
		if err != nil {
			fmt.Fprintf(stderr, "bulkhead mig discover: %v\n", err)
			return exitError
		}
		rep.Comparisons = append(rep.Comparisons, c)
		rep.Match = rep.Match && c.OK()
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "bulkhead mig discover: %v\n", err)
			return exitError
		}
	} else {
		printDiscovery(stdout, rep)
	}
	if !rep.Match {
		return exitError
	}
	return exitOK
}

func printDiscovery(w io.Writer, rep discoverReport) {
	if len(rep.GPUs) == 0 {
		fmt.Fprintln(w, "no NVIDIA GPU")
		return
	}
	compared := map[int]nvmlbackend.Comparison{}
	for _, c := range rep.Comparisons {
		compared[c.GPU] = c
	}
	for _, d := range rep.GPUs {
		fmt.Fprintf(w, "gpu %d: %s %s, %d MiB, MIG mode %s\n", d.Index, d.Name, d.UUID, d.MemoryMiB, d.MIGMode)
		c, ok := compared[d.Index]
		if !ok {
			fmt.Fprintf(w, "  not published: %s\n", d.ModelError)
			continue
		}
		fmt.Fprintf(w, "  Bulkhead geometry %s: %d devices published once MIG mode is on\n", c.Model, c.Devices)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PROFILE\tDRIVER ID\tDRIVER NAME\tSLICES\tINSTANCES\tMEMORY\tDRIVER PLACEMENTS\tPUBLISHED\tTOGETHER\tRESULT")
		for _, pc := range c.Profiles {
			id, name, slices, inst, mem, pl := "-", "-", "-", "-", "-", "-"
			if drv := pc.Driver; drv != nil {
				id, name = fmt.Sprint(drv.ID), drv.Name
				if name == "" {
					name = "-"
				}
				slices, inst, mem = fmt.Sprint(drv.Slices), fmt.Sprint(drv.Instances), fmt.Sprintf("%d MiB", drv.MemoryMiB)
				pl = nvmlbackend.FormatSpans(drv.Placements)
			}
			result := "match"
			if len(pc.Problems) > 0 {
				result = "DIFFERS: " + strings.Join(pc.Problems, "; ")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", pc.Profile, id, name, slices, inst, mem, pl, nvmlbackend.FormatSpans(pc.Published), pc.Together, result)
		}
		tw.Flush()
		for _, u := range c.Unpublished {
			fmt.Fprintf(w, "  driver profile id %d %q (%d slices, placements %s): not in Bulkhead's geometry, not published\n", u.ID, u.Name, u.Slices, nvmlbackend.FormatSpans(u.Placements))
		}
	}
	if rep.Match {
		fmt.Fprintln(w, "published devices match the driver's profiles and placements")
	} else {
		fmt.Fprintln(w, "published devices DIFFER from the driver's profiles and placements")
	}
}
