package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"

	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// RequestAnnotationPrefix marks pod annotations that are requests to
// Bulkhead (GPU profile, RDMA). They are never identity.
const RequestAnnotationPrefix = policy.RequestAnnotationPrefix

// DefaultHandler is the CRI runtime handler (RuntimeClass handler) that
// selects Bulkhead when containerd does not say which handler it used.
const DefaultHandler = "bulkhead"

// RegisterPodExtension installs Bulkhead's pod extension in gVisor's shim
// library. gVisor calls it once per pod, on the sandbox's Create.
func RegisterPodExtension() {
	extension.NewPodExtension = func(ctx context.Context, next extension.TaskServiceExt, req *task.CreateTaskRequest) (extension.TaskServiceExt, error) {
		cfg, err := LoadConfig(ConfigPath())
		if err != nil {
			return nil, err
		}
		WarnOOMScore(ctx)
		return NewPodExtension(cfg, next), nil
	}
}

// PodExtension sits in front of gVisor's task service for one pod. It is
// the single place where the placement pipeline plugs in; all calls it does
// not override go straight to gVisor.
type PodExtension struct {
	extension.TaskServiceExt
	*pod
}

// pod is one pod's side of the pipeline, whichever task service (gVisor's
// or runc's) runs its containers: it places the pod when its sandbox is
// created, judges every later container and releases everything when the
// sandbox is deleted.
type pod struct {
	cfg   Config
	state *StateDir
	// runtime is the runtime this shim runs (policy.RuntimeGVisor or
	// policy.RuntimeRunc); the policy's decision must name the same one.
	runtime string
	// deleteTask deletes a container from the task service (unwinding a
	// sandbox whose create failed after the task service made it).
	deleteTask func(ctx context.Context, id string) error

	// mu guards sandbox, options and admission.
	mu sync.Mutex
	// sandbox is the pod's record, nil until the sandbox container is created.
	sandbox *Sandbox
	// options point gVisor's task service at the options file the manager
	// wrote into the sandbox bundle; every container of the pod gets them.
	options *anypb.Any
	// pipeline places the pod; nil while the pipeline is disabled.
	pipeline *Pipeline
	// admission is what the pipeline admitted for the pod.
	admission *Admission
}

// NewPodExtension returns the extension for one pod in front of next.
func NewPodExtension(cfg Config, next extension.TaskServiceExt) *PodExtension {
	p := &PodExtension{TaskServiceExt: next}
	p.pod = newPod(cfg, policy.RuntimeGVisor, func(ctx context.Context, id string) error {
		_, err := next.Delete(ctx, &task.DeleteRequest{ID: id})
		return err
	})
	return p
}

func newPod(cfg Config, runtime string, deleteTask func(context.Context, string) error) *pod {
	return &pod{cfg: cfg, state: NewStateDir(cfg.StateDir), runtime: runtime, deleteTask: deleteTask}
}

// Create records the sandbox (before anything is created, so a crash leaves
// a trace for GC), points gVisor at Bulkhead's runsc options, and creates
// the container.
func (p *PodExtension) Create(ctx context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	return createTask(ctx, p.pod, r.ID, r.Bundle, func() (*task.CreateTaskResponse, error) {
		r.Options = p.options
		return p.TaskServiceExt.Create(ctx, r)
	})
}

// CreateWithFSRestore is Create for a container restored from a snapshot.
func (p *PodExtension) CreateWithFSRestore(ctx context.Context, r *extension.CreateWithFSRestoreRequest) (*task.CreateTaskResponse, error) {
	return createTask(ctx, p.pod, r.Create.ID, r.Create.Bundle, func() (*task.CreateTaskResponse, error) {
		r.Create.Options = p.options
		return p.TaskServiceExt.CreateWithFSRestore(ctx, r)
	})
}

// createTask places the pod (for its sandbox) or judges the container (for
// any other), then lets the task service create it with next.
func createTask[R any](ctx context.Context, p *pod, id, bundle string, next func() (R, error)) (R, error) {
	var zero R
	spec, err := readSpec(bundle)
	if err != nil {
		return zero, fmt.Errorf("container %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	// Outside the CRI (no container-type annotation) the first container
	// of the shim is its sandbox.
	ctype := spec.Annotations[AnnotationContainerType]
	isSandbox := ctype == containerTypeSandbox || (ctype == "" && p.sandbox == nil)
	if !isSandbox && p.sandbox == nil {
		return zero, fmt.Errorf("container %s: no sandbox in this shim yet", id)
	}
	var resp R
	step := func() error {
		var err error
		resp, err = next()
		return err
	}
	switch {
	case !isSandbox:
		err = p.createContainer(ctx, id, bundle, spec, step)
	case p.sandbox != nil:
		err = fmt.Errorf("container %s: pod already has sandbox %s", id, p.sandbox.ID)
	default:
		err = p.createSandbox(ctx, id, bundle, spec, step)
	}
	if err != nil {
		return zero, err
	}
	return resp, nil
}

// createContainer creates a workload container in the pod's sandbox.
func (p *pod) createContainer(ctx context.Context, id, bundle string, spec *specs.Spec, next func() error) error {
	if p.pipeline != nil {
		// The policy judges every container as containerd wrote it: what
		// the webhook saw may not be what runs.
		if err := p.pipeline.AdmitContainer(ctx, p.sandbox, p.admission, id, spec); err != nil {
			log.G(ctx).WithError(err).Warnf("container %s: refused", id)
			return err
		}
		read, err := encodeSpec(spec)
		if err != nil {
			return err
		}
		// Every container loses RDMA devices its tenant was not granted,
		// and gets the pod's GPU.
		if err := rdma.SpecOpt(p.pipeline.RDMAGrant(p.admission, p.sandbox))(spec); err != nil {
			return fmt.Errorf("container %s: %w", id, err)
		}
		if err := p.pipeline.InjectGPU(p.admission.Reservation, spec); err != nil {
			return fmt.Errorf("container %s: %w", id, err)
		}
		if err := writeSpecIfChanged(bundle, read, spec); err != nil {
			return err
		}
	}
	if err := next(); err != nil {
		return err
	}
	p.sandbox.Containers = append(p.sandbox.Containers, id)
	p.saveRecord(ctx)
	return nil
}

// saveRecord rewrites the pod's record; a failure only costs GC precision.
func (p *pod) saveRecord(ctx context.Context) {
	if err := p.state.Save(p.sandbox); err != nil {
		log.G(ctx).WithError(err).Warnf("sandbox %s: update record", p.sandbox.ID)
	}
}

// createSandbox places the pod around its sandbox's creation
// (Pipeline.Place: decide, reserve, gpu, sandbox, fence, activate). Any
// failure unwinds every step already taken, in reverse; the record goes last.
func (p *pod) createSandbox(ctx context.Context, id, bundle string, spec *specs.Spec, next func() error) (retErr error) {
	began := time.Now()
	ctx, trace := withStartTrace(ctx)
	sb := SandboxFromSpec(id, bundle, spec)
	if spec.Annotations[AnnotationRuntimeHandler] == "" && p.runtime == policy.RuntimeRunc {
		sb.Handler = RuncHandler
	}
	sb.ShimPID = os.Getpid()
	// The record exists before anything else does, so GC can find a crash.
	if err := p.state.Save(sb); err != nil {
		return err
	}
	defer func() {
		if retErr == nil {
			return
		}
		if err := p.state.Remove(sb.ID); err != nil {
			log.G(ctx).WithError(err).Warnf("sandbox %s: remove record after failed create", sb.ID)
		}
		p.sandbox, p.options, p.admission = nil, nil, nil
		log.G(ctx).WithError(retErr).Warnf("sandbox %s: refused after %v (%s)", sb.ID, time.Since(began).Round(time.Millisecond), trace)
	}()

	if p.runtime == policy.RuntimeGVisor {
		optionsFile := filepath.Join(sb.Bundle, gvisorOptionsFile)
		if _, err := os.Stat(optionsFile); err != nil {
			return fmt.Errorf("sandbox %s: gVisor options missing (the manager writes them when it starts the shim): %w", sb.ID, err)
		}
		options, err := containerOptions(optionsFile)
		if err != nil {
			return err
		}
		p.options = options
	}
	p.sandbox = sb
	if !p.cfg.Pipeline.Enabled {
		if err := next(); err != nil {
			return err
		}
	} else {
		if p.pipeline == nil {
			var err error
			if p.pipeline, err = OpenPipeline(ctx, p.cfg, p.runtime); err != nil {
				return fmt.Errorf("sandbox %s: %w", sb.ID, err)
			}
			// Repair whatever crashed shims left before placing this pod.
			t := time.Now()
			if _, err := p.pipeline.GC(ctx, p.state); err != nil {
				log.G(ctx).WithError(err).Warn("gc at shim start")
			}
			traceStage(ctx, "gc", t)
		}
		a, err := p.pipeline.Place(ctx, sb, spec, SandboxTask{
			Create: func(context.Context) error { return next() },
			Delete: func(ctx context.Context) error { return p.deleteTask(ctx, id) },
		})
		if err != nil {
			return err
		}
		p.admission = a
		sb.Tenant = a.Reservation.Tenant
	}
	sb.Phase = PhaseCreated
	p.saveRecord(ctx)
	log.G(ctx).Infof("sandbox %s: pod %s/%s handler %s runtime %s tenant %q: created in %v, %v after the shim started (%s)", sb.ID, sb.Namespace, sb.Name, sb.Handler, p.runtime, sb.Tenant,
		time.Since(began).Round(time.Millisecond), time.Since(shimStarted).Round(time.Millisecond), trace)
	return nil
}

// Delete deletes a container; deleting the sandbox container drops
// everything Bulkhead kept for the pod.
func (p *PodExtension) Delete(ctx context.Context, r *task.DeleteRequest) (*task.DeleteResponse, error) {
	resp, err := p.TaskServiceExt.Delete(ctx, r)
	if err != nil || r.ExecID != "" {
		return resp, err
	}
	p.deleted(ctx, r.ID)
	return resp, nil
}

// deleted drops what Bulkhead kept for container id once the task service
// deleted it: everything the pod holds when id is its sandbox.
func (p *pod) deleted(ctx context.Context, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == nil {
		return
	}
	if id == p.sandbox.ID {
		if p.pipeline != nil {
			if rerr := p.pipeline.Release(ctx, p.sandbox.ID); rerr != nil {
				// The record stays for GC to retry.
				log.G(ctx).WithError(rerr).Warnf("sandbox %s: release", p.sandbox.ID)
				return
			}
		}
		if rerr := p.state.Remove(p.sandbox.ID); rerr != nil {
			log.G(ctx).WithError(rerr).Warnf("sandbox %s: remove record", p.sandbox.ID)
		}
		log.G(ctx).Infof("sandbox %s: deleted", p.sandbox.ID)
		return
	}
	p.sandbox.Containers = slices.DeleteFunc(p.sandbox.Containers, func(c string) bool { return c == id })
	p.saveRecord(ctx)
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

// SandboxFromSpec builds the record of a sandbox from its OCI spec: the
// pod's identity comes from the CRI annotations containerd sets, never from
// the pod's own annotations.
func SandboxFromSpec(id, bundle string, spec *specs.Spec) *Sandbox {
	ann := spec.Annotations
	sb := &Sandbox{
		ID:        id,
		Namespace: ann[AnnotationSandboxNamespace],
		Name:      ann[AnnotationSandboxName],
		UID:       ann[AnnotationSandboxUID],
		Handler:   ann[AnnotationRuntimeHandler],
		Bundle:    bundle,
		Phase:     PhaseCreating,
		CreatedAt: time.Now().UTC(),
	}
	if sb.Handler == "" {
		sb.Handler = DefaultHandler
	}
	for k, v := range ann {
		if strings.HasPrefix(k, RequestAnnotationPrefix) {
			if sb.Annotations == nil {
				sb.Annotations = map[string]string{}
			}
			sb.Annotations[k] = v
		}
	}
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				sb.NetNS = ns.Path
			}
		}
	}
	return sb
}

// encodeSpec is the spec as Bulkhead would write it, to compare before and
// after a change.
func encodeSpec(spec *specs.Spec) ([]byte, error) { return json.Marshal(spec) }

// writeSpecIfChanged rewrites the bundle's config.json when spec no longer
// encodes to read: a rewrite goes through our copy of the spec types and
// must not happen for nothing.
func writeSpecIfChanged(bundle string, read []byte, spec *specs.Spec) error {
	now, err := encodeSpec(spec)
	if err != nil {
		return err
	}
	if bytes.Equal(read, now) {
		return nil
	}
	return writeFileAtomic(filepath.Join(bundle, "config.json"), now, 0o644)
}

func readSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode OCI spec: %w", err)
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	return &spec, nil
}
