// Package runc is the runc tier's adapter: containerd's own runc task
// service (containerd-shim-runc-v2's) with a thin Bulkhead pod in front of
// it, for the tiers the policy lets run on the host kernel. It lives apart
// from runtime/gvisor so that neither shim links the other's runtime, and
// from the node agent so that the shim links no policy, fence or GPU code.
package runc

import (
	"context"
	"fmt"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runctask "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	containerdshim "github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/shim"
)

// RuntimeType selects containerd-shim-bulkhead-runc-v1.
const RuntimeType = "io.containerd.bulkhead-runc.v1"

// RegisterTaskService registers, as the shim's TTRPC task service,
// containerd's runc task service with Bulkhead's pipeline in front of it.
// The shim's main must not also import containerd's runc task plugin.
func RegisterTaskService() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			cfg, err := config.Load(config.Path())
			if err != nil {
				return nil, err
			}
			next, err := runctask.NewTaskService(ic.Context, pp.(containerdshim.Publisher), ss.(shutdown.Service))
			if err != nil {
				return nil, fmt.Errorf("runc task service: %w", err)
			}
			return NewTask(cfg, next)
		},
	})
}

// Task is containerd's runc task service for one pod with Bulkhead's pod in
// front of it; calls it does not override go straight to runc's.
type Task struct {
	taskAPI.TTRPCTaskService
	cfg config.Config
	pod *shim.Pod
}

// NewTask returns the pod's task service in front of next.
func NewTask(cfg config.Config, next taskAPI.TTRPCTaskService) (*Task, error) {
	pod, err := shim.NewPod(shim.Options{Config: cfg, Runtime: agentapi.RuntimeRunc})
	if err != nil {
		return nil, err
	}
	return &Task{TTRPCTaskService: next, cfg: cfg, pod: pod}, nil
}

// deleteTask deletes container id from runc's task service.
func (t *Task) deleteTask(ctx context.Context, id string) error {
	_, err := t.TTRPCTaskService.Delete(ctx, &taskAPI.DeleteRequest{ID: id})
	return err
}

// RegisterTTRPC serves the task API through the pipeline.
func (t *Task) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, t)
	return nil
}

// Create places the pod (its sandbox) or judges the container, then lets
// runc create it.
func (t *Task) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	// containerd's CRI sends a runtime type other than runc.v2 generic
	// options that runc's task service cannot read: the runc tier is
	// configured from Bulkhead's own file instead.
	opts, err := typeurl.MarshalAnyToProto(&runcoptions.Options{BinaryName: t.cfg.RuncPath, Root: t.cfg.RuncRoot})
	if err != nil {
		return nil, err
	}
	r.Options = opts
	var resp *taskAPI.CreateTaskResponse
	err = t.pod.Create(ctx, r.ID, r.Bundle, shim.Task{
		Create: func(string) error {
			var err error
			resp, err = t.TTRPCTaskService.Create(ctx, r)
			return err
		},
		Delete: t.deleteTask,
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Update judges a change of a container's resources (CRI
// UpdateContainerResources: an in-place resize, crictl update) against the
// tier and the pod's charge, then lets runc apply it.
func (t *Task) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	var resp *ptypes.Empty
	err := t.pod.Update(ctx, r.ID, r.Resources, func() error {
		var err error
		resp, err = t.TTRPCTaskService.Update(ctx, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Delete deletes a container; deleting the sandbox container releases
// everything the pod holds.
func (t *Task) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	resp, err := t.TTRPCTaskService.Delete(ctx, r)
	if err != nil || r.ExecID != "" {
		return resp, err
	}
	t.pod.Deleted(ctx, r.ID)
	return resp, nil
}
