// Package shim is what a Bulkhead shim does for its pod: nothing but ask
// the node agent. It sits in front of a task service (gVisor's or runc's);
// every sandbox create, container create, resource update and delete is
// one call to the agent (package agentapi), and the task service acts only
// where the agent says.
//
// # Invariant
//
// No container of a pod is created, and no resource update applied, unless
// the agent answered that it may be: when the agent cannot be reached the
// shim refuses, naming the agent's socket (fail closed). The package links
// neither the policy engine, nor the fence, nor a GPU backend; a test of
// each shim's command proves it with go list -deps.
package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/containerd/log"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// Options say which shim a Pod serves and what its task service needs.
type Options struct {
	// Config is the node's configuration.
	Config config.Config
	// Runtime is agentapi.RuntimeGVisor or agentapi.RuntimeRunc.
	Runtime string
	// CheckSandbox, if set, runs on the sandbox's create before the agent
	// is asked: an error refuses the pod. gVisor's shim checks there that
	// its manager wrote the options file into the sandbox's bundle.
	CheckSandbox func(id, bundle string) error
}

// Pod is the shim's pod.
type Pod struct {
	cfg          config.Config
	runtime      string
	checkSandbox func(id, bundle string) error
	agent        *agentapi.Client

	// mu guards sandbox and sandboxBundle, and is held for the whole of a
	// create, an update or a delete: the agent serves one pod's calls in
	// the order its shim made them.
	mu sync.Mutex
	// sandbox and sandboxBundle are the pod's sandbox container and its
	// bundle; "" until the shim's first container, its sandbox, was created.
	sandbox, sandboxBundle string
}

// NewPod returns the pod a shim serves in front of its task service.
func NewPod(opts Options) (*Pod, error) {
	if opts.Runtime != agentapi.RuntimeGVisor && opts.Runtime != agentapi.RuntimeRunc {
		return nil, fmt.Errorf("shim: runtime %q: want %q or %q", opts.Runtime, agentapi.RuntimeGVisor, agentapi.RuntimeRunc)
	}
	return &Pod{
		cfg:          opts.Config,
		runtime:      opts.Runtime,
		checkSandbox: opts.CheckSandbox,
		agent:        agentapi.NewClient(opts.Config.Agent.Socket),
	}, nil
}

func (p *Pod) caller() agentapi.Caller {
	return agentapi.Caller{Runtime: p.runtime, PID: os.Getpid()}
}

// Task is what the agent may ask of the task service during one call.
type Task struct {
	// Create creates the container of the call; sandboxBundle is the
	// bundle of the pod's sandbox (gVisor's options file lives there).
	Create func(sandboxBundle string) error
	// Update applies the resource update of the call.
	Update func() error
	// Delete deletes container id again (a later step failed).
	Delete func(ctx context.Context, id string) error
}

// Create has the agent admit container id (the pod's sandbox when the shim
// has none yet), creating it through task.Create where the agent says.
func (p *Pod) Create(ctx context.Context, id, bundle string, task Task) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	isSandbox := p.sandbox == ""
	sandboxBundle := p.sandboxBundle
	if isSandbox {
		sandboxBundle = bundle
		if p.checkSandbox != nil {
			if err := p.checkSandbox(id, bundle); err != nil {
				return err
			}
		}
	}
	create := func() error { return task.Create(sandboxBundle) }
	if !p.cfg.Pipeline.Enabled {
		// A benchmark baseline (pipeline.benchmark_baseline): nothing is
		// judged, nothing is asked.
		if err := create(); err != nil {
			return err
		}
	} else {
		reply, err := p.agent.Create(ctx, agentapi.CreateRequest{Caller: p.caller(), Sandbox: p.sandbox, ID: id, Bundle: bundle})
		if err := p.follow(ctx, id, reply, err, task, create); err != nil {
			return err
		}
	}
	if isSandbox {
		p.sandbox, p.sandboxBundle = id, bundle
	}
	return nil
}

// Update has the agent judge an update of container id's resources,
// applying it through update where the agent says.
func (p *Pod) Update(ctx context.Context, id string, resources *anypb.Any, update func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == "" {
		return fmt.Errorf("container %s: update: no sandbox in this shim yet", id)
	}
	if !p.cfg.Pipeline.Enabled {
		return update()
	}
	req := agentapi.UpdateRequest{Caller: p.caller(), Sandbox: p.sandbox, ID: id}
	if resources != nil {
		req.ResourcesType, req.Resources = resources.GetTypeUrl(), resources.GetValue()
	}
	reply, err := p.agent.Update(ctx, req)
	return p.follow(ctx, id, reply, err, Task{Update: update}, nil)
}

// Deleted tells the agent the task service deleted container id: when id
// is the sandbox, the agent releases everything the pod holds. An agent
// that cannot be told now releases it on its next GC pass, once the shim
// is gone.
func (p *Pod) Deleted(ctx context.Context, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == "" || !p.cfg.Pipeline.Enabled {
		return
	}
	if err := p.agent.Deleted(ctx, agentapi.DeletedRequest{Caller: p.caller(), Sandbox: p.sandbox, ID: id}); err != nil {
		log.G(ctx).WithError(err).Warnf("container %s: tell the agent it was deleted (its GC releases what the pod held once the shim is gone)", id)
	}
}

// Release asks the agent to release sandbox id of a shim that died, for
// containerd's `shim delete` (the shim manager's Stop).
func Release(ctx context.Context, cfg config.Config, runtime, id string) error {
	if !cfg.Pipeline.Enabled {
		return nil
	}
	c := agentapi.NewClient(cfg.Agent.Socket)
	defer c.Close()
	return c.Deleted(ctx, agentapi.DeletedRequest{Caller: agentapi.Caller{Runtime: runtime, PID: os.Getpid()}, Sandbox: id, ID: id})
}

// follow performs the acts the agent asks for until its final answer. An
// act's own error is returned as the task service gave it when the agent's
// answer is that error; an agent lost after the container was created has
// it deleted again: nothing runs that the agent did not see placed.
func (p *Pod) follow(ctx context.Context, id string, reply agentapi.Reply, err error, task Task, create func() error) error {
	var created bool
	var actErr error
	for {
		if err != nil {
			if created && task.Delete != nil {
				if derr := task.Delete(context.WithoutCancel(ctx), id); derr != nil {
					log.G(ctx).WithError(derr).Warnf("container %s: delete after losing the agent", id)
				}
			}
			return fmt.Errorf("container %s: bulkhead refused it: the node agent did not answer (fail closed; is bulkhead-agent running?): %w", id, err)
		}
		if reply.Act == "" {
			if reply.Error == "" {
				return nil
			}
			if actErr != nil && reply.Error == actErr.Error() {
				return actErr
			}
			return errors.New(reply.Error)
		}
		switch reply.Act {
		case agentapi.ActCreate:
			if create == nil {
				actErr = fmt.Errorf("agent asked to create container %s during an update", reply.ID)
			} else if actErr = create(); actErr == nil {
				created = true
			}
		case agentapi.ActUpdate:
			if task.Update == nil {
				actErr = fmt.Errorf("agent asked to update container %s during a create", reply.ID)
			} else {
				actErr = task.Update()
			}
		case agentapi.ActDelete:
			if task.Delete == nil {
				actErr = fmt.Errorf("agent asked to delete container %s, which this call cannot", reply.ID)
			} else if actErr = task.Delete(ctx, reply.ID); actErr == nil && reply.ID == id {
				created = false
			}
		default:
			actErr = fmt.Errorf("agent asked for %q, which this shim does not know", reply.Act)
		}
		msg := ""
		if actErr != nil {
			msg = actErr.Error()
		}
		reply, err = p.agent.Continue(ctx, agentapi.ContinueRequest{Op: reply.Op, Error: msg})
	}
}
