package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// nthPod is the i-th decision of a benchmark: the inputs in turn, each time
// for a new pod (its own name and uid) of a tenant whose memory in use has
// moved since (a value not seen in the last 65,536 decisions), as on a node
// or at the API server. The plan's rule caches keep what depends only on
// the namespace and the pod's spec (the replicas of a workload share it);
// without the moving usage every decision after the sixth would repeat one
// already made, and the caches would answer whole decisions from memory.
func nthPod(inputs []Input, i int) Input {
	in := inputs[i%len(inputs)]
	n := strconv.Itoa(i)
	in.Pod.Name, in.Pod.UID = in.Pod.Name+"-"+n, "uid-"+n
	in.Usage.MemoryBytes += int64(i%65536) << 10
	return in
}

// benchInputs are realistic node decisions: allowed and refused pods of the
// three demo tenants.
func benchInputs() []Input {
	agent := agentPod()
	runc := agentPod()
	runc.Pod.RuntimeHandler = "runc"
	overQuota := agentPod()
	overQuota.Usage.Sandboxes = 20
	research := agentPod()
	research.Namespace, research.Request.GPU, research.Request.RDMA = "research", &GPURequest{Profile: "whole", Count: 1}, true
	research.Pod.Containers = append(research.Pod.Containers,
		Container{Name: "sidecar", Image: "registry.local/proxy:1", MemoryBytes: 256 << 20},
		Container{Name: "trainer", Image: "registry.local/train:2", Devices: []string{"/dev/fuse"}})
	platform := agentPod()
	platform.Namespace, platform.Pod.RuntimeHandler, platform.Request.GPU = "platform", "runc", nil
	stranger := agentPod()
	stranger.Namespace = "default"
	return []Input{agent, runc, overQuota, research, platform, stranger}
}

const baselineBundle = `package bulkhead

decision := {
	"allow": true, "reasons": [], "tenant": "", "tier": "", "runtime": "gvisor",
	"gpu": {"allowed_profiles": [], "max_slices": 0, "whole_gpu": false, "exclusive_physical_gpu": true, "mig_in_sandbox": "refuse"},
	"network": {"isolation": "tenant", "egress_cidrs": [], "deny_metadata": true},
	"rdma": "deny", "warnings": [],
}
`

// latencySample is measured once per process: 100k decisions on the default
// bundle and 100k on a constant baseline bundle through the same engine.
var latencySample struct {
	once             sync.Once
	bundle, baseline []time.Duration
	// topdown is the same bundle through OPA's interpreter (Options.Evaluator
	// topdown), the evaluator the plan replaced, on topdownSampleSize decisions.
	topdown []time.Duration
	// webhookGC is the bundle again with the collector as the webhook
	// process sets it (webhookGCPercent), where decisions come at a rate.
	webhookGC        []time.Duration
	allowed, refused int
	// CPU time (user+system, all threads: GC included) per decision; less
	// sensitive than wall-clock percentiles to a machine shared with others.
	bundleCPU, baselineCPU, topdownCPU, webhookGCCPU time.Duration
}

// webhookGCPercent is admission.DefaultGCPercent, the collector setting of
// the webhook's process (policy/admission imports this package, so the
// constant cannot be used here).
const webhookGCPercent = 400

const (
	sampleSize        = 100_000
	topdownSampleSize = 20_000
)

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func measure(b *testing.B, e *Engine, inputs []Input, n int) ([]time.Duration, int, time.Duration) {
	ctx := context.Background()
	out := make([]time.Duration, n)
	allowed := 0
	cpu0 := processCPU()
	for i := range out {
		in := nthPod(inputs, i)
		start := time.Now()
		d, err := e.Decide(ctx, in)
		out[i] = time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if d.Allow {
			allowed++
		}
	}
	cpu := (processCPU() - cpu0) / time.Duration(n)
	slices.Sort(out)
	return out, allowed, cpu
}

func percentile(sorted []time.Duration, p float64) float64 {
	return float64(sorted[int(p*float64(len(sorted)-1))].Nanoseconds())
}

func openBaseline(b *testing.B) *Engine {
	dir := writeBundleDir(b, map[string]string{"decision.rego": baselineBundle})
	e, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// BenchmarkDecide reports ns/op and allocs/op of Decide on the default
// bundle over a mix of realistic inputs, and p50/p90/p99/p99.9 over 100k
// decisions, with the same figures for a constant bundle as baseline, for
// OPA's interpreter, and for the bundle with the collector set as the
// webhook's process sets it (webhook-gc-*).
func BenchmarkDecide(b *testing.B) {
	e := openDefault(b)
	inputs := benchInputs()
	latencySample.once.Do(func() {
		base := openBaseline(b)
		var baseAllowed int
		latencySample.baseline, baseAllowed, latencySample.baselineCPU = measure(b, base, inputs, sampleSize)
		if baseAllowed != sampleSize {
			b.Fatal("baseline bundle refused a decision")
		}
		var allowed int
		latencySample.bundle, allowed, latencySample.bundleCPU = measure(b, e, inputs, sampleSize)
		latencySample.allowed, latencySample.refused = allowed, sampleSize-allowed
		prev := debug.SetGCPercent(webhookGCPercent)
		latencySample.webhookGC, _, latencySample.webhookGCCPU = measure(b, e, inputs, sampleSize)
		debug.SetGCPercent(prev)
		td := openDefaultWith(b, EvaluatorTopdown)
		latencySample.topdown, _, latencySample.topdownCPU = measure(b, td, inputs, topdownSampleSize)
		for _, in := range inputs {
			a, _ := e.Decide(context.Background(), in)
			t, _ := td.Decide(context.Background(), in)
			if a.Allow != t.Allow || len(a.Reasons) != len(t.Reasons) {
				b.Fatalf("%s/%s: the plan and the interpreter disagree: %+v, %+v", in.Namespace, in.Pod.Name, a, t)
			}
		}
	})
	decideLoop(b, e, inputs)
	s := &latencySample
	b.ReportMetric(percentile(s.bundle, 0.50), "p50-ns")
	b.ReportMetric(percentile(s.bundle, 0.90), "p90-ns")
	b.ReportMetric(percentile(s.bundle, 0.99), "p99-ns")
	b.ReportMetric(percentile(s.bundle, 0.999), "p99.9-ns")
	b.ReportMetric(percentile(s.baseline, 0.50), "baseline-p50-ns")
	b.ReportMetric(percentile(s.baseline, 0.99), "baseline-p99-ns")
	b.ReportMetric(percentile(s.bundle, 0.99)/percentile(s.baseline, 0.99), "p99/baseline-p99")
	b.ReportMetric(percentile(s.bundle, 0.99)/50_000, "p99/50µs-target")
	b.ReportMetric(float64(s.refused)/sampleSize, "refused-fraction")
	b.ReportMetric(float64(s.bundleCPU.Nanoseconds()), "cpu-ns/decision")
	b.ReportMetric(percentile(s.webhookGC, 0.50), "webhook-gc-p50-ns")
	b.ReportMetric(percentile(s.webhookGC, 0.99), "webhook-gc-p99-ns")
	b.ReportMetric(float64(s.webhookGCCPU.Nanoseconds()), "webhook-gc-cpu-ns/decision")
	b.ReportMetric(float64(s.baselineCPU.Nanoseconds()), "baseline-cpu-ns/decision")
	b.ReportMetric(percentile(s.topdown, 0.50), "topdown-p50-ns")
	b.ReportMetric(percentile(s.topdown, 0.99), "topdown-p99-ns")
	b.ReportMetric(float64(s.topdownCPU.Nanoseconds()), "topdown-cpu-ns/decision")
	b.ReportMetric(float64(s.topdownCPU)/float64(s.bundleCPU), "topdown-cpu/plan-cpu")
	b.ReportMetric(regoSteps(b, e, inputs), "rego-steps/decision")
}

// stepCounter counts the expressions the evaluator evaluates and
// re-evaluates: the policy's own work, independent of the machine.
type stepCounter struct{ n int }

func (c *stepCounter) Enabled() bool               { return true }
func (c *stepCounter) Config() topdown.TraceConfig { return topdown.TraceConfig{} }
func (c *stepCounter) TraceEvent(ev topdown.Event) {
	if ev.Op == topdown.EvalOp || ev.Op == topdown.RedoOp {
		c.n++
	}
}

// regoSteps is the mean number of expression evaluations per decision over
// inputs. Decision latency on a given machine is roughly proportional to it.
func regoSteps(b testing.TB, e *Engine, inputs []Input) float64 {
	interp, err := e.active.Load().interpreter(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var c stepCounter
	for i := range inputs {
		if _, err := interp.decision.Eval(context.Background(), rego.EvalParsedInput(inputs[i].astValue()), rego.EvalQueryTracer(&c)); err != nil {
			b.Fatal(err)
		}
	}
	return float64(c.n) / float64(len(inputs))
}

// openLargeCluster opens demoBundle with the demo tenants and n more,
// each with two namespaces: a cluster where walking every tenant per
// decision would show.
func openLargeCluster(tb testing.TB, n int) *Engine {
	tb.Helper()
	raw, err := os.ReadFile(repoPath(tb, "rego/examples/tenants.demo.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var data map[string]map[string]map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		data["bulkhead"]["tenants"][fmt.Sprintf("team-%d", i)] = map[string]any{
			"tier": "standard", "namespaces": []string{fmt.Sprintf("team-%d", i), fmt.Sprintf("team-%d-ci", i)},
		}
	}
	path := filepath.Join(tb.TempDir(), "tenants.json")
	raw, _ = json.Marshal(data)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		tb.Fatal(err)
	}
	e, err := Open(context.Background(), Options{
		BundlePath: demoBundle(tb), DataPath: path, InsecureSkipVerification: true, Logger: quietLogger(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// BenchmarkDecideLargeCluster is BenchmarkDecide's inputs with 1,003
// tenants in data instead of 3; rego-steps/decision should not move.
func BenchmarkDecideLargeCluster(b *testing.B) {
	e := openLargeCluster(b, 1000)
	inputs := benchInputs()
	decideLoop(b, e, inputs)
	b.ReportMetric(regoSteps(b, e, inputs), "rego-steps/decision")
}

// BenchmarkDecideParallel is Decide from GOMAXPROCS goroutines at once.
func BenchmarkDecideParallel(b *testing.B) {
	e := openDefault(b)
	inputs := benchInputs()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := 0
		for pb.Next() {
			if _, err := e.Decide(ctx, nthPod(inputs, i)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkDecideWithDecisionLog adds masking and a JSON line per decision.
func BenchmarkDecideWithDecisionLog(b *testing.B) {
	e, err := Open(context.Background(), Options{
		BundlePath:               demoBundle(b),
		DataPath:                 repoPath(b, "rego/examples/tenants.demo.json"),
		InsecureSkipVerification: true,
		DecisionLog:              io.Discard,
		Logger:                   quietLogger(),
	})
	if err != nil {
		b.Fatal(err)
	}
	inputs := benchInputs()
	decideLoop(b, e, inputs)
}

// decideLoop is the timed loop of the Decide benchmarks: the inputs in turn.
func decideLoop(b *testing.B, e *Engine, inputs []Input) {
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := e.Decide(ctx, nthPod(inputs, i)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkOpen opens the default bundle as a node's shim does: a signed
// tarball, verified, with the tenants as a data file, compiled and planned
// (compile) or read from the plan cache (plan-cache-hit). Every Bulkhead
// shim pays it once, on its pod's start.
func BenchmarkOpen(b *testing.B) {
	opts := signedDefaultOptions(b)
	b.Run("compile", func(b *testing.B) {
		for range b.N {
			e, err := Open(context.Background(), opts)
			if err != nil {
				b.Fatal(err)
			}
			e.Close()
		}
	})
	withPlanCache(b, &opts)
	if e, err := Open(context.Background(), opts); err != nil {
		b.Fatal(err)
	} else {
		e.Close()
	}
	b.Run("plan-cache-hit", func(b *testing.B) {
		for range b.N {
			e, err := Open(context.Background(), opts)
			if err != nil {
				b.Fatal(err)
			}
			if !e.active.Load().fromCache {
				b.Fatal("plan cache missed")
			}
			e.Close()
		}
	})
}
