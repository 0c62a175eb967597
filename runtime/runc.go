package runtime

import (
	"context"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runctask "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/containerd/ttrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// The runc tier: pods whose tier may run on the host kernel (trusted, by
// default) use this handler. containerd's own runc task service runs them;
// Bulkhead's pipeline sits in front of it exactly as it does for gVisor.
const (
	// RuncRuntimeType selects containerd-shim-bulkhead-runc-v1.
	RuncRuntimeType = "io.containerd.bulkhead-runc.v1"
	// RuncHandler is the CRI runtime handler (RuntimeClass handler) of the
	// runc tier.
	RuncHandler = "bulkhead-runc"
)

// RegisterRuncTaskService registers, as the shim's TTRPC task service,
// containerd's runc task service with Bulkhead's pipeline in front of it.
// The shim's main must not also import containerd's runc task plugin.
func RegisterRuncTaskService() {
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
			next, err := runctask.NewTaskService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service))
			if err != nil {
				return nil, fmt.Errorf("runc task service: %w", err)
			}
			return NewRuncTask(cfg, next, OpenEarly(cfg, policy.RuntimeRunc))
		},
	})
}

// RuncTask is containerd's runc task service for one pod with the
// placement pipeline in front of it; calls it does not override go
// straight to runc's.
type RuncTask struct {
	taskAPI.TTRPCTaskService
	cfg config.Config
	pod *Pod
}

// NewRuncTask returns the pod's task service in front of next; opening is
// the pipeline OpenEarly began opening, or nil.
func NewRuncTask(cfg config.Config, next taskAPI.TTRPCTaskService, opening *Opening) (*RuncTask, error) {
	pod, err := NewPod(PodOptions{
		Config:  cfg,
		Runtime: policy.RuntimeRunc,
		Opening: opening,
		DeleteTask: func(ctx context.Context, id string) error {
			_, err := next.Delete(ctx, &taskAPI.DeleteRequest{ID: id})
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	return &RuncTask{TTRPCTaskService: next, cfg: cfg, pod: pod}, nil
}

// RegisterTTRPC serves the task API through the pipeline.
func (t *RuncTask) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTTRPCTaskService(server, t)
	return nil
}

// Create places the pod (its sandbox) or judges the container, then lets
// runc create it.
func (t *RuncTask) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	// containerd's CRI sends a runtime type other than runc.v2 generic
	// options that runc's task service cannot read: the runc tier is
	// configured from Bulkhead's own file instead.
	opts, err := typeurl.MarshalAnyToProto(&runcoptions.Options{BinaryName: t.cfg.RuncPath, Root: t.cfg.RuncRoot})
	if err != nil {
		return nil, err
	}
	r.Options = opts
	var resp *taskAPI.CreateTaskResponse
	err = t.pod.Create(ctx, r.ID, r.Bundle, func(string) error {
		var err error
		resp, err = t.TTRPCTaskService.Create(ctx, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// Update judges a change of a container's resources (CRI
// UpdateContainerResources: an in-place resize, crictl update) against the
// tier and the pod's charge, then lets runc apply it.
func (t *RuncTask) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	return t.pod.UpdateTask(ctx, r.ID, r.Resources, func() (*ptypes.Empty, error) { return t.TTRPCTaskService.Update(ctx, r) })
}

// Delete deletes a container; deleting the sandbox container releases
// everything the pod holds.
func (t *RuncTask) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	resp, err := t.TTRPCTaskService.Delete(ctx, r)
	if err != nil || r.ExecID != "" {
		return resp, err
	}
	t.pod.Deleted(ctx, r.ID)
	return resp, nil
}
