package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
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
	commands["node"] = command{summary: "node state: status, gc (repairs what crashed shims left)", run: runNode}
}

func runNode(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: bulkhead node status [--json] [--config PATH] | gc [--config PATH]")
		return 2
	}
	fs := newFlagSet("node "+args[0], os.Stderr)
	cfgPath := fs.String("config", runtime.ConfigPath(), "shim configuration file")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	cfg, err := runtime.LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bulkhead node:", err)
		return 1
	}
	ctx := context.Background()
	comps, err := runtime.OpenComponents(ctx, cfg, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bulkhead node:", err)
		return 1
	}
	switch args[0] {
	case "gc":
		rep, err := runtime.NewPipeline(cfg, comps).GC(ctx, runtime.NewStateDir(cfg.StateDir))
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bulkhead node gc:", err)
			return 1
		}
		return 0
	case "status":
		st, err := nodeStatus(cfg, comps)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bulkhead node status:", err)
			return 1
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(st)
		} else {
			printStatus(os.Stdout, st)
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "bulkhead node: unknown subcommand %q\n", args[0])
	return 2
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

func nodeStatus(cfg runtime.Config, c runtime.Components) (*NodeStatus, error) {
	st := &NodeStatus{Drops: map[string]netpol.Stats{}, LedgerPath: cfg.LedgerPath, Fence: "enabled"}
	if !cfg.Netpol.Enabled {
		st.Fence = fenceDisabled
	}
	if err := c.Ledger.View(func(tx *runtime.LedgerTx) error {
		var err error
		st.Sandboxes, err = tx.List()
		return err
	}); err != nil {
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
	if len(c.GPUs) > 0 {
		alloc, err := mig.NewAllocator(c.GPUs, st.Placements)
		if err != nil {
			return nil, err
		}
		st.GPUs = alloc.Usage()
	}
	if c.Fence != nil {
		eps, err := c.Fence.Endpoints()
		if err != nil {
			return nil, err
		}
		st.Endpoints = eps
		for _, ts := range st.Tenants {
			if s, err := c.Fence.Stats(ts.Tenant); err == nil {
				st.Drops[ts.Tenant] = s
			}
		}
	}
	st.Quota = readQuotas(cfg.Policy.Data)
	if st.Quota == nil {
		st.Quota = readQuotas(cfg.Policy.Bundle)
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
	fmt.Fprintf(w, "FENCE: %s\n\n", st.Fence)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tTIER\tSANDBOXES\tGPU SLICES\tMEMORY\tQUOTA (sandboxes/slices/memory)")
	for _, t := range st.Tenants {
		q := st.Quota[t.Tenant]
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d MiB\t%d/%d/%s\n", t.Tenant, t.Tier, t.Sandboxes, t.GPUSlices, t.MemoryBytes>>20, q.Sandboxes, q.GPUSlices, q.Memory)
	}
	tw.Flush()
	if len(st.GPUs) > 0 {
		fmt.Fprintln(w, "\nGPU\tMODEL\tCOMPUTE USED\tSLOTS USED\tPLACEMENTS")
		for _, g := range st.GPUs {
			var pls []string
			for _, p := range st.Placements {
				if p.GPU == g.Index {
					pls = append(pls, fmt.Sprintf("%s@%d+%d tenant=%s sandbox=%.12s", p.Profile, p.Start, p.Size, p.Tenant, p.Owner))
				}
			}
			fmt.Fprintf(w, "%d\t%s\t%d/7\t%d/8\t%v\n", g.Index, g.Model, g.Compute, g.Slots, pls)
		}
	}
	if len(st.Instances) > 0 {
		fmt.Fprintln(w, "\nMIG INSTANCES")
		for _, in := range st.Instances {
			fmt.Fprintf(w, "  gpu %d gi %d ci %d %s@%d %s tenant=%s sandbox=%.12s\n", in.GPU, in.GI, in.CI, in.Profile, in.Start, in.UUID, in.Tenant, in.Sandbox)
		}
	}
	if len(st.Endpoints) > 0 {
		fmt.Fprintln(w, "\nFENCED ENDPOINTS")
		for _, e := range st.Endpoints {
			var ips []string
			for _, a := range []netip.Addr{e.IPv4, e.IPv6} {
				if a.IsValid() {
					ips = append(ips, a.String())
				}
			}
			fmt.Fprintf(w, "  %.12s tenant=%s tier=%s ifindex=%d %s mac=%s ll=%s (%s)\n", e.SandboxID, e.Tenant, e.Tier, e.Ifindex, strings.Join(ips, ","), e.MAC, e.LinkLocal, e.Attach)
		}
	}
	if len(st.Drops) > 0 {
		fmt.Fprintln(w, "\nDROPS")
		for t, s := range st.Drops {
			fmt.Fprintf(w, "  %s: %v\n", t, s.Drops)
		}
	}
}
