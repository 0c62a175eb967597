package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/netpol"
)

func init() {
	commands["netpol"] = command{
		summary: "inspect the eBPF tenant fence: endpoints, stats TENANT, gc",
		run:     netpolMain,
	}
}

func netpolMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("netpol", "", stderr)
	pinDir := fs.String("pin-dir", netpol.DefaultPinDir, "directory of the pinned maps (on bpffs)")
	lock := fs.String("lock", netpol.DefaultLockPath, "lock file shared with the shims (gc only)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), `usage: bulkhead netpol [-pin-dir DIR] [-lock FILE] endpoints | stats TENANT | gc
  endpoints     the registered endpoints, JSON (read-only)
  stats TENANT  the tenant's drop counters by reason, JSON (read-only)
  gc            unregister endpoints whose interface is gone (root; changes the maps)
exit status: 0 done, 1 failure, 2 usage error

flags:`)
		fs.PrintDefaults()
	}
	// Flags may follow the verb: `netpol stats TENANT --help` is help.
	words, rc := parseFlags(fs, args, stdout)
	if rc >= 0 {
		return rc
	}
	if len(words) == 0 {
		return usageError(fs, "name what to inspect: endpoints, stats TENANT or gc")
	}
	verb, rest := words[0], words[1:]
	switch {
	case verb == "help" && len(rest) == 0:
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	case verb == "stats" && len(rest) != 1:
		return usageError(fs, "stats takes one TENANT, got %d arguments", len(rest))
	case (verb == "endpoints" || verb == "gc") && len(rest) != 0:
		return usageError(fs, "%s: unexpected argument %q", verb, rest[0])
	case verb != "endpoints" && verb != "gc" && verb != "stats":
		return usageError(fs, "unknown verb %q: want endpoints, stats TENANT or gc", verb)
	}
	var out any
	var err error
	if verb == "gc" {
		ctx := context.Background()
		m, err := netpol.Open(ctx, netpol.Options{PinDir: *pinDir, LockPath: *lock})
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead netpol gc:", flagError(err, *pinDir))
			return exitError
		}
		defer m.Close()
		// Interfaces that are gone; sandbox liveness is the shim's to judge.
		out, err = m.GC(ctx, nil)
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead netpol gc:", err)
			return 1
		}
	} else {
		r, err := netpol.OpenReadOnly(*pinDir)
		if errors.Is(err, netpol.ErrNoFence) {
			fmt.Fprintf(stderr, "bulkhead netpol: no fence on this node: nothing pinned in %s (-pin-dir); shims pin it with the first pod\n", *pinDir)
			return 1
		}
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead netpol:", flagError(err, *pinDir))
			return 1
		}
		defer r.Close()
		switch verb {
		case "endpoints":
			out, err = r.Endpoints()
		case "stats":
			var s netpol.Stats
			s, err = r.Stats(rest[0])
			drops := map[string]uint64{}
			for r, n := range s.Drops {
				drops[r.String()] = n
			}
			out = map[string]any{"tenant": s.Tenant, "drops": drops}
		}
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead netpol:", err)
			return 1
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err = enc.Encode(out); err != nil {
		fmt.Fprintln(stderr, "bulkhead netpol:", err)
		return 1
	}
	return 0
}

// flagError rewrites the netpol package's words for the library caller
// (PinDir, netpol.MountBPFFS) into the CLI's.
func flagError(err error, pinDir string) string {
	msg := err.Error()
	msg = strings.ReplaceAll(msg, "PinDir "+pinDir, "-pin-dir "+pinDir)
	msg = strings.ReplaceAll(msg, "mount one with netpol.MountBPFFS or `mount -t bpf bpf /sys/fs/bpf`", "mount one as root with `mount -t bpf bpf /sys/fs/bpf`")
	return msg
}
