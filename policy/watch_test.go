package policy

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWatchReloadsChangedBundle(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rego")
	if out, err := exec.Command("cp", "-r", repoPath(t, "rego"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	e, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Watch(ctx, 5*time.Millisecond) }()

	manifest := filepath.Join(dir, ".manifest")
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(raw), "bulkhead-default-1", "bulkhead-default-2", 1)
	if err := os.WriteFile(manifest, []byte(changed+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.Revision() == "bulkhead-default-2" })

	// A broken change is refused and the last good revision stays.
	if err := os.WriteFile(filepath.Join(dir, "broken.rego"), []byte("package bulkhead\n\ndecision := \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(context.Background()); err == nil {
		t.Fatal("Reload accepted a broken bundle")
	}
	if e.Revision() != "bulkhead-default-2" {
		t.Fatalf("revision = %s after a refused change", e.Revision())
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Watch = %v", err)
	}
	if err := e.Watch(context.Background(), 0); err == nil {
		t.Fatal("Watch accepted a zero interval")
	}
}

// waitFor polls cond; the deadline only bounds a hung test.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOnReloadReportsEveryReload: the function OnReload registers hears
// of a reload that activated a new revision and of one that was refused,
// with the revision that stays.
func TestOnReloadReportsEveryReload(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "rego")
	if out, err := exec.Command("cp", "-r", repoPath(t, "rego"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	e, err := Open(ctx, Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	type heard struct {
		rev string
		err error
	}
	var got []heard
	e.OnReload(func(rev string, err error) { got = append(got, heard{rev, err}) })
	manifest := filepath.Join(dir, ".manifest")
	raw, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, []byte(strings.Replace(string(raw), "bulkhead-default-1", "bulkhead-default-2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "broken.rego"), []byte("package bulkhead\n\ndecision := \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(ctx); err == nil {
		t.Fatal("Reload accepted a broken bundle")
	}
	if len(got) != 2 || got[0] != (heard{"bulkhead-default-2", nil}) || got[1].rev != "bulkhead-default-2" || got[1].err == nil {
		t.Errorf("OnReload heard %+v, want bulkhead-default-2 (nil), then bulkhead-default-2 (an error)", got)
	}
}
