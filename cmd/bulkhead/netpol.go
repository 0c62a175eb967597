package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/bulkhead-runtime/bulkhead/netpol"
)

func init() {
	commands["netpol"] = command{
		summary: "inspect the eBPF tenant fence: endpoints, stats TENANT, gc",
		run:     runNetpol,
	}
}

func runNetpol(args []string) int {
	return netpolMain(args, os.Stdout, os.Stderr)
}

func netpolMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("netpol", stderr)
	pinDir := fs.String("pin-dir", netpol.DefaultPinDir, "directory of the pinned maps (on bpffs)")
	lock := fs.String("lock", netpol.DefaultLockPath, "lock file shared with the shims")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: bulkhead netpol [-pin-dir DIR] [-lock FILE] endpoints | stats TENANT | gc")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	verb, rest := fs.Arg(0), fs.Args()[1:]
	switch {
	case verb == "endpoints" && len(rest) == 0, verb == "gc" && len(rest) == 0, verb == "stats" && len(rest) == 1:
	default:
		fs.Usage()
		return 2
	}
	ctx := context.Background()
	m, err := netpol.Open(ctx, netpol.Options{PinDir: *pinDir, LockPath: *lock})
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead netpol:", err)
		return 1
	}
	defer m.Close()
	var out any
	switch verb {
	case "endpoints":
		out, err = m.Endpoints()
	case "stats":
		var s netpol.Stats
		s, err = m.Stats(rest[0])
		drops := map[string]uint64{}
		for r, n := range s.Drops {
			drops[r.String()] = n
		}
		out = map[string]any{"tenant": s.Tenant, "drops": drops}
	case "gc":
		// Interfaces that are gone; sandbox liveness is the shim's to judge.
		out, err = m.GC(ctx, nil)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead netpol:", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(stderr, "bulkhead netpol:", err)
		return 1
	}
	return 0
}
