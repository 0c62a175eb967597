package runtime

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The sandbox and fence steps run at the same time, and Place returns only
// when both have finished: the task service's create waits until the
// fence step has begun (one after the other, it never would), and the
// fence step, which outlasts the create, has finished when Place returns.
func TestPlaceRunsSandboxAndFenceTogether(t *testing.T) {
	p := testPipeline(t)
	fenceBegun, created := make(chan struct{}), make(chan struct{})
	var fenceFinished atomic.Bool
	failpointHook = func(_, step string) error {
		if step == StepFence {
			close(fenceBegun)
			<-created
			fenceFinished.Store(true)
		}
		return nil
	}
	t.Cleanup(func() { failpointHook = nil })

	sb, spec := sandboxSpec("research", "together", nil)
	sb.Bundle = t.TempDir()
	_, err := p.Place(context.Background(), sb, spec, SandboxTask{
		Create: func(context.Context) error {
			defer close(created)
			select {
			case <-fenceBegun:
				return nil
			case <-time.After(time.Minute):
				return errors.New("the fence step did not begin while the sandbox was being created")
			}
		},
		Delete: func(context.Context) error { return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !fenceFinished.Load() {
		t.Error("Place returned before the fence step finished")
	}
}

// A failure of one of two steps that run together undoes the other one
// too, and the error names the step that failed.
func TestPlaceUndoesTheStepBesideAFailure(t *testing.T) {
	p := testPipeline(t)
	for _, failed := range []string{StepSandbox, StepFence} {
		p.failAt = failed
		sb, spec := sandboxSpec("research", "beside-"+failed, nil)
		sb.Bundle = t.TempDir()
		var creates, deletes int
		_, err := p.Place(context.Background(), sb, spec, SandboxTask{
			Create: func(context.Context) error { creates++; return nil },
			Delete: func(context.Context) error { deletes++; return nil },
		})
		if err == nil {
			t.Fatalf("failure at %s: Place succeeded", failed)
		}
		if want := "sandbox " + sb.ID + ": " + failed + ": injected failure"; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("failure at %s: error %q, want it to begin %q", failed, err, want)
		}
		if creates != deletes {
			t.Errorf("failure at %s: sandbox created %d times, deleted %d", failed, creates, deletes)
		}
	}
}
