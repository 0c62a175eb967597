package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

func init() {
	commands["node"] = command{summary: "node state: status (from the agent, or read-only), gc (repairs what crashed shims left)", run: nodeMain}
}

const nodeUsage = `usage: bulkhead node <subcommand> [flags]

subcommands:
  status [--json] [--config PATH]  the node agent's state (bundle revision, pods served), usage
                                   against quota, GPU layout, fenced endpoints and drop counters,
                                   as the agent at agent.socket reports them; when it does not
                                   answer, read-only from the node's files (the first line says so)
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
	fs := newFlagSet("node "+args[0], "[--json] [--config PATH]", stderr)
	cfgPath := fs.String("config", config.Path(), "the node's configuration file")
	asJSON := fs.Bool("json", false, "print JSON")
	if rc := parseNoArgs(fs, args[1:], stdout); rc >= 0 {
		return rc
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
		n, err := node.Open(ctx, cfg)
		if err != nil {
			fmt.Fprintln(stderr, "bulkhead node gc:", err)
			return 1
		}
		rep, err := n.GC(ctx)
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

// agentTimeout bounds the call to the node agent; past it, status reads
// the node's files instead.
const agentTimeout = 2 * time.Second

// nodeStatus asks the node agent at agent.socket for the node's state.
// When the agent does not answer (stopped, busy past agentTimeout, or the
// caller is not root) it reads the node's files read-only and says so in
// the report's agent section. It fails only when neither works.
func nodeStatus(cfg config.Config) (*node.Status, error) {
	st, agentErr := askAgent(cfg.Agent.Socket)
	if agentErr == nil {
		return st, nil
	}
	st, err := node.ReadStatus(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w (and the agent did not answer: %v)", err, agentErr)
	}
	why := agentErr.Error()
	if os.Geteuid() != 0 {
		why += "; the agent answers root only"
	}
	st.Agent = &node.AgentStatus{Socket: cfg.Agent.Socket, ReadOnly: "agent not reachable: read-only view of the node's files (" + why + ")"}
	return st, nil
}

// askAgent is the agent's status report.
func askAgent(socket string) (*node.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), agentTimeout)
	defer cancel()
	c := agentapi.NewClient(socket)
	defer c.Close()
	reply, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	var st node.Status
	if err := json.Unmarshal(reply.Report, &st); err != nil {
		return nil, fmt.Errorf("agent at %s: status report: %w", socket, err)
	}
	if st.Agent == nil {
		return nil, fmt.Errorf("agent at %s: status report without its agent section", socket)
	}
	return &st, nil
}

func printStatus(w io.Writer, st *node.Status) {
	printAgent(w, st.Agent, time.Now())
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

// printAgent prints the agent's lines of a report, first: who answered,
// or why the report was read from the node's files.
func printAgent(w io.Writer, a *node.AgentStatus, now time.Time) {
	switch {
	case a == nil:
	case !a.Running:
		why := a.ReadOnly
		if why == "" {
			why = "not running"
		}
		// "AGENT: not reachable: ...", not "AGENT: agent not reachable".
		fmt.Fprintf(w, "AGENT: %s\n", strings.TrimPrefix(why, "agent "))
	default:
		fmt.Fprintf(w, "AGENT: running, pid %d, socket %s, up %s (since %s); %d pods served, %d ops in flight\n",
			a.PID, a.Socket, age(now, a.StartedAt), a.StartedAt.UTC().Format(time.RFC3339), a.Pods, a.OpsInFlight)
		fmt.Fprintf(w, "BUNDLE: revision %s, loaded %s ago (%s)\n", a.BundleRevision, age(now, a.BundleLoadedAt), a.BundleLoadedAt.UTC().Format(time.RFC3339))
		if a.ReloadError != "" {
			fmt.Fprintf(w, "BUNDLE RELOAD REFUSED: %s\n", a.ReloadError)
		}
		fmt.Fprintf(w, "CLUSTER: %s\n", clusterLine(a.Cluster, now))
	}
}

// clusterLine says what the agent knows of the other nodes' pods, and what
// the fence does with an address it does not know.
func clusterLine(c node.ClusterSync, now time.Time) string {
	var line string
	switch {
	case !c.Watching:
		line = "not watching the API server (no agent.kubeconfig, no service account): other nodes' pods are unknown cluster addresses, dropped as the tiers say; other nodes' addresses are in the cluster only where cluster_cidrs hold them"
	case !c.Synced:
		line = "NOT SYNCED with the API server yet: other nodes' pods are unknown cluster addresses, dropped as the tiers say"
	case !c.Connected:
		line = fmt.Sprintf("API SERVER LOST (last contact %s ago): %d remote pod addresses and %d other node addresses kept as last seen, new ones unknown",
			age(now, c.LastContact), c.RemoteAddresses, c.RemoteNodes)
	default:
		line = fmt.Sprintf("synced, %d remote pod addresses, %d other node addresses, last contact %s ago", c.RemoteAddresses, c.RemoteNodes, age(now, c.LastContact))
	}
	if c.LastError != "" {
		line += "; last error: " + c.LastError
	}
	return line
}

// age is how long ago t was, to the second.
func age(now, t time.Time) time.Duration {
	return now.Sub(t).Round(time.Second)
}
