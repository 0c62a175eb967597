package gvisor

import (
	"context"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"
	"sync"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime"
)

// RegisterPodExtension installs Bulkhead's pod extension in gVisor's shim
// library. gVisor calls it once per pod, on the sandbox's Create. It also
// registers a shim plugin that, when the shim begins to serve, loads the
// configuration and begins opening the pipeline (runtime.OpenEarly), so
// that the sandbox's create, a few milliseconds later, finds it opening.
func RegisterPodExtension() {
	// What the plugin loaded when the shim began to serve, taken once by
	// the pod's extension; loaded is false when the file did not load.
	var early struct {
		once    sync.Once
		loaded  bool
		cfg     config.Config
		opening *runtime.Opening
	}
	registry.Register(&plugin.Registration{
		Type: plugins.InternalPlugin,
		ID:   "bulkhead-pipeline",
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			// A configuration that does not load is reported by the
			// sandbox's create, which loads it again.
			if cfg, err := config.Load(config.Path()); err == nil {
				early.loaded, early.cfg, early.opening = true, cfg, runtime.OpenEarly(cfg, policy.RuntimeGVisor)
			}
			return &early, nil
		},
	})
	extension.NewPodExtension = func(ctx context.Context, next extension.TaskServiceExt, req *task.CreateTaskRequest) (extension.TaskServiceExt, error) {
		var (
			loaded  bool
			cfg     config.Config
			opening *runtime.Opening
		)
		early.once.Do(func() { loaded, cfg, opening = early.loaded, early.cfg, early.opening })
		if !loaded {
			var err error
			if cfg, err = config.Load(config.Path()); err != nil {
				return nil, err
			}
		}
		warnOOMScore(ctx)
		return newPodExtension(cfg, next, opening)
	}
}

// PodExtension sits in front of gVisor's task service for one pod. It is
// the single place where the placement pipeline plugs in; all calls it does
// not override go straight to gVisor.
type PodExtension struct {
	extension.TaskServiceExt
	pod *runtime.Pod
}

// NewPodExtension returns the extension for one pod in front of next.
func NewPodExtension(cfg config.Config, next extension.TaskServiceExt) (*PodExtension, error) {
	return newPodExtension(cfg, next, nil)
}

func newPodExtension(cfg config.Config, next extension.TaskServiceExt, opening *runtime.Opening) (*PodExtension, error) {
	pod, err := runtime.NewPod(runtime.PodOptions{
		Config:  cfg,
		Runtime: policy.RuntimeGVisor,
		Opening: opening,
		DeleteTask: func(ctx context.Context, id string) error {
			_, err := next.Delete(ctx, &task.DeleteRequest{ID: id})
			return err
		},
		CheckSandbox: checkOptionsFile,
	})
	if err != nil {
		return nil, err
	}
	return &PodExtension{TaskServiceExt: next, pod: pod}, nil
}

// checkOptionsFile refuses a sandbox whose bundle lacks the options file the
// manager writes there when it starts the shim: every container of the pod
// points gVisor's task service at it.
func checkOptionsFile(sb *runtime.Sandbox) error {
	if _, err := os.Stat(optionsPath(sb.Bundle)); err != nil {
		return fmt.Errorf("sandbox %s: gVisor options missing (the manager writes them when it starts the shim): %w", sb.ID, err)
	}
	return nil
}

// Create places the pod (its sandbox) or judges the container, points gVisor
// at the options file in the sandbox's bundle, and lets gVisor create it.
func (p *PodExtension) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	return createWithOptions(ctx, p.pod, r, func() (*task.CreateTaskResponse, error) {
		return p.TaskServiceExt.Create(ctx, r)
	})
}

// CreateWithFSRestore is Create for a container restored from a snapshot.
func (p *PodExtension) CreateWithFSRestore(ctx context.Context, r *extension.CreateWithFSRestoreRequest) (*task.CreateTaskResponse, error) {
	return createWithOptions(ctx, p.pod, r.Create, func() (*task.CreateTaskResponse, error) {
		return p.TaskServiceExt.CreateWithFSRestore(ctx, r)
	})
}

// createWithOptions has pod create the container r describes: create, with
// r's options pointing at the sandbox's options file, is gVisor's own.
func createWithOptions(ctx context.Context, pod *runtime.Pod, r *task.CreateTaskRequest, create func() (*task.CreateTaskResponse, error)) (*task.CreateTaskResponse, error) {
	var resp *task.CreateTaskResponse
	err := pod.Create(ctx, r.ID, r.Bundle, func(sandboxBundle string) error {
		opts, err := containerOptions(optionsPath(sandboxBundle))
		if err != nil {
			return err
		}
		r.Options = opts
		resp, err = create()
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Update judges a change of a container's resources (CRI
// UpdateContainerResources: an in-place resize, crictl update) against the
// tier and the pod's charge, then lets gVisor apply it.
func (p *PodExtension) Update(ctx context.Context, r *task.UpdateTaskRequest) (*ptypes.Empty, error) {
	return p.pod.UpdateTask(ctx, r.ID, r.Resources, func() (*ptypes.Empty, error) { return p.TaskServiceExt.Update(ctx, r) })
}

// Delete deletes a container; deleting the sandbox container drops
// everything Bulkhead kept for the pod.
func (p *PodExtension) Delete(ctx context.Context, r *task.DeleteRequest) (*task.DeleteResponse, error) {
	resp, err := p.TaskServiceExt.Delete(ctx, r)
	if err != nil || r.ExecID != "" {
		return resp, err
	}
	p.pod.Deleted(ctx, r.ID)
	return resp, nil
}

// Shutdown asks gVisor's task service to exit. While containers remain it
// refuses with an error, and gVisor's redirector then answers containerd
// with a nil response that ttrpc cannot marshal. Returning an empty response
// alongside the error keeps the shim running and answers containerd
// properly (the redirector turns the error into success without exiting).
func (p *PodExtension) Shutdown(ctx context.Context, r *task.ShutdownRequest) (*ptypes.Empty, error) {
	resp, err := p.TaskServiceExt.Shutdown(ctx, r)
	if resp == nil {
		resp = &ptypes.Empty{}
	}
	return resp, err
}
