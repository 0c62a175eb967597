// Package starttrace times the stages of one sandbox's start (opening the
// node and the policy, each step of the pipeline's Place) for the one log
// line and the metrics a start yields: where a slow start went, without a
// profiler. A trace travels in the context, so that a package timing a
// stage (runtime/node opening the ledger, runtime placing a pod) needs no
// handle on whoever reads it; without a trace in the context, timing a
// stage records nothing.
package starttrace

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Trace is the stages of one start, in the order they were recorded.
type Trace struct {
	// mu guards stages: steps that run at the same time record into one trace.
	mu     sync.Mutex
	stages []Stage
}

// Stage is how long one stage of a sandbox's create took.
type Stage struct {
	Name string
	Took time.Duration
}

type key struct{}

// New returns ctx carrying a new trace.
func New(ctx context.Context) (context.Context, *Trace) {
	t := &Trace{}
	return context.WithValue(ctx, key{}, t), t
}

// Since records that stage name of ctx's trace took from since until now,
// and returns now; without a trace in ctx it only returns now.
func Since(ctx context.Context, name string, since time.Time) time.Time {
	now := time.Now()
	Took(ctx, name, now.Sub(since))
	return now
}

// Took records that stage name of ctx's trace took d (a stage timed on
// another goroutine).
func Took(ctx context.Context, name string, d time.Duration) {
	if t, ok := ctx.Value(key{}).(*Trace); ok {
		t.mu.Lock()
		t.stages = append(t.stages, Stage{Name: name, Took: d})
		t.mu.Unlock()
	}
}

// Stages lists the trace's stages in the order they were recorded.
func (t *Trace) Stages() []Stage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Stage(nil), t.stages...)
}

// String lists the stages in order as name=duration, in milliseconds.
func (t *Trace) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts := make([]string, 0, len(t.stages))
	for _, s := range t.stages {
		parts = append(parts, fmt.Sprintf("%s=%.1fms", s.Name, float64(s.Took.Microseconds())/1000))
	}
	return strings.Join(parts, " ")
}
