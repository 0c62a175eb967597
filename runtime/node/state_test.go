package node

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// testStateDir is a state directory whose node key lies beside it.
func testStateDir(t *testing.T) *StateDir {
	t.Helper()
	dir := t.TempDir()
	return NewStateDir(config.Config{StateDir: filepath.Join(dir, "state"), LedgerPath: filepath.Join(dir, "ledger.db")})
}

func TestStateDirLifecycle(t *testing.T) {
	s := testStateDir(t)
	sb := &Sandbox{ID: "abc123", Namespace: "agents", Name: "p", Phase: PhaseCreating}
	if err := s.Save(sb); err != nil {
		t.Fatal(err)
	}
	dir, err := s.Dir("abc123")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "extra"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load("abc123")
	if err != nil || got.Namespace != "agents" || got.Phase != PhaseCreating {
		t.Fatalf("Load = %+v, %v", got, err)
	}
	ids, err := s.List()
	if err != nil || !reflect.DeepEqual(ids, []string{"abc123"}) {
		t.Fatalf("List = %v, %v", ids, err)
	}
	if err := s.Remove("abc123"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("abc123"); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	ids, _ = s.List()
	if len(ids) != 0 {
		t.Fatalf("after Remove: %v", ids)
	}
	// No temporary files are left behind by atomic writes.
	entries, _ := os.ReadDir(filepath.Join(s.Root(), "sandboxes"))
	if len(entries) != 0 {
		t.Fatalf("left: %v", entries)
	}
}

func TestStateDirRefusesBadIDs(t *testing.T) {
	s := testStateDir(t)
	for _, id := range []string{"", "../etc", "a/b", ".hidden", strings.Repeat("x", 200)} {
		if err := s.Save(&Sandbox{ID: id}); err == nil || !strings.Contains(err.Error(), "sandbox id") {
			t.Errorf("Save(%q) = %v, want a sandbox id error", id, err)
		}
	}
}

// TestStateDirSealsRecords: a record loads only as this node sealed it for
// its own sandbox; an edited, unsealed or moved record, or one sealed under
// another node's key, is refused naming the sandbox and the rule, and a
// record is never written without the key.
func TestStateDirSealsRecords(t *testing.T) {
	s := testStateDir(t)
	sb := &Sandbox{ID: "sb1", Namespace: "agents", Name: "p", Tenant: "agents", Phase: PhaseCreated}
	if err := s.Save(sb); err != nil {
		t.Fatal(err)
	}
	dir, _ := s.Dir("sb1")
	path := filepath.Join(dir, "sandbox.json")
	sealed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load("sb1"); err != nil || !reflect.DeepEqual(got, sb) {
		t.Fatalf("Load = %+v, %v; want %+v", got, err, sb)
	}
	other := testStateDir(t) // another node: another key
	if err := other.Save(sb); err != nil {
		t.Fatal(err)
	}
	otherDir, _ := other.Dir("sb1")
	foreign, err := os.ReadFile(filepath.Join(otherDir, "sandbox.json"))
	if err != nil {
		t.Fatal(err)
	}
	s2 := &Sandbox{ID: "sb2", Namespace: "platform", Phase: PhaseCreated}
	if err := s.Save(s2); err != nil {
		t.Fatal(err)
	}
	dir2, _ := s.Dir("sb2")
	moved, err := os.ReadFile(filepath.Join(dir2, "sandbox.json"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		raw  []byte
		want error
	}{
		{"edited", bytes.Replace(sealed, []byte(`"agents"`), []byte(`"platform"`), 1), ErrRecordNotAuthentic},
		{"unsealed", append([]byte("{"), sealed[len(sealPrefix)+2*32+len(sealSep):]...), ErrRecordUnsealed},
		{"mac damaged", append(append([]byte(sealPrefix), bytes.Repeat([]byte("0"), 64)...), sealed[len(sealPrefix)+64:]...), ErrRecordNotAuthentic},
		{"truncated", sealed[:len(sealPrefix)+10], ErrRecordNotAuthentic},
		{"sealed by another node", foreign, ErrRecordNotAuthentic},
		{"another sandbox's", moved, ErrRecordNotAuthentic},
	}
	for _, tt := range tests {
		if err := os.WriteFile(path, tt.raw, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := s.Load("sb1")
		if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), "sandbox sb1") || !strings.Contains(err.Error(), "["+RuleRecordAuthentic+"]") {
			t.Errorf("%s: Load = %v, want %v naming sandbox sb1 and %s", tt.name, err, tt.want, RuleRecordAuthentic)
		}
	}
	// What only hints (GC) reads an unsealed record as it stands.
	if err := os.WriteFile(path, tests[1].raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadUnauthenticated("sb1"); err != nil || got.Namespace != "agents" {
		t.Errorf("LoadUnauthenticated = %+v, %v", got, err)
	}

	// A node key others may read is no key: nothing is written.
	keyDir := t.TempDir()
	key := filepath.Join(keyDir, "plan-cache.key")
	if err := os.WriteFile(key, bytes.Repeat([]byte("k"), 32), 0o644); err != nil {
		t.Fatal(err)
	}
	open := NewStateDir(config.Config{StateDir: filepath.Join(keyDir, "state"), Policy: config.PolicyConfig{PlanCacheKey: key}})
	if err := open.Save(sb); err == nil || !strings.Contains(err.Error(), "sandbox sb1") || !strings.Contains(err.Error(), key) {
		t.Errorf("Save under a key open to others = %v, want a refusal naming the sandbox and the key", err)
	}
	if ids, _ := open.List(); len(ids) != 0 {
		t.Errorf("records written without a key: %v", ids)
	}
}

func TestCheckReservation(t *testing.T) {
	res := &Reservation{SandboxID: "sb1", Tenant: "agents", Tier: "untrusted", Namespace: "agents", Pod: "p"}
	good := func() *Sandbox {
		return &Sandbox{ID: "sb1", Namespace: "agents", Name: "p", UID: "u1", Handler: "bulkhead", Tenant: "agents", Runtime: policy.RuntimeGVisor,
			Decision: &policy.Decision{Allow: true, Tenant: "agents", Tier: "untrusted", Runtime: policy.RuntimeGVisor},
			Input:    &policy.Input{Kind: policy.KindSandbox, Namespace: "agents", Pod: policy.Pod{Name: "p", UID: "u1", RuntimeHandler: "bulkhead"}}}
	}
	if err := good().CheckReservation(res); err != nil {
		t.Fatalf("a record that agrees: %v", err)
	}
	for name, edit := range map[string]func(*Sandbox){
		"namespace":          func(sb *Sandbox) { sb.Namespace = "platform" },
		"pod":                func(sb *Sandbox) { sb.Name = "q" },
		"tenant":             func(sb *Sandbox) { sb.Tenant = "platform" },
		"decision tenant":    func(sb *Sandbox) { sb.Decision.Tenant = "platform" },
		"decision tier":      func(sb *Sandbox) { sb.Decision.Tier = "trusted" },
		"decision runtime":   func(sb *Sandbox) { sb.Decision.Runtime = policy.RuntimeRunc },
		"decision refused":   func(sb *Sandbox) { sb.Decision.Allow = false },
		"input namespace":    func(sb *Sandbox) { sb.Input.Namespace = "platform" },
		"input uid":          func(sb *Sandbox) { sb.Input.Pod.UID = "u2" },
		"input handler":      func(sb *Sandbox) { sb.Input.Pod.RuntimeHandler = "bulkhead-runc" },
		"input annotations":  func(sb *Sandbox) { sb.Input.Pod.Annotations = map[string]string{"bulkhead.dev/rdma": "true"} },
		"another sandbox id": func(sb *Sandbox) { sb.ID = "sb2" },
	} {
		sb := good()
		edit(sb)
		if err := sb.CheckReservation(res); err == nil || !strings.Contains(err.Error(), "["+RuleRecordLedger+"]") {
			t.Errorf("%s: CheckReservation = %v, want a refusal naming %s", name, err, RuleRecordLedger)
		}
	}
}
