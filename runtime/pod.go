package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	ptypes "github.com/containerd/containerd/v2/pkg/protobuf/types"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput"
)

// RequestAnnotationPrefix marks pod annotations that are requests to
// Bulkhead (GPU profile, RDMA). They are never identity.
const RequestAnnotationPrefix = policy.RequestAnnotationPrefix

// DefaultHandler is the CRI runtime handler (RuntimeClass handler) that
// selects Bulkhead when containerd does not say which handler it used.
const DefaultHandler = "bulkhead"

// PodOptions say which shim a Pod serves and what its task service needs.
type PodOptions struct {
	// Config is the node's configuration.
	Config config.Config
	// Runtime is the runtime the shim runs, policy.RuntimeGVisor or
	// policy.RuntimeRunc; the policy's decision must name the same one.
	Runtime string
	// ShimPID is the pid of the shim that serves the pod: while it runs,
	// GC leaves the pod alone.
	ShimPID int
	// DeleteTask deletes a container from the task service: it unwinds a
	// sandbox whose create failed after the task service made it.
	DeleteTask func(ctx context.Context, id string) error
	// CheckSandbox, if set, runs on the sandbox's create once its record is
	// written and before the policy is asked: an error refuses the pod and
	// leaves nothing of it behind.
	CheckSandbox func(sb *node.Sandbox) error
	// Pipeline places the pod: the node agent's, shared by every pod of
	// the node. nil runs pods unjudged (pipeline.enabled = false, a
	// benchmark baseline).
	Pipeline *Pipeline
	// Observe, if set, hears of every sandbox create once it returns: the
	// time each stage took, the whole create's, and its error.
	Observe func(runtime string, stages []Stage, took time.Duration, err error)
}

// Pod is one pod's side of the pipeline, whichever task service (gVisor's
// or runc's) runs its containers: it places the pod when its sandbox is
// created, judges every later container and releases everything when the
// sandbox is deleted. The node agent keeps one per pod and drives it for
// the pod's shim: the shim's task service acts where Create, Update and
// the unwinding of a failed placement call back.
type Pod struct {
	cfg   config.Config
	state *node.StateDir
	// runtime is the runtime this shim runs (policy.RuntimeGVisor or
	// policy.RuntimeRunc); the policy's decision must name the same one.
	runtime string
	// shimPID is PodOptions.ShimPID.
	shimPID int
	// deleteTask deletes a container from the task service (unwinding a
	// sandbox whose create failed after the task service made it).
	deleteTask func(ctx context.Context, id string) error
	// checkSandbox is PodOptions.CheckSandbox.
	checkSandbox func(sb *node.Sandbox) error
	// pipeline places the pod; nil while the pipeline is disabled.
	pipeline *Pipeline
	// observe is PodOptions.Observe.
	observe func(runtime string, stages []Stage, took time.Duration, err error)

	// mu guards sandbox and admission, and is held while the task service
	// creates a container.
	mu sync.Mutex
	// sandbox is the pod's record, nil until the sandbox container is created.
	sandbox *node.Sandbox
	// admission is what the pipeline admitted for the pod.
	admission *Admission
}

// NewPod returns the pod a shim serves in front of its task service.
func NewPod(opts PodOptions) (*Pod, error) {
	if opts.Runtime != policy.RuntimeGVisor && opts.Runtime != policy.RuntimeRunc {
		return nil, fmt.Errorf("pod: runtime %q: want %q or %q", opts.Runtime, policy.RuntimeGVisor, policy.RuntimeRunc)
	}
	if opts.DeleteTask == nil {
		return nil, fmt.Errorf("pod: runtime %s: DeleteTask is nil", opts.Runtime)
	}
	if opts.Config.Pipeline.Enabled && opts.Pipeline == nil {
		return nil, fmt.Errorf("pod: runtime %s: pipeline.enabled is true and no pipeline was given", opts.Runtime)
	}
	shimPID := opts.ShimPID
	if shimPID == 0 {
		shimPID = os.Getpid()
	}
	return &Pod{
		cfg:          opts.Config,
		state:        node.NewStateDir(opts.Config),
		runtime:      opts.Runtime,
		shimPID:      shimPID,
		deleteTask:   opts.DeleteTask,
		checkSandbox: opts.CheckSandbox,
		pipeline:     opts.Pipeline,
		observe:      opts.Observe,
	}, nil
}

// ResumePod returns the pod of sandbox id as its record and the ledger
// keep it: a node agent that restarted while the pod ran serves its later
// containers, updates and delete as the one that admitted it would.
// opts.Runtime and opts.ShimPID are the calling shim's.
//
// The record lies in state_dir, which others than the agent may write; the
// pod's later containers are judged by what it says (its namespace, UID,
// decision and input). So it must authenticate (node.StateDir.Load) and
// agree with the ledger's reservation on who the pod is
// (Sandbox.CheckReservation), or the pod is refused, naming the sandbox and
// the rule: its containers can then be neither created nor updated, and its
// delete (or GC, once it is dead) still releases what the ledger says it
// holds. A record of a release that sealed none (resumeUnsealed) is taken
// only for a reservation of that release.
func ResumePod(opts PodOptions, id string) (*Pod, error) {
	p, err := NewPod(opts)
	if err != nil {
		return nil, err
	}
	sb, err := p.state.Load(id)
	unsealed := errors.Is(err, node.ErrRecordUnsealed)
	if unsealed && p.pipeline == nil {
		// Nothing is judged with the pipeline off: the record decides
		// nothing, and the next save seals it.
		sb, err = p.state.LoadUnauthenticated(id)
	} else if unsealed {
		sb, err = p.resumeUnsealed(id)
	}
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	if sb.Phase != node.PhaseCreated {
		return nil, fmt.Errorf("sandbox %s: resume: its create never finished (phase %s)", id, sb.Phase)
	}
	if sb.Runtime != opts.Runtime {
		return nil, fmt.Errorf("sandbox %s: resume: admitted for runtime %s, called by a %s shim", id, sb.Runtime, opts.Runtime)
	}
	if sb.Limits == nil {
		sb.Limits = map[string]node.ContainerLimits{}
	}
	p.sandbox = sb
	if p.pipeline == nil {
		return p, nil
	}
	res, err := p.reservation(id)
	if err != nil {
		return nil, err
	}
	if res == nil || sb.Decision == nil || sb.Input == nil {
		return nil, fmt.Errorf("sandbox %s: resume: no admission on record (reservation %t, decision %t, input %t): the pod was admitted by a release that kept none", id, res != nil, sb.Decision != nil, sb.Input != nil)
	}
	if err := sb.CheckReservation(res); err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	p.admission = &Admission{Decision: *sb.Decision, Reservation: res, Input: *sb.Input}
	return p, nil
}

// reservation is sandbox id's reservation in the ledger; nil if none.
func (p *Pod) reservation(id string) (*node.Reservation, error) {
	var res *node.Reservation
	err := p.pipeline.node.Ledger().View(func(tx *node.LedgerTx) error {
		var err error
		res, err = tx.Get(id)
		return err
	})
	return res, err
}

// resumeUnsealed returns the record of sandbox id that carries no MAC,
// written by the release this one upgrades, once it is sealed. Only a
// reservation made by such a release (no SealedRecord) vouches for one: a
// record this release sealed and someone stripped is refused. Its identity
// must agree with the reservation (checked here, before it is sealed, and
// again by ResumePod); then it is sealed, and the reservation says so, so
// that from now on it authenticates like any other. What the ledger cannot
// vouch for (the decision's grants, the input's requests) is taken as the
// record says: a record edited before the upgrade misled the previous
// release in the same way.
func (p *Pod) resumeUnsealed(id string) (*node.Sandbox, error) {
	res, err := p.reservation(id)
	if err != nil {
		return nil, err
	}
	switch {
	case res == nil:
		return nil, fmt.Errorf("sandbox %s: record: [%s] %w, and the ledger holds no reservation to check it against", id, node.RuleRecordAuthentic, node.ErrRecordUnsealed)
	case res.SealedRecord:
		return nil, fmt.Errorf("sandbox %s: record: [%s] %w, but its reservation was made by a release that seals every record: refused", id, node.RuleRecordAuthentic, node.ErrRecordUnsealed)
	}
	sb, err := p.state.LoadUnauthenticated(id)
	if err != nil {
		return nil, err
	}
	if sb.ID != id {
		return nil, fmt.Errorf("sandbox %s: record: [%s] it is sandbox %q's", id, node.RuleRecordLedger, sb.ID)
	}
	if err := sb.CheckReservation(res); err != nil {
		return nil, err
	}
	if err := p.state.Save(sb); err != nil {
		return nil, err
	}
	if err := p.pipeline.node.Ledger().Update(func(tx *node.LedgerTx) error {
		r, err := tx.Get(id)
		if err != nil || r == nil {
			return err
		}
		r.SealedRecord = true
		return tx.Put(r)
	}); err != nil {
		return nil, fmt.Errorf("sandbox %s: record sealed, reservation not marked: %w", id, err)
	}
	return sb, nil
}

// SandboxID is the id of the pod's sandbox; "" until one was created.
func (p *Pod) SandboxID() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == nil {
		return ""
	}
	return p.sandbox.ID
}

// Create places the pod (when container id is its sandbox) or judges the
// container (any other), then calls create to let the task service create
// it; bundle is the container's OCI bundle. create gets the bundle of the
// pod's sandbox, and runs with the pod locked: it must not call the Pod.
// The sandbox is recorded before anything is created, so a crash leaves a
// trace for GC; a failure at any step unwinds what was done.
func (p *Pod) Create(ctx context.Context, id, bundle string, create func(sandboxBundle string) error) error {
	spec, err := readSpec(bundle)
	if err != nil {
		return fmt.Errorf("container %s: %w", id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()

	// Outside the CRI (no container-type annotation) the first container
	// of the shim is its sandbox.
	ctype := spec.Annotations[cri.AnnotationContainerType]
	isSandbox := ctype == cri.ContainerTypeSandbox || (ctype == "" && p.sandbox == nil)
	if !isSandbox && p.sandbox == nil {
		return fmt.Errorf("container %s: no sandbox in this shim yet", id)
	}
	step := func() error { return create(p.sandbox.Bundle) }
	switch {
	case !isSandbox:
		return p.createContainer(ctx, id, bundle, spec, step)
	case p.sandbox != nil:
		return fmt.Errorf("container %s: pod already has sandbox %s", id, p.sandbox.ID)
	default:
		return p.createSandbox(ctx, id, bundle, spec, step)
	}
}

// createContainer creates a workload container in the pod's sandbox.
func (p *Pod) createContainer(ctx context.Context, id, bundle string, spec *specs.Spec, next func() error) error {
	limits := containerLimits(id, spec)
	create := next
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
		// A memory limit past what the pod is charged (an update made
		// before the container started, a pod admitted without its
		// total) is charged before the container is created.
		charge := chargeAfter(p.admission.Reservation.MemoryBytes, p.sandbox.Limits, id, limits.MemoryBytes)
		if charge > p.admission.Reservation.MemoryBytes {
			ch := ResourceChange{Container: id, Name: limits.Name, MemoryBytes: limits.MemoryBytes, Charge: charge}
			create = func() error { return p.pipeline.Recharge(ctx, p.sandbox, p.admission, ch, next) }
		}
	}
	if err := create(); err != nil {
		return err
	}
	p.sandbox.Containers = append(p.sandbox.Containers, id)
	p.sandbox.Limits[id] = limits
	p.saveRecord(ctx)
	return nil
}

// containerLimits is what the pod's record keeps of container id's
// resources, from its OCI spec.
func containerLimits(id string, spec *specs.Spec) node.ContainerLimits {
	return node.ContainerLimits{Name: specinput.ContainerName(id, spec), MemoryBytes: specinput.MemoryLimit(spec)}
}

// saveRecord rewrites the pod's record; a failure only costs GC precision.
func (p *Pod) saveRecord(ctx context.Context) {
	if err := p.state.Save(p.sandbox); err != nil {
		log.G(ctx).WithError(err).Warnf("sandbox %s: update record", p.sandbox.ID)
	}
}

// createSandbox places the pod around its sandbox's creation
// (Pipeline.Place: decide, reserve, gpu, sandbox, fence, activate). Any
// failure unwinds every step already taken, in reverse; the record goes last.
func (p *Pod) createSandbox(ctx context.Context, id, bundle string, spec *specs.Spec, next func() error) (retErr error) {
	began := time.Now()
	ctx, trace := starttrace.New(ctx)
	sb := SandboxFromSpec(id, bundle, spec)
	if spec.Annotations[cri.AnnotationRuntimeHandler] == "" && p.runtime == policy.RuntimeRunc {
		sb.Handler = RuncHandler
	}
	sb.ShimPID, sb.Runtime = p.shimPID, p.runtime
	sb.Limits = map[string]node.ContainerLimits{id: containerLimits(id, spec)}
	// The record exists before anything else does, so GC can find a crash.
	if err := p.state.Save(sb); err != nil {
		return err
	}
	defer func() {
		if p.observe != nil {
			p.observe(p.runtime, trace.Stages(), time.Since(began), retErr)
		}
		if retErr == nil {
			return
		}
		if err := p.state.Remove(sb.ID); err != nil {
			log.G(ctx).WithError(err).Warnf("sandbox %s: remove record after failed create", sb.ID)
		}
		p.sandbox, p.admission = nil, nil
		log.G(ctx).WithError(retErr).Warnf("sandbox %s: refused after %v (%s)", sb.ID, time.Since(began).Round(time.Millisecond), trace)
	}()

	if p.checkSandbox != nil {
		if err := p.checkSandbox(sb); err != nil {
			return err
		}
	}
	p.sandbox = sb
	if p.pipeline == nil {
		if err := next(); err != nil {
			return err
		}
	} else {
		a, err := p.pipeline.Place(ctx, sb, spec, SandboxTask{
			Create: func(context.Context) error { return next() },
			Delete: func(ctx context.Context) error { return p.deleteTask(ctx, id) },
		})
		if err != nil {
			return err
		}
		p.admission = a
		sb.Tenant = a.Reservation.Tenant
		sb.Decision, sb.Input = &a.Decision, &a.Input
	}
	sb.Phase = node.PhaseCreated
	p.saveRecord(ctx)
	revision := "-"
	if sb.Decision != nil && sb.Decision.Revision != "" {
		revision = sb.Decision.Revision
	}
	log.G(ctx).Infof("sandbox %s: pod %s/%s handler %s runtime %s tenant %q bundle revision %s: created in %v (%s)", sb.ID, sb.Namespace, sb.Name, sb.Handler, p.runtime, sb.Tenant, revision,
		time.Since(began).Round(time.Millisecond), trace)
	return nil
}

// Deleted drops what Bulkhead kept for container id once the task service
// deleted it: everything the pod holds when id is its sandbox. A release
// that fails keeps the sandbox's record for GC to retry.
func (p *Pod) Deleted(ctx context.Context, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == nil {
		return
	}
	if id == p.sandbox.ID {
		if p.pipeline != nil {
			if rerr := p.pipeline.node.Release(ctx, p.sandbox.ID); rerr != nil {
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
	delete(p.sandbox.Limits, id)
	p.saveRecord(ctx)
}

// SandboxFromSpec builds the record of a sandbox from its OCI spec: the
// pod's identity comes from the CRI annotations containerd sets, never from
// the pod's own annotations.
func SandboxFromSpec(id, bundle string, spec *specs.Spec) *node.Sandbox {
	ann := spec.Annotations
	sb := &node.Sandbox{
		ID:        id,
		Namespace: ann[cri.AnnotationSandboxNamespace],
		Name:      ann[cri.AnnotationSandboxName],
		UID:       ann[cri.AnnotationSandboxUID],
		Handler:   ann[cri.AnnotationRuntimeHandler],
		Bundle:    bundle,
		Phase:     node.PhaseCreating,
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

// RuleResourcesInvalid refuses a task update whose resources are not the
// OCI linux.resources the runtimes read: nothing can be judged, so nothing
// is changed.
const RuleResourcesInvalid = "input.resources"

// Update judges an update of container id's resources (a task Update),
// then calls update to let the task service apply them. A refused update
// reaches containerd (and crictl, and the kubelet's resize status) as
// "container ID: update: bulkhead refused pod NS/NAME (tenant T): [rule.id]
// message" and leaves the container and the pod's charge as they were.
func (p *Pod) Update(ctx context.Context, id string, resources *anypb.Any, update func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sandbox == nil {
		return fmt.Errorf("container %s: update: no sandbox in this shim yet", id)
	}
	if p.pipeline == nil {
		// The pipeline is off: nothing is charged, nothing is judged.
		return update()
	}
	old, live := p.sandbox.Limits[id]
	if !live {
		return fmt.Errorf("container %s: update: not a live container of sandbox %s", id, p.sandbox.ID)
	}
	r, err := specinput.DecodeResources(resources)
	if err != nil {
		return fmt.Errorf("container %s: update: %w", id, &RefusedError{Namespace: p.sandbox.Namespace, Pod: p.sandbox.Name, Tenant: p.sandbox.Tenant,
			Reasons: []policy.Reason{{Rule: RuleResourcesInvalid, Message: err.Error()}}})
	}
	limit := specinput.MemoryAfter(old.MemoryBytes, r)
	ch := ResourceChange{Container: id, Name: old.Name, MemoryBytes: limit,
		Charge: chargeAfter(p.admission.Reservation.MemoryBytes, p.sandbox.Limits, id, limit)}
	if err := p.pipeline.Recharge(ctx, p.sandbox, p.admission, ch, update); err != nil {
		log.G(ctx).WithError(err).Warnf("container %s: update refused or failed", id)
		return fmt.Errorf("container %s: update: %w", id, err)
	}
	log.G(ctx).Infof("container %s: memory limit %d bytes, pod %s/%s charged %d bytes", id, limit, p.sandbox.Namespace, p.sandbox.Name, ch.Charge)
	p.sandbox.Limits[id] = node.ContainerLimits{Name: old.Name, MemoryBytes: limit}
	p.saveRecord(ctx)
	return nil
}

// UpdateTask is Update as a shim's task service serves it: update is the
// runtime's own task Update, called only once the change is judged, and
// its answer is what the shim returns.
func (p *Pod) UpdateTask(ctx context.Context, id string, resources *anypb.Any, update func() (*ptypes.Empty, error)) (*ptypes.Empty, error) {
	var resp *ptypes.Empty
	err := p.Update(ctx, id, resources, func() error {
		var err error
		resp, err = update()
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
