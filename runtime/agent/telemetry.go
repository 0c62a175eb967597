package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

// countingDecider counts every decision the pipeline asks for.
type countingDecider struct {
	policy.Decider
	metrics *telemetry.Metrics
}

func (c countingDecider) Decide(ctx context.Context, in policy.Input) (policy.Decision, error) {
	d, err := c.Decider.Decide(ctx, in)
	c.metrics.Decided(in.Kind, d, err)
	return d, err
}

// Unwrap is the decider it counts for: questions that are not a pod's
// decision (which tenant owns a namespace) go there uncounted.
func (c countingDecider) Unwrap() policy.Decider { return c.Decider }

// Close closes the engine it counts for.
func (c countingDecider) Close() error {
	if cl, ok := c.Decider.(interface{ Close() error }); ok {
		return cl.Close()
	}
	return nil
}

// bundleState is what the agent knows of its policy bundle.
type bundleState struct {
	// mu guards the fields below.
	mu       sync.Mutex
	revision string
	loadedAt time.Time
	// lastError is why the last reload was refused; nil after one succeeded.
	lastError error
}

func (b *bundleState) set(revision string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastError = err
	if err == nil {
		b.revision, b.loadedAt = revision, time.Now()
	}
}

// Bundle is the active revision, when it was loaded and why the last
// reload was refused (nil when it was not).
func (a *Agent) Bundle() (revision string, loadedAt time.Time, lastReload error) {
	a.bundle.mu.Lock()
	defer a.bundle.mu.Unlock()
	return a.bundle.revision, a.bundle.loadedAt, a.bundle.lastError
}

// openPipeline opens the pipeline's components with the policy engine
// counted by the agent's metrics, and follows the engine's reloads.
func (a *Agent) openPipeline(ctx context.Context) (*runtime.Pipeline, error) {
	n, eng, err := runtime.Open(ctx, a.cfg)
	if err != nil {
		return nil, err
	}
	if f := n.Fence(); f != nil && f.Migration() != nil {
		// An upgrade over running pods of an older release.
		log.G(ctx).Infof("bulkhead-agent: %s: %s", a.cfg.Netpol.PinDir, f.Migration())
	}
	a.engine = eng
	a.bundle.set(eng.Revision(), nil)
	a.metrics.BundleLoaded(eng.Revision(), time.Now())
	eng.OnReload(func(revision string, err error) {
		a.bundle.set(revision, err)
		if err != nil {
			a.metrics.BundleReloadFailed(err)
			return
		}
		a.metrics.BundleLoaded(revision, time.Now())
	})
	return runtime.NewPipeline(n, countingDecider{Decider: eng, metrics: a.metrics}), nil
}

// openTelemetry makes the agent's metrics and, where the node reaches the
// API server, its Events.
func (a *Agent) openTelemetry(ctx context.Context) {
	a.metrics = telemetry.NewMetrics(telemetry.Options{
		Node:  nodeSource{a},
		Fence: fenceSource{a},
	})
	node := a.cfg.Agent.NodeName
	if node == "" {
		node = os.Getenv("NODE_NAME")
	}
	if node == "" {
		node, _ = os.Hostname()
	}
	events, err := telemetry.NewEvents(a.cfg.Agent.Kubeconfig, node)
	if err != nil {
		log.G(ctx).WithError(err).Warn("no Kubernetes Events on refused pods: the API server is not reachable as agent.kubeconfig says")
	}
	a.events = events
}

// observe records a sandbox create's stages and outcome.
func (a *Agent) observe(rt string, stages []runtime.Stage, took time.Duration, err error) {
	for _, s := range stages {
		a.metrics.Stage(rt, s.Name, s.Took)
	}
	result := "ok"
	var refused *runtime.RefusedError
	switch {
	case errors.As(err, &refused):
		result = "refused"
	case err != nil:
		result = "error"
	}
	a.metrics.Started(rt, result, took)
}

// refused emits a Kubernetes Event on the pod a refusal is about: what
// `kubectl describe pod` shows beside the kubelet's FailedCreatePodSandBox.
// bundle is the refused container's OCI bundle (its spec names the pod's
// UID); "" looks the pod up in its record.
func (a *Agent) refused(err error, bundle, sandbox string) {
	var r *runtime.RefusedError
	if a.events == nil || !errors.As(err, &r) {
		return
	}
	pod := telemetry.Pod{Namespace: r.Namespace, Name: r.Pod}
	if bundle != "" {
		pod.UID = podUID(bundle)
	}
	if pod.UID == "" && sandbox != "" {
		if sb, err := a.state.Load(sandbox); err == nil {
			pod.UID = sb.UID
		}
	}
	a.events.Refused(pod, err.Error())
}

// podUID is the pod UID containerd wrote into the spec in bundle; "" when
// it cannot be read.
func podUID(bundle string) string {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return ""
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if json.Unmarshal(b, &spec) != nil {
		return ""
	}
	return spec.Annotations[cri.AnnotationSandboxUID]
}

// nodeSource reads quota use and MIG instances for the metrics at scrape time.
type nodeSource struct{ a *Agent }

func (s nodeSource) QuotaUse() (map[string]policy.Usage, error) {
	use := map[string]policy.Usage{}
	err := s.a.pipeline.Node().Ledger().View(func(tx *node.LedgerTx) error {
		all, err := tx.List()
		if err != nil {
			return err
		}
		for _, r := range all {
			if _, seen := use[r.Tenant]; seen {
				continue
			}
			if use[r.Tenant], err = tx.Usage(r.Tenant); err != nil {
				return err
			}
		}
		return nil
	})
	return use, err
}

func (s nodeSource) MIGInstances() (map[int]int, error) {
	b := s.a.pipeline.Node().Backend()
	if b == nil {
		return nil, nil
	}
	insts, err := b.Instances()
	if err != nil {
		return nil, err
	}
	n := map[int]int{}
	for _, in := range insts {
		n[in.GPU]++
	}
	return n, nil
}

// fenceSource reads the fence's drop counters at scrape time; the node
// runs no fence when netpol.enabled is false.
type fenceSource struct{ a *Agent }

func (s fenceSource) Drops() ([]telemetry.FenceDrop, error) {
	f := s.a.pipeline.Node().Fence()
	if f == nil {
		return nil, telemetry.ErrNoFence
	}
	return telemetry.NetpolFence(f).Drops()
}
