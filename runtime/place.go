package runtime

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// Pipeline steps, in order (FailAtEnv takes one of these).
const (
	StepDecide  = "decide"
	StepReserve = "reserve"
	StepGPU     = "gpu"
	StepSandbox = "sandbox"
	StepFence   = "fence"
	StepActive  = "activate"
)

// Steps lists the pipeline's steps in order.
var Steps = []string{StepDecide, StepReserve, StepGPU, StepSandbox, StepFence, StepActive}

// Admission is what Place admitted for a pod: the decision it was admitted
// under and what it holds. The shim keeps it for the pod's later
// containers (their RDMA grant, their GPU).
type Admission struct {
	Decision    policy.Decision
	Reservation *node.Reservation
	// Input is the sandbox's policy input as decided, without usage and
	// node: an update that grows the pod's memory is judged as this pod
	// admitted again at its new size.
	Input policy.Input
}

// SandboxTask is the task service's sandbox as Place drives it.
type SandboxTask struct {
	// Create has the task service (gVisor's or runc's) create the sandbox
	// from its bundle, whose config.json Place has written.
	Create func(ctx context.Context) error
	// Delete deletes it again when a later step fails.
	Delete func(ctx context.Context) error
}

// step is one stage of placing a pod and what undoes it when a later stage
// fails. An undo of nil means the step leaves nothing of its own: what the
// gpu and fence steps make is recorded in the reservation before it is
// made, and the reservation's release undoes it.
type step struct {
	name string
	do   func(ctx context.Context) error
	undo func(ctx context.Context) error
}

// Place runs one pod's path, the table of docs/runtime.md, with one undo
// stack: decide → reserve → gpu → sandbox ∥ fence → activate. The sandbox
// and fence steps run at the same time: both need only the decision and
// the reservation, neither touches what the other writes, and the kernel's
// TCX attach (an RCU grace period per program, ~10 ms each) then costs the
// pod nothing while the runtime creates its sandbox. Both finish before
// Place returns, so no container of the pod is created, let alone started,
// before its fence is in place. On error every step taken (of a pair, each
// one that succeeded) is undone in reverse and nothing of the pod is left
// (but its state record, which the caller owns).
func (p *Pipeline) Place(ctx context.Context, sb *node.Sandbox, spec *specs.Spec, task SandboxTask) (_ *Admission, retErr error) {
	read, err := encodeSpec(spec)
	if err != nil {
		return nil, err
	}
	a := &Admission{}
	decide := step{name: StepDecide, do: func(ctx context.Context) error {
		return p.decide(sb, spec, a)
	}}
	reserve := step{name: StepReserve, do: func(ctx context.Context) error {
		return p.reserve(ctx, sb, a.Input, a)
	}, undo: func(ctx context.Context) error {
		return p.node.Release(ctx, sb.ID)
	}}
	gpu := step{name: StepGPU, do: func(ctx context.Context) error {
		return p.setupGPU(ctx, a.Reservation, spec)
	}}
	sandbox := step{name: StepSandbox, do: func(ctx context.Context) error {
		return p.startSandbox(ctx, sb, a, spec, read, task)
	}, undo: task.Delete}
	fence := step{name: StepFence, do: func(ctx context.Context) error {
		return p.fencePod(ctx, sb, a)
	}}
	activate := step{name: StepActive, do: func(ctx context.Context) error {
		return p.activate(a)
	}}
	// One row a stage; the steps of a row run at the same time.
	stages := [][]step{
		{decide},
		{reserve},
		{gpu},
		{sandbox, fence},
		{activate},
	}
	var done []step
	defer func() {
		if retErr == nil {
			return
		}
		uctx := context.WithoutCancel(ctx)
		for i := len(done) - 1; i >= 0; i-- {
			if done[i].undo == nil {
				continue
			}
			if err := done[i].undo(uctx); err != nil {
				log.G(ctx).WithError(err).Warnf("sandbox %s: undo %s after a failed placement", sb.ID, done[i].name)
			}
		}
	}()
	for _, stage := range stages {
		ok, err := runStage(ctx, stage)
		done = append(done, ok...)
		if isRefusal(err) {
			return nil, err
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", sb.ID, err)
		}
	}
	return a, nil
}

// runStage runs the steps of one stage, a single step or steps that run at
// the same time, and waits for all of them. It returns the steps that
// succeeded, in table order, and the first failure in table order, named
// by its step.
func runStage(ctx context.Context, stage []step) (ok []step, err error) {
	errs := make([]error, len(stage))
	run := func(i int) {
		t := time.Now()
		errs[i] = stage[i].do(ctx)
		starttrace.Since(ctx, stage[i].name, t)
	}
	var wg sync.WaitGroup
	for i := 1; i < len(stage); i++ {
		wg.Go(func() { run(i) })
	}
	run(0)
	wg.Wait()
	for i, s := range stage {
		if errs[i] == nil {
			ok = append(ok, s)
			continue
		}
		if err == nil {
			err = errs[i]
			if !isRefusal(err) {
				err = fmt.Errorf("%s: %w", s.name, err)
			}
		}
	}
	return ok, err
}
