package shim

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// TestFailsClosedWithoutTheAgent: with the pipeline on and no agent on the
// socket, a create is refused naming the agent and its socket, and the task
// service is never asked to create anything; with the pipeline off (a
// benchmark baseline) the shim asks no one.
func TestFailsClosedWithoutTheAgent(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	for _, tc := range []struct {
		name     string
		pipeline bool
		created  int
		wantErr  string
	}{
		{"pipeline on, no agent", true, 0, "the node agent did not answer (fail closed; is bulkhead-agent running?): bulkhead agent unavailable at " + socket},
		{"pipeline off", false, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Agent.Socket = socket
			cfg.Pipeline.Enabled = tc.pipeline
			p, err := NewPod(Options{Config: cfg, Runtime: agentapi.RuntimeRunc})
			if err != nil {
				t.Fatal(err)
			}
			created := 0
			err = p.Create(context.Background(), "sb", t.TempDir(), Task{
				Create: func(string) error { created++; return nil },
				Delete: func(context.Context, string) error { t.Error("Delete called"); return nil },
			})
			if created != tc.created {
				t.Errorf("task service created %d containers, want %d", created, tc.created)
			}
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Create = %v, want error %q", err, tc.wantErr)
			}
			updated := false
			err = p.Update(context.Background(), "c1", nil, func() error { updated = true; return nil })
			if tc.pipeline && (err == nil || updated) {
				t.Errorf("update of a pod with no sandbox: error %v, applied %v; want a refusal", err, updated)
			}
		})
	}
	if _, err := NewPod(Options{Runtime: "kata"}); err == nil || !strings.Contains(err.Error(), `"kata"`) {
		t.Errorf("runtime kata: %v, want an error naming it", err)
	}
}
