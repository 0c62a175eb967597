package starttrace

import (
	"context"
	"testing"
	"time"
)

func TestTraceRecordsStagesInOrder(t *testing.T) {
	ctx, tr := New(context.Background())
	Took(ctx, "open.ledger", 1500*time.Microsecond)
	Since(ctx, "decide", time.Now())
	got := tr.Stages()
	if len(got) != 2 || got[0].Name != "open.ledger" || got[0].Took != 1500*time.Microsecond || got[1].Name != "decide" {
		t.Fatalf("stages %+v", got)
	}
	if s := tr.String(); s[:len("open.ledger=1.5ms decide=")] != "open.ledger=1.5ms decide=" {
		t.Errorf("String() = %q", s)
	}
	// Without a trace in the context a stage is timed for nothing.
	Took(context.Background(), "x", time.Second)
	if len(tr.Stages()) != 2 {
		t.Error("a stage outside the trace's context reached it")
	}
}
