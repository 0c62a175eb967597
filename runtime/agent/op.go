package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
)

// actTimeout bounds how long the agent waits for a shim to perform an act
// and report it; a shim that takes longer is treated as one that failed.
const actTimeout = 5 * time.Minute

// shimPoll is how often the agent looks whether a shim it waits for is
// still alive.
const shimPoll = 100 * time.Millisecond

// errShimGone is an act's outcome when its shim died or gave up before
// reporting it.
var errShimGone = errors.New("the shim is gone")

// op is one call of a shim (a create or an update) that needs the shim's
// task service in the middle: its work runs on a goroutine of its own,
// which hands acts to whichever of the shim's calls (the first, then each
// Continue) waits for the next answer.
type op struct {
	id      uint64
	shimPID int
	// acts carries an act from the work to the call that answers the shim.
	acts chan act
	// results carries the act's outcome back ("" when it succeeded).
	results chan string
	// done carries the work's final error; buffered, read once.
	done chan error
	// gone is closed when the shim died or its call gave up.
	gone     chan struct{}
	goneOnce sync.Once
	// finished is closed when the work has returned.
	finished chan struct{}
}

type act struct{ kind, id string }

func newOp(id uint64, shimPID int) *op {
	return &op{
		id: id, shimPID: shimPID,
		acts: make(chan act), results: make(chan string), done: make(chan error, 1),
		gone: make(chan struct{}), finished: make(chan struct{}),
	}
}

// abandon marks the op's shim as gone: the act waited for fails.
func (o *op) abandon() { o.goneOnce.Do(func() { close(o.gone) }) }

// run starts work on its own goroutine, and a watcher that abandons the op
// when its shim dies.
func (o *op) run(work func() error) {
	go func() {
		defer close(o.finished)
		o.done <- work()
	}()
	go func() {
		t := time.NewTicker(shimPoll)
		defer t.Stop()
		for {
			select {
			case <-o.finished:
				return
			case <-t.C:
				if !processAlive(o.shimPID) {
					o.abandon()
					return
				}
			}
		}
	}()
}

// ask hands act kind (about container id) to the shim and waits for its
// outcome. It runs on the work's goroutine.
func (o *op) ask(kind, id string) error {
	timeout := time.NewTimer(actTimeout)
	defer timeout.Stop()
	select {
	case o.acts <- act{kind, id}:
	case <-o.gone:
		return fmt.Errorf("%s container %s: %w (pid %d)", kind, id, errShimGone, o.shimPID)
	case <-timeout.C:
		o.abandon()
		return fmt.Errorf("%s container %s: the shim (pid %d) did not ask for it within %v", kind, id, o.shimPID, actTimeout)
	}
	select {
	case msg := <-o.results:
		if msg != "" {
			return errors.New(msg)
		}
		return nil
	case <-o.gone:
		return fmt.Errorf("%s container %s: %w (pid %d) before it reported the outcome", kind, id, errShimGone, o.shimPID)
	case <-timeout.C:
		o.abandon()
		return fmt.Errorf("%s container %s: the shim (pid %d) did not report the outcome within %v", kind, id, o.shimPID, actTimeout)
	}
}

// next is the answer to the shim's call waiting on o: the next act, or
// the work's final answer. A call that ends first abandons the op.
func (o *op) next(ctx context.Context) (reply agentapi.Reply, final bool) {
	select {
	case a := <-o.acts:
		return agentapi.Reply{Op: o.id, Act: a.kind, ID: a.id}, false
	case err := <-o.done:
		if err != nil {
			return agentapi.Reply{Error: err.Error()}, true
		}
		return agentapi.Reply{}, true
	case <-ctx.Done():
		o.abandon()
		<-o.finished
		err := <-o.done
		msg := "the shim's call ended before the agent answered"
		if err != nil {
			msg = err.Error()
		}
		return agentapi.Reply{Error: msg}, true
	}
}

// report hands the outcome of the act the work waits for.
func (o *op) report(ctx context.Context, msg string) error {
	select {
	case o.results <- msg:
		return nil
	case <-o.finished:
		return errors.New("the agent no longer waits for that act")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// processAlive reports whether process pid exists.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}
