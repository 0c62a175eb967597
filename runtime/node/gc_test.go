package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

func TestGCReleasesWhatDeadSandboxesHeld(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.RunscRoot = filepath.Join(dir, "runsc")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.MIG = config.MIGConfig{Backend: "mock", MockModel: "a100-80gb", MockGPUs: 1, MockState: filepath.Join(dir, "gpus.json")}
	cfg.Pipeline.Enabled, cfg.Pipeline.BenchmarkBaseline = false, true
	cfg.Netpol.Enabled = false // never the node's own pins; test/e2e covers the fence
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	state := n.State()

	// "alive" still has runsc state; "dead" has none and no shim.
	if err := os.MkdirAll(filepath.Join(cfg.RunscRoot, "k8s.io"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.RunscRoot, "k8s.io", "alive_sandbox:alive.state"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	inst := map[string]mig.Instance{}
	for i, id := range []string{"alive", "dead"} {
		in, err := n.Backend().Create(0, "2g.20gb", 2*i)
		if err != nil {
			t.Fatal(err)
		}
		inst[id] = in
		pl := mig.PlacementOf(in, "t", id)
		res := &Reservation{SandboxID: id, State: StateActive, Tenant: "t", GPU: &pl, Instance: &in}
		if err := n.Ledger().Update(func(tx *LedgerTx) error { return tx.Put(res) }); err != nil {
			t.Fatal(err)
		}
		if err := state.Save(&Sandbox{ID: id, Phase: PhaseCreated}); err != nil {
			t.Fatal(err)
		}
	}
	// An instance no reservation owns (a crash between create and record).
	orphan, err := n.Backend().Create(0, "1g.10gb", 6)
	if err != nil {
		t.Fatal(err)
	}
	_ = orphan

	rep, err := n.GC(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Released) != 1 || rep.Released[0] != "dead" {
		t.Errorf("released %v, want [dead]", rep.Released)
	}
	if len(rep.Records) != 1 || rep.Records[0] != "dead" {
		t.Errorf("records %v, want [dead]", rep.Records)
	}
	if len(rep.Instances) != 1 {
		t.Errorf("orphan instances destroyed: %v, want 1", rep.Instances)
	}
	insts, err := n.Backend().Instances()
	if err != nil {
		t.Fatal(err)
	}
	if len(insts) != 1 || insts[0].GI != inst["alive"].GI {
		t.Errorf("instances after gc: %+v, want only the live one", insts)
	}
	ids, _ := state.List()
	if len(ids) != 1 || ids[0] != "alive" {
		t.Errorf("records after gc: %v", ids)
	}
	// Idempotent.
	rep, err = n.GC(context.Background())
	if err != nil || !rep.Empty() {
		t.Errorf("second gc: %+v, %v", rep, err)
	}
}

// TestGCOfARecordHalfWritten: a sandbox directory whose record does not read
// (a crash between creating the directory and renaming the record into it)
// is left alone by a GC that cannot know whether a create is writing it,
// and removed at once by the records' only writer unless it says that
// sandbox's create is in flight.
func TestGCOfARecordHalfWritten(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.RunscRoot = filepath.Join(dir, "runsc")
	cfg.RuncRoot = filepath.Join(dir, "runc")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Pipeline.Enabled, cfg.Pipeline.BenchmarkBaseline = false, true
	cfg.Netpol.Enabled = false
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	half := func(id string) {
		t.Helper()
		d, err := n.State().Dir(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		creating func(string) bool
		kept     bool
	}{
		{"no writer says: young, kept", nil, true},
		{"the writer creates it: kept", func(string) bool { return true }, true},
		{"the writer does not: removed", func(string) bool { return false }, false},
	} {
		half("half")
		rep, err := n.GCExcept(context.Background(), tc.creating)
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := n.State().List()
		if kept := len(ids) == 1; kept != tc.kept || kept == (len(rep.Records) == 1) {
			t.Errorf("%s: records after GC %v (report %v), want kept %v", tc.name, ids, rep.Records, tc.kept)
		}
	}
}
