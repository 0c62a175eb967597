package gvisor

import (
	"context"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/shim"
)

// RegisterPodExtension installs Bulkhead's pod extension in gVisor's shim
// library. gVisor calls it once per pod, on the sandbox's Create.
func RegisterPodExtension() {
	extension.NewPodExtension = func(ctx context.Context, next extension.TaskServiceExt, req *task.CreateTaskRequest) (extension.TaskServiceExt, error) {
		cfg, err := config.Load(config.Path())
		if err != nil {
			return nil, err
		}
		warnOOMScore(ctx)
		return NewPodExtension(cfg, next)
	}
}

// PodExtension sits in front of gVisor's task service for one pod. It is
// the single place where the node agent plugs in; all calls it does not
// override go straight to gVisor.
type PodExtension struct {
	extension.TaskServiceExt
	pod *shim.Pod
}

// NewPodExtension returns the extension for one pod in front of next.
func NewPodExtension(cfg config.Config, next extension.TaskServiceExt) (*PodExtension, error) {
	pod, err := shim.NewPod(shim.Options{
		Config:       cfg,
		Runtime:      agentapi.RuntimeGVisor,
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
func checkOptionsFile(id, bundle string) error {
	if _, err := os.Stat(optionsPath(bundle)); err != nil {
		return fmt.Errorf("sandbox %s: gVisor options missing (the manager writes them when it starts the shim): %w", id, err)
	}
	return nil
}

// Create places the pod (its sandbox) or judges the container, points gVisor
// at the options file in the sandbox's bundle, and lets gVisor create it.
func (p *PodExtension) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	return p.createWithOptions(ctx, r, func() (*task.CreateTaskResponse, error) {
		return p.TaskServiceExt.Create(ctx, r)
	})
}

// CreateWithFSRestore is Create for a container restored from a snapshot.
func (p *PodExtension) CreateWithFSRestore(ctx context.Context, r *extension.CreateWithFSRestoreRequest) (*task.CreateTaskResponse, error) {
	return p.createWithOptions(ctx, r.Create, func() (*task.CreateTaskResponse, error) {
		return p.TaskServiceExt.CreateWithFSRestore(ctx, r)
	})
}

// createWithOptions has the pod create the container r describes: create,
// with r's options pointing at the sandbox's options file, is gVisor's own.
func (p *PodExtension) createWithOptions(ctx context.Context, r *task.CreateTaskRequest, create func() (*task.CreateTaskResponse, error)) (*task.CreateTaskResponse, error) {
	var resp *task.CreateTaskResponse
	err := p.pod.Create(ctx, r.ID, r.Bundle, shim.Task{
		Create: func(sandboxBundle string) error {
			opts, err := containerOptions(optionsPath(sandboxBundle))
			if err != nil {
				return err
			}
			r.Options = opts
			resp, err = create()
			return err
		},
		Delete: p.deleteTask,
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
	var resp *ptypes.Empty
	err := p.pod.Update(ctx, r.ID, r.Resources, func() error {
		var err error
		resp, err = p.TaskServiceExt.Update(ctx, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// deleteTask deletes container id from gVisor's task service.
func (p *PodExtension) deleteTask(ctx context.Context, id string) error {
	_, err := p.TaskServiceExt.Delete(ctx, &task.DeleteRequest{ID: id})
	return err
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
