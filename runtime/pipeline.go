package runtime

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// Pipeline places one pod: policy → quota → GPU → sandbox and fence. The
// node agent holds one for the node: the node (package runtime/node) holds
// what outlives each pod, the pipeline only adds the policy it asks.
type Pipeline struct {
	node    *node.Node
	decider policy.Decider
	// tenants remembers which tenant the policy in force gives each
	// namespace, so that reserve asks the policy once per pod.
	tenants *policy.NamespaceTenants
	failAt  string
	// nodeName is the node's name in the policy input (agent.node_name,
	// else $NODE_NAME, else the host name), resolved once.
	nodeName string
}

// NewPipeline assembles a pipeline that places pods on n as d decides. A
// decider that wraps another (an Unwrap method, as the agent's counting
// one has) has the namespaces' tenants asked of the one it wraps.
func NewPipeline(n *node.Node, d policy.Decider) *Pipeline {
	inner := d
	for {
		w, ok := inner.(interface{ Unwrap() policy.Decider })
		if !ok {
			break
		}
		inner = w.Unwrap()
	}
	return &Pipeline{node: n, decider: d, tenants: policy.NewNamespaceTenants(inner), failAt: failAtFromEnv(),
		nodeName: n.Config().Agent.Node()}
}

// OpenPipeline opens the node and the policy engine named by the
// configuration.
func OpenPipeline(ctx context.Context, cfg config.Config) (*Pipeline, error) {
	n, eng, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return NewPipeline(n, eng), nil
}

// Node is what the pipeline places pods on.
func (p *Pipeline) Node() *node.Node { return p.node }

// Decider is the policy the pipeline asks.
func (p *Pipeline) Decider() policy.Decider { return p.decider }

// Close closes the policy engine and the node's handles; the fence's
// pinned maps and programs stay, and keep enforcing for running pods.
func (p *Pipeline) Close() error {
	var errs []error
	if c, ok := p.decider.(interface{ Close() error }); ok {
		errs = append(errs, c.Close())
	}
	errs = append(errs, p.node.Close())
	return errors.Join(errs...)
}

// PolicyCacheDir is the directory under the state directory where the
// compiled plan of the verified policy bundle is kept (policy.Options
// PlanCacheDir); removing it only costs the next open a compile.
const PolicyCacheDir = "policy-cache"

// Open opens the node cfg names (node.Open: the ledger, the MIG backend,
// the fence) and its policy engine. The engine opens while the node does:
// it is the slowest, and the node does not need it.
func Open(ctx context.Context, cfg config.Config) (*node.Node, *policy.Engine, error) {
	opts := policy.Options{
		BundlePath:               cfg.Policy.Bundle,
		KeyID:                    cfg.Policy.KeyID,
		Scope:                    cfg.Policy.Scope,
		InsecureSkipVerification: cfg.Policy.InsecureSkipVerification,
		DataPath:                 cfg.Policy.Data,
		DecisionLogFile:          cfg.Policy.DecisionLog,
		Evaluator:                cfg.Policy.Evaluator,
		MaxBundleBytes:           cfg.Policy.MaxBundleBytes,
		MaxBundleFiles:           cfg.Policy.MaxBundleFiles,
		// A later open of the same bundle loads its verified plan instead
		// of compiling it.
		PlanCacheDir:     filepath.Join(cfg.StateDir, PolicyCacheDir),
		PlanCacheKeyFile: cfg.PlanCacheKeyPath(),
	}
	if cfg.Policy.KeyFile != "" {
		opts.Keys = map[string]string{cfg.Policy.KeyID: cfg.Policy.KeyFile}
	}
	type opened struct {
		engine *policy.Engine
		err    error
		took   time.Duration
	}
	policyOpened := make(chan opened, 1)
	go func() {
		t := time.Now()
		eng, err := policy.Open(ctx, opts)
		policyOpened <- opened{eng, err, time.Since(t)}
	}()
	n, err := node.Open(ctx, cfg)
	t := time.Now()
	o := <-policyOpened
	starttrace.Took(ctx, "open.policy", o.took)
	starttrace.Since(ctx, "open.policy-wait", t)
	switch {
	case err != nil && o.err == nil:
		o.engine.Close()
	case err == nil && o.err != nil:
		n.Close()
		err = o.err // the engine names the bundle and the rule
	}
	if err != nil {
		return nil, nil, err
	}
	return n, o.engine, nil
}

// Stage is how long one stage of a sandbox's create took.
type Stage = starttrace.Stage
