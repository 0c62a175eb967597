// Package agent is Bulkhead's node agent (bulkhead-agent): one process per
// node that holds what outlives a pod — the compiled policy (reloaded when
// a new signed bundle appears), the ledger, the GPU backend, the fence and
// GC — and serves the node's thin shims on a root-only unix socket
// (package agentapi).
//
// # Invariant
//
// Every pod of the node is admitted, judged, charged and released here, in
// the ledger transaction the pipeline defines (package runtime), whichever
// shim serves it. The agent keeps one runtime.Pod per pod; what a pod was
// admitted under is on disk before its sandbox exists, so a restarted agent
// resumes every running pod from its record and the ledger, and a stopped
// agent leaves running pods fenced (pinned maps) and charged. While the
// agent is down, nothing new starts: the shims fail closed.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime"
	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

// gcInterval is how often the agent repairs what dead shims left, besides
// at start and shortly after a shim died in the middle of a call.
const gcInterval = 30 * time.Second

// bundlePoll is how often the agent looks for a new policy bundle: a new
// revision is enforced on the next pod within about this long.
const bundlePoll = 250 * time.Millisecond

// Agent serves one node's shims.
type Agent struct {
	cfg      config.Config
	pipeline *runtime.Pipeline
	engine   *policy.Engine
	state    *node.StateDir

	// mu guards pods, ops and lastOp.
	mu sync.Mutex
	// pods are the node's pods by sandbox id, each created on its sandbox's
	// create or resumed from its record on its first call after a restart.
	pods map[string]*runtime.Pod
	// ops are the calls waiting for a shim's Continue, by op id.
	ops    map[uint64]*op
	lastOp uint64
	// creating are the sandboxes whose create is in flight: GC leaves
	// their records alone.
	creating map[string]bool

	// gcSoon asks the GC loop for a pass now (a shim died mid-call).
	gcSoon chan struct{}
	// startedAt is when Open opened the node.
	startedAt time.Time

	metrics *telemetry.Metrics
	// events is nil where the agent does not reach the API server.
	events *telemetry.Events
	bundle bundleState
	// cluster keeps the fence's pods of other nodes; nil where the agent
	// does not reach the API server. Set by Serve before it serves.
	cluster *clusterWatch
}

// Open opens the pipeline cfg names (policy, ledger, GPU backend, fence)
// and repairs what crashed shims or a crashed agent left.
func Open(ctx context.Context, cfg config.Config) (*Agent, error) {
	if !cfg.Pipeline.Enabled {
		return nil, errors.New("pipeline.enabled is false: the shims run pods unjudged and never call the agent (a benchmark baseline); there is nothing to serve")
	}
	a := &Agent{
		cfg: cfg, state: node.NewStateDir(cfg), startedAt: time.Now(),
		pods: map[string]*runtime.Pod{}, ops: map[uint64]*op{}, creating: map[string]bool{}, gcSoon: make(chan struct{}, 1),
	}
	a.openTelemetry(ctx)
	p, err := a.openPipeline(ctx)
	if err != nil {
		a.events.Close()
		return nil, err
	}
	a.pipeline = p
	if _, err := p.Node().GCExcept(ctx, a.isCreating); err != nil {
		log.G(ctx).WithError(err).Warn("gc at agent start")
	}
	return a, nil
}

// Close releases the agent's handles. Running pods keep their fence entries
// and reservations.
func (a *Agent) Close() error {
	a.events.Close()
	return a.pipeline.Close()
}

// Listen creates the agent's socket at path: its directory 0700 and the
// socket 0600, root's, replacing a socket a dead agent left.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("agent.socket %s: %w", path, err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("agent.socket %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("agent.socket %s: another agent serves it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("agent.socket %s: remove stale socket: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("agent.socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("agent.socket %s: %w", path, err)
	}
	return l, nil
}

// Serve answers the shims on l until ctx ends, then stops serving. Peers
// that are not root (SO_PEERCRED) are refused at the handshake. It also
// reloads the policy when a new bundle appears and runs GC.
func (a *Agent) Serve(ctx context.Context, l net.Listener) error {
	srv, err := ttrpc.NewServer(ttrpc.WithServerHandshaker(ttrpc.UnixSocketRequireUidGid(0, -1)))
	if err != nil {
		return err
	}
	srv.RegisterService(agentapi.Service, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		agentapi.MethodCreate:   handler(a.create),
		agentapi.MethodUpdate:   handler(a.update),
		agentapi.MethodContinue: handler(a.continueOp),
		agentapi.MethodDeleted:  handler(a.deleted),
		agentapi.MethodStatus:   handler(a.status),
	}})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go a.gcLoop(ctx)
	a.startCluster(ctx)
	stopDRA := a.startDRA(ctx)
	defer stopDRA()
	if addr := a.cfg.Agent.MetricsAddress; addr != "" {
		go func() {
			if err := a.metrics.Serve(ctx, addr); err != nil {
				log.G(ctx).WithError(err).Errorf("agent.metrics_address %s: not serving /metrics", addr)
			}
		}()
	}
	if a.engine != nil {
		go func() {
			if err := a.engine.Watch(ctx, bundlePoll); err != nil && ctx.Err() == nil {
				log.G(ctx).WithError(err).Error("policy bundle watch stopped")
			}
		}()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx, l) }()
	select {
	case <-ctx.Done():
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, ttrpc.ErrServerClosed) {
			return nil
		}
		return err
	}
}

// handler adapts a method of the agent to ttrpc: the request and the answer
// are agentapi's JSON documents.
func handler[Req, Resp any](fn func(context.Context, Req) (Resp, error)) ttrpc.Method {
	return func(ctx context.Context, unmarshal func(any) error) (any, error) {
		var in wrapperspb.BytesValue
		if err := unmarshal(&in); err != nil {
			return nil, err
		}
		var req Req
		if err := agentapi.Unmarshal(&in, &req); err != nil {
			return nil, err
		}
		resp, err := fn(ctx, req)
		if err != nil {
			return nil, err
		}
		return agentapi.Marshal(resp)
	}
}

// gcLoop repairs what dead shims left every gcInterval, and soon after a
// shim died in the middle of a call.
func (a *Agent) gcLoop(ctx context.Context) {
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.gcSoon:
			// Let containerd's cleanup of the dead shim (runc or runsc
			// delete) finish first.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		a.gc(ctx)
	}
}

func (a *Agent) gc(ctx context.Context) {
	rep, err := a.pipeline.Node().GCExcept(ctx, a.isCreating)
	if err != nil {
		log.G(ctx).WithError(err).Warn("gc")
	}
	a.mu.Lock()
	for _, id := range append(rep.Released, rep.Records...) {
		delete(a.pods, id)
	}
	a.mu.Unlock()
}

// isCreating reports whether sandbox id's create is in flight.
func (a *Agent) isCreating(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.creating[id]
}

// podOptions are the options of a pod served for caller.
func (a *Agent) podOptions(c agentapi.Caller, o *op) (runtime.PodOptions, error) {
	if c.Runtime != agentapi.RuntimeGVisor && c.Runtime != agentapi.RuntimeRunc {
		return runtime.PodOptions{}, fmt.Errorf("caller.runtime: %q is not %s or %s", c.Runtime, agentapi.RuntimeGVisor, agentapi.RuntimeRunc)
	}
	if c.PID <= 0 {
		return runtime.PodOptions{}, fmt.Errorf("caller.pid: %d is not a process id", c.PID)
	}
	return runtime.PodOptions{
		Config: a.cfg, Runtime: c.Runtime, ShimPID: c.PID, Pipeline: a.pipeline, Observe: a.observe,
		DeleteTask: func(ctx context.Context, id string) error {
			if o == nil {
				return fmt.Errorf("container %s: no call of the shim to delete it through", id)
			}
			return o.ask(agentapi.ActDelete, id)
		},
	}, nil
}

// pod returns the pod of sandbox id, resumed from its record when this
// agent has not served it yet.
func (a *Agent) pod(c agentapi.Caller, id string) (*runtime.Pod, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p := a.pods[id]; p != nil {
		return p, nil
	}
	opts, err := a.podOptions(c, nil)
	if err != nil {
		return nil, err
	}
	p, err := runtime.ResumePod(opts, id)
	if err != nil {
		return nil, err
	}
	a.pods[id] = p
	return p, nil
}

// start runs work as a new op of the shim c and answers the call that
// started it.
func (a *Agent) start(ctx context.Context, c agentapi.Caller, work func(o *op) error) agentapi.Reply {
	a.mu.Lock()
	a.lastOp++
	o := newOp(a.lastOp, c.PID)
	a.ops[o.id] = o
	a.mu.Unlock()
	o.run(func() error { return work(o) })
	return a.answer(ctx, o)
}

// callContext is the context a shim's call is worked in: it outlives the
// call (an op continues after the call that started it returned), and its
// log lines carry the call's fields.
func callContext(ctx context.Context, c agentapi.Caller, method, sandbox, id string) context.Context {
	fields := log.Fields{"call": method, "runtime": c.Runtime, "shim_pid": c.PID, "container": id}
	if sandbox != "" {
		fields["sandbox"] = sandbox
	}
	return log.WithLogger(context.WithoutCancel(ctx), log.G(ctx).WithFields(fields))
}

// answer waits for o's next act or final answer; a final answer retires o.
func (a *Agent) answer(ctx context.Context, o *op) agentapi.Reply {
	reply, final := o.next(ctx)
	if final {
		a.mu.Lock()
		delete(a.ops, o.id)
		a.mu.Unlock()
		select {
		case <-o.gone:
			// The shim died mid-call: what it held goes at once.
			select {
			case a.gcSoon <- struct{}{}:
			default:
			}
		default:
		}
	}
	return reply
}

func (a *Agent) create(ctx context.Context, r agentapi.CreateRequest) (agentapi.Reply, error) {
	if r.ID == "" || r.Bundle == "" {
		return agentapi.Reply{}, fmt.Errorf("create: id %q and bundle %q must be set", r.ID, r.Bundle)
	}
	work := callContext(ctx, r.Caller, agentapi.MethodCreate, r.Sandbox, r.ID)
	return a.start(ctx, r.Caller, func(o *op) error {
		var p *runtime.Pod
		if r.Sandbox == "" {
			a.mu.Lock()
			a.creating[r.ID] = true
			a.mu.Unlock()
			defer func() {
				a.mu.Lock()
				delete(a.creating, r.ID)
				a.mu.Unlock()
			}()
			opts, err := a.podOptions(r.Caller, o)
			if err != nil {
				return err
			}
			if p, err = runtime.NewPod(opts); err != nil {
				return err
			}
		} else {
			var err error
			if p, err = a.pod(r.Caller, r.Sandbox); err != nil {
				return fmt.Errorf("container %s: %w", r.ID, err)
			}
		}
		err := p.Create(work, r.ID, r.Bundle, func(string) error { return o.ask(agentapi.ActCreate, r.ID) })
		if r.Sandbox == "" && err == nil {
			a.mu.Lock()
			a.pods[r.ID] = p
			a.mu.Unlock()
		}
		a.refused(err, r.Bundle, r.Sandbox)
		return err
	}), nil
}

func (a *Agent) update(ctx context.Context, r agentapi.UpdateRequest) (agentapi.Reply, error) {
	p, err := a.pod(r.Caller, r.Sandbox)
	if err != nil {
		return agentapi.Reply{Error: fmt.Sprintf("container %s: update: %v", r.ID, err)}, nil
	}
	var res *anypb.Any
	if r.ResourcesType != "" || len(r.Resources) > 0 {
		res = &anypb.Any{TypeUrl: r.ResourcesType, Value: r.Resources}
	}
	work := callContext(ctx, r.Caller, agentapi.MethodUpdate, r.Sandbox, r.ID)
	return a.start(ctx, r.Caller, func(o *op) error {
		err := p.Update(work, r.ID, res, func() error { return o.ask(agentapi.ActUpdate, r.ID) })
		a.refused(err, "", r.Sandbox)
		return err
	}), nil
}

func (a *Agent) continueOp(ctx context.Context, r agentapi.ContinueRequest) (agentapi.Reply, error) {
	a.mu.Lock()
	o := a.ops[r.Op]
	a.mu.Unlock()
	if o == nil {
		return agentapi.Reply{Error: fmt.Sprintf("op %d: the agent waits for no such act (it restarted, or gave the shim up)", r.Op)}, nil
	}
	if err := o.report(ctx, r.Error); err != nil {
		log.G(ctx).WithError(err).Debugf("op %d: report", r.Op)
	}
	return a.answer(ctx, o), nil
}

func (a *Agent) deleted(ctx context.Context, r agentapi.DeletedRequest) (agentapi.Reply, error) {
	if r.Sandbox == "" || r.ID == "" {
		return agentapi.Reply{}, fmt.Errorf("deleted: sandbox %q and id %q must be set", r.Sandbox, r.ID)
	}
	if r.ID == r.Sandbox {
		a.mu.Lock()
		p := a.pods[r.Sandbox]
		delete(a.pods, r.Sandbox)
		a.mu.Unlock()
		if p != nil {
			p.Deleted(ctx, r.ID)
			return agentapi.Reply{}, nil
		}
		// A pod this agent has not served (it restarted, or this is a dead
		// shim's `shim delete`): release what the ledger says it holds.
		if err := a.pipeline.Node().Release(ctx, r.Sandbox); err != nil {
			return agentapi.Reply{Error: err.Error()}, nil
		}
		if err := a.state.Remove(r.Sandbox); err != nil {
			return agentapi.Reply{Error: err.Error()}, nil
		}
		return agentapi.Reply{}, nil
	}
	p, err := a.pod(r.Caller, r.Sandbox)
	if err != nil {
		return agentapi.Reply{Error: fmt.Sprintf("container %s: deleted: %v", r.ID, err)}, nil
	}
	p.Deleted(ctx, r.ID)
	return agentapi.Reply{}, nil
}

func (a *Agent) status(ctx context.Context, _ agentapi.StatusRequest) (agentapi.StatusReply, error) {
	return a.statusReply()
}
