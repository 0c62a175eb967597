package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// startSeries is one configuration's pod starts, sorted: the whole start
// (RunPodSandbox + CreateContainer + StartContainer), its RunPodSandbox
// part and the rest (the container), and the stages the node agent logged
// for them.
type startSeries struct {
	total, sandbox, container []time.Duration
	stages                    map[string][]time.Duration
}

// startConfig is where a series of pod starts runs: a node, a runtime
// handler and a namespace.
type startConfig struct {
	n           *node.Node
	handler, ns string
}

// podStarts times count pod starts of each of configs, interleaved: start i
// of every configuration before start i+1 of any, the order of the
// configurations reversed every other round, so that a burst of load on
// this shared machine falls on all of them alike. Pods are removed between
// starts, and removal is not timed. A configuration's stages are those its
// node's agent logged (none where the pipeline is off).
func podStarts(b *testing.B, count int, configs ...startConfig) []startSeries {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := make([]startSeries, len(configs))
	logFrom := make([]int64, len(configs))
	for i, c := range configs {
		logFrom[i] = agentLogSize(c.n)
	}
	order := make([]int, len(configs))
	for i := range order {
		order[i] = i
	}
	for round := range count {
		for _, i := range order {
			c := configs[i]
			cfg := podConfig(c.n, fmt.Sprintf("bench-%d", round), c.ns, nil)
			start := time.Now()
			id, err := runPodOn(ctx, c.n, c.handler, cfg)
			if err != nil {
				b.Fatal(err)
			}
			out[i].sandbox = append(out[i].sandbox, time.Since(start))
			if _, err := startContainer(ctx, c.n, id, cfg, "main", "exec sleep 3600"); err != nil {
				b.Fatal(err)
			}
			total := time.Since(start)
			out[i].total = append(out[i].total, total)
			out[i].container = append(out[i].container, total-out[i].sandbox[len(out[i].sandbox)-1])
			if err := removePod(ctx, c.n, id); err != nil {
				b.Fatal(err)
			}
		}
		slices.Reverse(order)
	}
	for i, c := range configs {
		sortDurations(out[i].total)
		sortDurations(out[i].sandbox)
		sortDurations(out[i].container)
		out[i].stages = shimStages(agentLogSince(c.n, logFrom[i]))
	}
	return out
}

// agentLogSize is the size of the node agent's log so far (0 on a node
// that runs none: pipeline off).
func agentLogSize(n *node.Node) int64 {
	st, err := os.Stat(n.AgentLogPath())
	if err != nil {
		return 0
	}
	return st.Size()
}

// agentLogSince is the agent's log from offset on. n.Log() holds only the
// agent log's last lines, and the sandbox creates are logged by the agent
// now, not by the shims.
func agentLogSince(n *node.Node, offset int64) string {
	b, err := os.ReadFile(n.AgentLogPath())
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

// process names one process of a running pod: its argv[0]'s base name is
// one of names and its command line mentions the pod's sandbox id; or, when
// pid is set, the process it returns.
type process struct {
	label string
	names []string
	pid   func() int
}

// bulkheadShim is a pod's Bulkhead gVisor shim, printed as label.
func bulkheadShim(label string) process {
	return process{label: label, names: []string{"containerd-shim-bulkhead-v1"}}
}

var (
	bulkheadRuncShim = process{label: "Bulkhead runc shim", names: []string{"containerd-shim-bulkhead-runc-v1"}}
	upstreamRuncShim = process{label: "upstream containerd-shim-runc-v2", names: []string{"containerd-shim-runc-v2"}}
	// gVisor names its sandbox process runsc-sandbox (argv[0]; `runsc boot`).
	runscSandbox = process{label: "gVisor sandbox (runsc-sandbox, `runsc boot`)", names: []string{"runsc-sandbox"}}
	runscGofer   = process{label: "its gofer (runsc-gofer)", names: []string{"runsc-gofer"}}
)

func agentProcess(n *node.Node, label string) process {
	return process{label: label, pid: n.AgentPID}
}

// memory is one process's memory, in kB, from /proc/PID/smaps_rollup:
// its PSS is pssAnon (heap, stacks) and pssFile (the pages of its binary
// and libraries it touched, shared with the other processes that map them).
type memory struct {
	label            string
	pss, rss         int64
	pssAnon, pssFile int64
	// err says why the process was not measured.
	err error
}

// podMemory starts one pod (its sandbox and a container) on handler, lets
// it settle for two seconds, reads the memory of procs, and removes it.
func podMemory(b *testing.B, n *node.Node, handler, ns string, procs ...process) map[string]memory {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := podConfig(n, "bench-memory", ns, nil)
	id, err := runPodOn(ctx, n, handler, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := startContainer(ctx, n, id, cfg, "main", "exec sleep 3600"); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	out := map[string]memory{}
	for _, p := range procs {
		m := memory{label: p.label}
		pid := 0
		if p.pid != nil {
			pid = p.pid()
		} else {
			pid, m.err = podProcess(id, p.names)
		}
		if m.err == nil {
			m.pss, m.rss, m.pssAnon, m.pssFile, m.err = readMemoryParts(pid)
		}
		out[p.label] = m
	}
	if err := removePod(ctx, n, id); err != nil {
		b.Fatal(err)
	}
	return out
}

// podProcess finds the one process whose argv[0] is one of names and whose
// command line mentions sandbox id.
func podProcess(id string, names []string) (int, error) {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		argv0, _, _ := strings.Cut(string(b), "\x00")
		if slices.Contains(names, filepath.Base(argv0)) {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("%d processes %v of sandbox %s, want 1", len(pids), names, id)
	}
	return pids[0], nil
}

// readMemory reads process pid's proportional and resident set sizes (kB).
func readMemory(pid int) (pss, rss int64, err error) {
	pss, rss, _, _, err = readMemoryParts(pid)
	return pss, rss, err
}

// readMemoryParts reads process pid's PSS and RSS, and its PSS's anonymous
// and file-backed parts (kB).
func readMemoryParts(pid int) (pss, rss, pssAnon, pssFile int64, err error) {
	if pid <= 0 {
		return 0, 0, 0, 0, fmt.Errorf("no process (pid %d)", pid)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "Pss:":
			pss = v
		case "Rss:":
			rss = v
		case "Pss_Anon:":
			pssAnon = v
		case "Pss_File:":
			pssFile = v
		}
	}
	if pss == 0 || rss == 0 {
		return 0, 0, 0, 0, fmt.Errorf("/proc/%d/smaps_rollup: no Pss or Rss", pid)
	}
	return pss, rss, pssAnon, pssFile, nil
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted)-1) + 0.5)
	return sorted[i]
}

var (
	createdLine = regexp.MustCompile(`created in ([0-9.]+[mµn]?s) \(([^)]*)\)`)
	stageField  = regexp.MustCompile(`([a-z.-]+)=([0-9.]+)ms`)
)

// shimStages collects, per stage, the durations the node agent logged for
// each sandbox it placed (runtime's "created in" line), sorted. "create"
// is the whole sandbox create in the agent (the shim's act of creating the
// task, over the socket, included), "added" that but the task service's own
// create (the sandbox step).
func shimStages(log string) map[string][]time.Duration {
	out := map[string][]time.Duration{}
	for _, line := range strings.Split(log, "\n") {
		m := createdLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		create, createErr := time.ParseDuration(m[1])
		if createErr == nil {
			out["create"] = append(out["create"], create)
		}
		var taskCreate time.Duration
		for _, f := range stageField.FindAllStringSubmatch(m[2], -1) {
			ms, err := strconv.ParseFloat(f[2], 64)
			if err == nil {
				d := time.Duration(ms * float64(time.Millisecond))
				out[f[1]] = append(out[f[1]], d)
				if f[1] == "sandbox" {
					taskCreate = d
				}
			}
		}
		// What Bulkhead added to the sandbox's create: all of it but the
		// task service's own create (runsc's or runc's).
		if createErr == nil {
			out["added"] = append(out["added"], create-taskCreate)
		}
	}
	for _, d := range out {
		sortDurations(d)
	}
	return out
}

// stageOrder is the order the stages are printed in.
var stageOrder = []string{"create", "added", "decide", "reserve", "gpu", "sandbox", "fence", "fence.netns", "fence.ledger", "fence.register", "activate"}

// BenchmarkPodStart times 20 pod starts through the CRI for each of
// gVisor's own containerd-shim-runsc-v1 (where this process has
// CAP_SYS_RESOURCE, node.UpstreamRunscMissing), Bulkhead gVisor with the
// pipeline (policy, ledger, GPU, eBPF fence, the node agent) off and on
// (the same shim binary, switched by pipeline.enabled), containerd's own
// containerd-shim-runc-v2 and Bulkhead's runc tier with the pipeline on and
// off (off: the thin shim alone, no agent).
// The configurations compared run on two nodes started side by side, their
// starts interleaved (podStarts). It prints p50/p95 of each, the ratios,
// and the agent's stage timings at p50; then runs one more pod on each node
// and prints the PSS and RSS of its shim, its gVisor sandbox and the agent
// (printMemory). Run with -benchtime 1x; -bench BenchmarkPodStart/gvisor
// or /runc runs one runtime.
func BenchmarkPodStart(b *testing.B) {
	starts := 20
	if v := os.Getenv("BULKHEAD_BENCH_STARTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BULKHEAD_BENCH_STARTS=%q: want a positive count", v)
		}
		starts = n
	}
	series := map[string]startSeries{}
	mem := map[string]memory{}
	keep := func(m map[string]memory) {
		for k, v := range m {
			mem[k] = v
		}
	}
	upstreamRunscWhy := node.UpstreamRunscMissing()
	b.Run("gvisor", func(b *testing.B) {
		for range b.N {
			plain := startNode(b, node.Options{})
			pn := startPipelineNodeB(b)
			configs := []startConfig{{plain, node.Handler, "research"}, {pn.Node, node.Handler, "research"}}
			if upstreamRunscWhy == "" {
				configs = append(configs, startConfig{plain, node.UpstreamRunscHandler, "research"})
			}
			podStarts(b, 2, configs...) // warm caches (image unpack, first runsc)
			got := podStarts(b, starts, configs...)
			series["gvisor-off"], series["gvisor-on"] = got[0], got[1]
			if upstreamRunscWhy == "" {
				series["gvisor-upstream"] = got[2]
			}
			keep(podMemory(b, plain, node.Handler, "research", bulkheadShim("Bulkhead gVisor shim, pipeline off")))
			keep(podMemory(b, pn.Node, node.Handler, "research", bulkheadShim("Bulkhead gVisor shim"), runscSandbox, runscGofer,
				agentProcess(pn.Node, "bulkhead-agent, one gVisor pod")))
			pn.Stop(context.Background())
			plain.Stop(context.Background())
		}
	})
	b.Run("runc", func(b *testing.B) {
		if why := runcTierMissing(); why != "" {
			b.Skip("runc tier: not measured (" + why + ")")
		}
		for range b.N {
			plain := startNode(b, node.Options{})
			pn := startPipelineNodeB(b)
			configs := []startConfig{{plain, node.UpstreamRuncHandler, "platform"}, {pn.Node, node.RuncHandler, "platform"}, {plain, node.RuncHandler, "platform"}}
			podStarts(b, 2, configs...)
			got := podStarts(b, starts, configs...)
			series["runc-upstream"], series["runc-on"], series["runc-off"] = got[0], got[1], got[2]
			keep(podMemory(b, plain, node.UpstreamRuncHandler, "platform", upstreamRuncShim))
			keep(podMemory(b, pn.Node, node.RuncHandler, "platform", bulkheadRuncShim, agentProcess(pn.Node, "bulkhead-agent, one runc pod")))
			pn.Stop(context.Background())
			plain.Stop(context.Background())
		}
	})

	rows := []struct {
		key, label string
		baselines  []string
	}{
		{"gvisor-upstream", "upstream containerd-shim-runsc-v1", nil},
		{"gvisor-off", "Bulkhead gVisor, pipeline off", []string{"gvisor-upstream"}},
		{"gvisor-on", "Bulkhead gVisor, pipeline on", []string{"gvisor-off", "gvisor-upstream"}},
		{"runc-upstream", "upstream containerd-shim-runc-v2", nil},
		{"runc-off", "Bulkhead runc tier, pipeline off", []string{"runc-upstream"}},
		{"runc-on", "Bulkhead runc tier, pipeline on", []string{"runc-upstream", "runc-off"}},
	}
	fmt.Printf("pod start (RunPodSandbox + CreateContainer + StartContainer), %d pods each:\n", starts)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\tp50\tp95\tRunPodSandbox p50\tcontainer p50\tp50 ratio")
	for _, r := range rows {
		s, ok := series[r.key]
		if !ok {
			continue
		}
		p50 := percentile(s.total, 0.5)
		var ratios []string
		for _, baseline := range r.baselines {
			base, ok := series[baseline]
			if !ok {
				continue
			}
			ratio := float64(p50) / float64(percentile(base.total, 0.5))
			ratios = append(ratios, fmt.Sprintf("%.2f× %s", ratio, baseline))
			b.ReportMetric(ratio, "p50-ratio-"+r.key+"-to-"+baseline)
		}
		b.ReportMetric(float64(p50.Milliseconds()), "p50-ms-"+r.key)
		fmt.Fprintf(w, "%s\t%v\t%v\t%v\t%v\t%s\n", r.label, p50.Round(time.Millisecond), percentile(s.total, 0.95).Round(time.Millisecond),
			percentile(s.sandbox, 0.5).Round(time.Millisecond), percentile(s.container, 0.5).Round(time.Millisecond), strings.Join(ratios, ", "))
	}
	w.Flush()
	for _, key := range []string{"gvisor-on", "runc-on"} {
		s, ok := series[key]
		if !ok || len(s.stages) == 0 {
			continue
		}
		var parts []string
		for _, name := range stageOrder {
			if d := s.stages[name]; len(d) > 0 {
				parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(percentile(d, 0.5).Microseconds())/1000))
			}
		}
		fmt.Printf("  %s, agent stages p50 (ms, %d sandboxes): %s\n", key, len(s.stages["create"]), strings.Join(parts, ", "))
	}
	printMemory(b, mem)
	if _, measured := series["gvisor-upstream"]; measured {
		fmt.Println("  upstream containerd-shim-runsc-v1: gVisor's own shim of the same gVisor version, same runsc and runsc flags; " + upstreamRunscGrouping())
	} else if upstreamRunscWhy != "" {
		fmt.Printf("  upstream containerd-shim-runsc-v1: not measured: %s; the gVisor baseline is Bulkhead gVisor with the pipeline off (the same gVisor library behind Bulkhead's own manager), see docs/benchmarks.md\n", upstreamRunscWhy)
	}
}

// upstreamRunscGrouping says how many shim processes gVisor's own shim
// starts per pod: its manager reads grouping only from a machine-wide file,
// which a bench node does not write (node.UpstreamRunscHandler).
func upstreamRunscGrouping() string {
	for _, f := range []string{"/run/containerd/runsc/config.toml", "/etc/containerd/runsc/config.toml"} {
		if _, err := os.Stat(f); err == nil {
			return "shim grouping as this machine's " + f + " sets it (Bulkhead: one shim per pod)"
		}
	}
	return "one shim per container, as it ships (no machine-wide config.toml turns grouping on); Bulkhead: one shim per pod"
}

// TestUpstreamRunscHandler: the bench's gVisor baseline is wired. Where
// this process has CAP_SYS_RESOURCE, a pod on handler upstream-runsc runs
// in gVisor under the node's own runsc root for it (so gVisor's task service
// read the options file the CRI options point to). Without the capability,
// the pod reaches gVisor's shim manager and fails as docs/benchmarks.md
// says, on the shim's oom_score_adj, and leaves no shim running.
func TestUpstreamRunscHandler(t *testing.T) {
	if _, err := node.LookPath("containerd-shim-runsc-v1"); err != nil {
		t.Skip("needs containerd-shim-runsc-v1 (make tools-node)")
	}
	hasCap, err := node.HasCapability(unix.CAP_SYS_RESOURCE)
	if err != nil {
		t.Fatal(err)
	}
	n := startNode(t, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pod := podConfig(n, "upstream-runsc", "default", nil)
	id, err := runPodOn(ctx, n, node.UpstreamRunscHandler, pod)
	if !hasCap {
		if err == nil {
			t.Fatal("RunPodSandbox on upstream-runsc succeeded without CAP_SYS_RESOURCE: the bench would skip a baseline it could measure")
		}
		for _, want := range []string{"failed to set OOM Score on shim", "oom_score_adj: permission denied"} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("RunPodSandbox on upstream-runsc: want an error with %q, got: %v", want, err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(processes(n.Dir(), "containerd-shim-runsc-v1")) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("shims left running after the failed start: %q", processes(n.Dir(), "containerd-shim-runsc-v1"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("no CAP_SYS_RESOURCE here; gVisor's manager refused as expected: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("RunPodSandbox on upstream-runsc: %v", err)
	}
	c, err := startContainer(ctx, n, id, pod, "main", "exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	if dmesg, err := execSync(ctx, n, c, "dmesg"); err != nil || !strings.Contains(dmesg, "gVisor") {
		t.Errorf("dmesg inside the upstream-runsc pod does not show gVisor (err %v):\n%s", err, dmesg)
	}
	if sandboxes := processes(n.UpstreamRunscRoot, "boot"); len(sandboxes) != 1 {
		t.Errorf("want 1 runsc sandbox under %s (the options file's root), got %d: %q", n.UpstreamRunscRoot, len(sandboxes), sandboxes)
	}
	if err := removePod(ctx, n, id); err != nil {
		t.Fatal(err)
	}
}

// printMemory prints the memory of each process measured, with one pod
// running, and each shim's PSS against its anchor: the upstream shim of
// the same runtime (runc), the pod's gVisor sandbox process (gVisor).
func printMemory(b *testing.B, mem map[string]memory) {
	if len(mem) == 0 {
		return
	}
	rows := []struct {
		label, anchor, metric string
	}{
		{"Bulkhead gVisor shim", runscSandbox.label, "gvisor-shim"},
		{"Bulkhead gVisor shim, pipeline off", runscSandbox.label, "gvisor-shim-off"},
		{runscSandbox.label, "", "runsc-sandbox"},
		{runscGofer.label, "", "runsc-gofer"},
		{bulkheadRuncShim.label, upstreamRuncShim.label, "runc-shim"},
		{upstreamRuncShim.label, "", "runc-v2-shim"},
		{"bulkhead-agent, one gVisor pod", "", "agent-gvisor"},
		{"bulkhead-agent, one runc pod", "", "agent-runc"},
	}
	fmt.Println("memory with one pod running (/proc/PID/smaps_rollup):")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\tPSS\tRSS\tPSS anon / file\tPSS ratio")
	for _, r := range rows {
		m, ok := mem[r.label]
		if !ok {
			continue
		}
		if m.err != nil {
			fmt.Fprintf(w, "%s\tnot measured: %v\t\t\t\n", r.label, m.err)
			continue
		}
		ratio := ""
		if a, ok := mem[r.anchor]; ok && a.err == nil {
			q := float64(m.pss) / float64(a.pss)
			ratio = fmt.Sprintf("%.2f× %s", q, r.anchor)
			b.ReportMetric(q, "pss-ratio-"+r.metric)
		}
		b.ReportMetric(mb(m.pss), "pss-MB-"+r.metric)
		fmt.Fprintf(w, "%s\t%.1f MB\t%.1f MB\t%.1f / %.1f MB\t%s\n", r.label, mb(m.pss), mb(m.rss), mb(m.pssAnon), mb(m.pssFile), ratio)
	}
	w.Flush()
}
