package node

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestStateDirLifecycle(t *testing.T) {
	s := NewStateDir(t.TempDir())
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
	s := NewStateDir(t.TempDir())
	for _, id := range []string{"", "../etc", "a/b", ".hidden", strings.Repeat("x", 200)} {
		if err := s.Save(&Sandbox{ID: id}); err == nil || !strings.Contains(err.Error(), "sandbox id") {
			t.Errorf("Save(%q) = %v, want a sandbox id error", id, err)
		}
	}
}
