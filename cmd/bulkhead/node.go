package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/runtime"
)

func init() {
	commands["node"] = command{summary: "node state: status (read-only), gc (repairs what crashed shims left)", run: func(args []string) int { return nodeMain(args, os.Stdout, os.Stderr) }}
}

const nodeUsage = `usage: bulkhead node <subcommand> [flags]

subcommands:
  status [--json] [--config PATH]  usage against quota, GPU layout, fenced endpoints and drop
                                   counters; read-only: it creates and changes nothing
  gc [--config PATH]               repair what crashed shims left behind (root)

exit status: 0 done, 1 failure, 2 usage error
`

func nodeMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, nodeUsage)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, nodeUsage)
		return 0
	case "status", "gc":
	default:
		fmt.Fprintf(stderr, "bulkhead node: unknown subcommand %q\n%s", args[0], nodeUsage)
		return 2
	}
	fs := newFlagSet("node "+args[0], stderr)
	cfgPath := fs.String("config", config.Path(), "shim configuration file")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2
	}
	// Neither subcommand loads the policy or runs runsc: validate only
	// what they read, so a node's key file is not demanded to look at it.
	cfg, err := config.LoadFor(*cfgPath, config.UseNodeState)
	if err != nil {
		fmt.Fprintf(stderr, "bulkhead node: --config: %v\n", err)
		return 1
	}
	if args[0] == "gc" {
		ctx := context.Background()
		comps, err := runtime.OpenComponents(ctx, cfg, false)
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead node gc:", err)
			return 1
		}
		rep, err := runtime.NewPipeline(cfg, comps).GC(ctx, runtime.NewStateDir(cfg.StateDir))
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead node gc:", err)
			return 1
		}
		return 0
	}
	st, err := nodeStatus(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead node status:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	} else {
		printStatus(stdout, st)
	}
	return 0
}

// NodeStatus is what `bulkhead node status` reports.
type NodeStatus struct {
	Tenants    []TenantStatus  `json:"tenants"`
	GPUs       []mig.GPUUsage  `json:"gpus"`
	Placements []mig.Placement `json:"placements"`
	// Instances are the MIG instances the node's pods hold (runc tier).
	Instances  []MIGInstance           `json:"mig_instances"`
	Endpoints  []netpol.EndpointInfo   `json:"endpoints"`
	Drops      map[string]netpol.Stats `json:"drops"`
	Sandboxes  []*runtime.Reservation  `json:"sandboxes"`
	Quota      map[string]TenantQuota  `json:"quota,omitempty"`
	LedgerPath string                  `json:"ledger_path"`
	// Ledger, when not empty, says why there are no sandboxes to list.
	Ledger string `json:"ledger,omitempty"`
	// Fence is "enabled" or "DISABLED (netpol.enabled = false)".
	Fence string `json:"fence"`
}

// MIGInstance is a MIG instance and the pod holding it.
type MIGInstance struct {
	mig.Instance
	Sandbox string `json:"sandbox"`
	Tenant  string `json:"tenant"`
}

// TenantStatus is a tenant's usage on this node.
type TenantStatus struct {
	Tenant      string `json:"tenant"`
	Tier        string `json:"tier"`
	Sandboxes   int    `json:"sandboxes"`
	GPUSlices   int    `json:"gpu_slices"`
	MemoryBytes int64  `json:"memory_bytes"`
}

// TenantQuota is a tenant's quota as the policy data states it.
type TenantQuota struct {
	Sandboxes int    `json:"sandboxes,omitempty"`
	GPUSlices int    `json:"gpu_slices,omitempty"`
	Memory    string `json:"memory,omitempty"`
}

// nodeStatus reads the node's state read-only: the ledger, the GPUs and the
// pinned fence are opened as they are and never created.
func nodeStatus(cfg config.Config) (*NodeStatus, error) {
	st := &NodeStatus{Drops: map[string]netpol.Stats{}, LedgerPath: cfg.LedgerPath, Fence: "enabled"}
	if !cfg.Netpol.Enabled {
		st.Fence = fenceDisabled
	}
	ledger, err := runtime.OpenLedgerReadOnly(cfg.LedgerPath)
	switch {
	case errors.Is(err, runtime.ErrNoLedger):
		st.Ledger = fmt.Sprintf("none at %s (ledger_path): no Bulkhead pod has run on this node", cfg.LedgerPath)
	case err != nil:
		return nil, fmt.Errorf("ledger_path: %w", err)
	default:
		if err := ledger.View(func(tx *runtime.LedgerTx) error {
			var err error
			st.Sandboxes, err = tx.List()
			return err
		}); err != nil {
			return nil, fmt.Errorf("ledger_path: %w", err)
		}
	}
	gpus, err := runtime.GPUsReadOnly(cfg)
	if err != nil {
		return nil, err
	}
	byTenant := map[string]*TenantStatus{}
	for _, r := range st.Sandboxes {
		ts := byTenant[r.Tenant]
		if ts == nil {
			ts = &TenantStatus{Tenant: r.Tenant, Tier: r.Tier}
			byTenant[r.Tenant] = ts
		}
		ts.Sandboxes++
		ts.GPUSlices += r.GPUSlices()
		ts.MemoryBytes += r.MemoryBytes
		if r.GPU != nil {
			st.Placements = append(st.Placements, *r.GPU)
		}
		if r.Instance != nil {
			st.Instances = append(st.Instances, MIGInstance{Instance: *r.Instance, Sandbox: r.SandboxID, Tenant: r.Tenant})
		}
	}
	for _, ts := range byTenant {
		st.Tenants = append(st.Tenants, *ts)
	}
	sort.Slice(st.Tenants, func(i, j int) bool { return st.Tenants[i].Tenant < st.Tenants[j].Tenant })
	if len(gpus) > 0 {
		alloc, err := mig.NewAllocator(gpus, st.Placements)
		if err != nil {
			return nil, err
		}
		st.GPUs = alloc.Usage()
	}
	st.Quota = readQuotas(cfg.Policy.Data)
	if st.Quota == nil {
		st.Quota = readQuotas(cfg.Policy.Bundle)
	}
	if cfg.Netpol.Enabled {
		fence, err := netpol.OpenReadOnly(cfg.Netpol.PinDir)
		if errors.Is(err, netpol.ErrNoFence) {
			st.Fence = fmt.Sprintf("enabled, none pinned yet at %s (netpol.pin_dir): no pod has registered with it", cfg.Netpol.PinDir)
			return st, nil
		}
		if err != nil {
			return nil, fmt.Errorf("netpol.pin_dir: %w", err)
		}
		defer fence.Close()
		if st.Endpoints, err = fence.Endpoints(); err != nil {
			return nil, err
		}
		// Counters outlive pods: report every tenant the policy or the
		// ledger names that the fence has seen.
		tenants := map[string]bool{}
		for _, ts := range st.Tenants {
			tenants[ts.Tenant] = true
		}
		for t := range st.Quota {
			tenants[t] = true
		}
		for t := range tenants {
			if s, err := fence.Stats(t); err == nil {
				st.Drops[t] = s
			}
		}
	}
	return st, nil
}

// readQuotas reads data.bulkhead.tenants[*].quota from a policy data file,
// a bundle directory or a bundle .tar.gz.
func readQuotas(path string) map[string]TenantQuota {
	if path == "" {
		return nil
	}
	b, err := readBundleData(path)
	if err != nil {
		return nil
	}
	var doc struct {
		Bulkhead struct {
			Tenants map[string]struct {
				Quota TenantQuota `json:"quota"`
			} `json:"tenants"`
		} `json:"bulkhead"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return nil
	}
	out := map[string]TenantQuota{}
	for t, v := range doc.Bulkhead.Tenants {
		out[t] = v.Quota
	}
	return out
}

func readBundleData(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return os.ReadFile(filepath.Join(path, "data.json"))
	}
	if !strings.HasSuffix(path, ".tar.gz") {
		return os.ReadFile(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(h.Name, "/") == "data.json" {
			return io.ReadAll(io.LimitReader(tr, 64<<20))
		}
	}
}

// fenceDisabled is what status says of a node whose operator turned the fence off.
const fenceDisabled = "DISABLED (netpol.enabled = false): no cross-tenant, metadata or egress enforcement on this node"

func printStatus(w io.Writer, st *NodeStatus) {
	fmt.Fprintf(w, "FENCE: %s\n", st.Fence)
	switch {
	case st.Ledger != "":
		fmt.Fprintf(w, "LEDGER: %s\n", st.Ledger)
	case len(st.Tenants) == 0:
		fmt.Fprintf(w, "\nno sandboxes on this node (ledger %s)\n", st.LedgerPath)
	default:
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tTIER\tSANDBOXES\tGPU SLICES\tMEMORY\tQUOTA (sandboxes/slices/memory)")
		for _, t := range st.Tenants {
			q := st.Quota[t.Tenant]
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d MiB\t%d/%d/%s\n", t.Tenant, t.Tier, t.Sandboxes, t.GPUSlices, t.MemoryBytes>>20, q.Sandboxes, q.GPUSlices, q.Memory)
		}
		tw.Flush()
	}
	if len(st.GPUs) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "GPU\tMODEL\tCOMPUTE USED\tSLOTS USED\tPLACEMENTS")
		for _, g := range st.GPUs {
			var pls []string
			for _, p := range st.Placements {
				if p.GPU == g.Index {
					pls = append(pls, fmt.Sprintf("%s@%d+%d tenant=%s sandbox=%.12s", p.Profile, p.Start, p.Size, p.Tenant, p.Owner))
				}
			}
			if len(pls) == 0 {
				pls = []string{"-"}
			}
			fmt.Fprintf(tw, "%d\t%s\t%d/7\t%d/8\t%s\n", g.Index, g.Model, g.Compute, g.Slots, strings.Join(pls, ", "))
		}
		tw.Flush()
	}
	if len(st.Instances) > 0 {
		fmt.Fprintln(w, "\nMIG INSTANCES")
		for _, in := range st.Instances {
			fmt.Fprintf(w, "  gpu %d gi %d ci %d %s@%d %s tenant=%s sandbox=%.12s\n", in.GPU, in.GI, in.CI, in.Profile, in.Start, in.UUID, in.Tenant, in.Sandbox)
		}
	}
	if len(st.Endpoints) > 0 {
		fmt.Fprintln(w, "\nFENCED ENDPOINTS")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SANDBOX\tTENANT\tTIER\tIFINDEX\tADDRESSES\tMAC\tLINK-LOCAL\tHOOK")
		for _, e := range st.Endpoints {
			var ips []string
			for _, a := range []netip.Addr{e.IPv4, e.IPv6} {
				if a.IsValid() {
					ips = append(ips, a.String())
				}
			}
			fmt.Fprintf(tw, "  %.12s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.SandboxID, e.Tenant, e.Tier, e.Ifindex, strings.Join(ips, ","), e.MAC, e.LinkLocal, e.Attach)
		}
		tw.Flush()
	}
	if len(st.Drops) > 0 {
		fmt.Fprintln(w, "\nDROPS (packets the fence dropped, by tenant and reason, since the fence was pinned)")
		tenants := make([]string, 0, len(st.Drops))
		for t := range st.Drops {
			tenants = append(tenants, t)
		}
		sort.Strings(tenants)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, t := range tenants {
			fmt.Fprintf(tw, "  %s\t%s\n", t, formatDrops(st.Drops[t].Drops))
		}
		tw.Flush()
	}
}

// formatDrops prints the non-zero counters in reason order: "tenant=9 rdma=3",
// or "none".
func formatDrops(drops map[netpol.Reason]uint64) string {
	var parts []string
	for _, r := range netpol.Reasons() {
		if n := drops[r]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", r, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}
