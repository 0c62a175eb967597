package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/runtime"
	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
)

// benchTenants has room for every pod of a round at once.
const benchTenants = `{"bulkhead": {"tenants": {
  "bench": {"tier": "standard", "namespaces": ["bench"], "quota": {"sandboxes": 1000, "memory": "4Ti"}}
}}}`

// benchConcurrency is how many sandbox creates a round starts at once.
const benchConcurrency = 100

// benchAgent serves a real agent as testAgent does (the default bundle, a
// real ledger, no fence and no GPUs), with benchTenants.
func benchAgent(b *testing.B) (*Agent, *agentapi.Client) {
	b.Helper()
	a, c, _ := serveAgent(b, benchTenants)
	return a, c
}

// benchBundles writes the OCI bundles of n sandboxes of namespace bench as
// containerd's CRI plugin would, one directory each under dir.
func benchBundles(b *testing.B, dir, prefix string, n int) []string {
	b.Helper()
	out := make([]string, n)
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		spec := &specs.Spec{Annotations: map[string]string{
			cri.AnnotationContainerType: cri.ContainerTypeSandbox, cri.AnnotationSandboxNamespace: "bench", cri.AnnotationSandboxName: name,
			cri.AnnotationSandboxMemory: "1073741824",
		}, Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
		}}}
		out[i] = filepath.Join(dir, name)
		if err := os.MkdirAll(out[i], 0o755); err != nil {
			b.Fatal(err)
		}
		raw, err := json.Marshal(spec)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out[i], "config.json"), raw, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

// inBatches runs fn(i) for i in [0, n), batch at a time (concurrently), and
// returns how long each took and the first error.
func inBatches(n, batch int, fn func(i int) error) ([]time.Duration, error) {
	var took []time.Duration
	for from := 0; from < n; from += batch {
		t, err := concurrently(min(batch, n-from), func(i int) error { return fn(from + i) })
		took = append(took, t...)
		if err != nil {
			return took, err
		}
	}
	return took, nil
}

// concurrently runs fn(i) for i in [0, n) on n goroutines released at
// once, and returns how long each took and the first error.
func concurrently(n int, fn func(i int) error) ([]time.Duration, error) {
	took := make([]time.Duration, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t := time.Now()
			errs[i] = fn(i)
			took[i] = time.Since(t)
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return took, err
		}
	}
	return took, nil
}

// quantile is the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted)-1)+0.5))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// BenchmarkDecisionOverSocket measures what deciding a pod over the agent's
// socket adds to a sandbox create, with 100 creates at once
// (concurrency=100), 10 at once and one at a time (concurrency=1). Each iteration runs
// two rounds of 100 sandboxes on the same agent (the same pipeline: policy,
// ledger), alternating which goes first: creates as shims send them
// (Create, the act create answered at once with Continue, the final
// answer; then Deleted, not timed), and creates placed in-process
// (runtime.Pod.Create on the agent's own pipeline, no socket). It reports
// the per-create latency of both, p50 and p99, and their difference,
// "added"; and the latency of one Status call while the 100 pods of the
// socket round are held. The agent's log lines are formatted as it formats
// them and then dropped. Run with -benchtime Nx: each iteration is 200
// creates.
func BenchmarkDecisionOverSocket(b *testing.B) {
	out := log.L.Logger.Out
	log.L.Logger.SetOutput(io.Discard)
	b.Cleanup(func() { log.L.Logger.SetOutput(out) })
	for _, conc := range []int{benchConcurrency, 10, 1} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) { benchDecision(b, conc) })
	}
}

func benchDecision(b *testing.B, conc int) {
	a, c := benchAgent(b)
	ctx := context.Background()
	caller := agentapi.Caller{Runtime: agentapi.RuntimeGVisor, PID: os.Getpid()}
	var socketTook, processTook, statusTook []time.Duration
	overSocket := func(round int, bundles []string) ([]time.Duration, error) {
		ids := make([]string, len(bundles))
		took, err := inBatches(len(bundles), conc, func(i int) error {
			ids[i] = fmt.Sprintf("sock-%d-%d", round, i)
			reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: ids[i], Bundle: bundles[i]})
			if err != nil {
				return err
			}
			if reply.Act != agentapi.ActCreate {
				return fmt.Errorf("sandbox %s: reply %+v, want the act create", ids[i], reply)
			}
			if reply, err = c.Continue(ctx, agentapi.ContinueRequest{Op: reply.Op}); err != nil {
				return err
			}
			if reply.Error != "" || reply.Act != "" {
				return fmt.Errorf("sandbox %s: final reply %+v, want success", ids[i], reply)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		// One Status at a time while the pods are held.
		for range 20 {
			t := time.Now()
			if _, err := c.Status(ctx); err != nil {
				return nil, err
			}
			statusTook = append(statusTook, time.Since(t))
		}
		if _, err := concurrently(len(ids), func(i int) error {
			return c.Deleted(ctx, agentapi.DeletedRequest{Caller: caller, Sandbox: ids[i], ID: ids[i]})
		}); err != nil {
			return nil, err
		}
		return took, nil
	}
	inProcess := func(round int, bundles []string) ([]time.Duration, error) {
		pods := make([]*runtime.Pod, len(bundles))
		ids := make([]string, len(bundles))
		took, err := inBatches(len(bundles), conc, func(i int) error {
			ids[i] = fmt.Sprintf("proc-%d-%d", round, i)
			opts, err := a.podOptions(caller, nil)
			if err != nil {
				return err
			}
			if pods[i], err = runtime.NewPod(opts); err != nil {
				return err
			}
			return pods[i].Create(ctx, ids[i], bundles[i], func(string) error { return nil })
		})
		if err != nil {
			return nil, err
		}
		for i, p := range pods {
			p.Deleted(ctx, ids[i])
		}
		return took, nil
	}

	dir := b.TempDir()
	b.ResetTimer()
	for round := range b.N {
		b.StopTimer()
		sockBundles := benchBundles(b, dir, fmt.Sprintf("sock-%d", round), benchConcurrency)
		procBundles := benchBundles(b, dir, fmt.Sprintf("proc-%d", round), benchConcurrency)
		b.StartTimer()
		order := []func() error{
			func() error {
				t, err := overSocket(round, sockBundles)
				socketTook = append(socketTook, t...)
				return err
			},
			func() error {
				t, err := inProcess(round, procBundles)
				processTook = append(processTook, t...)
				return err
			},
		}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, run := range order {
			if err := run(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	slices.Sort(socketTook)
	slices.Sort(processTook)
	slices.Sort(statusTook)
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		s, p := quantile(socketTook, q.q), quantile(processTook, q.q)
		b.ReportMetric(ms(s), "socket-"+q.name+"-ms")
		b.ReportMetric(ms(p), "inprocess-"+q.name+"-ms")
		b.ReportMetric(ms(s-p), "added-"+q.name+"-ms")
		b.ReportMetric(ms(quantile(statusTook, q.q)), "status-"+q.name+"-ms")
	}
	b.ReportMetric(0, "ns/op")
}
