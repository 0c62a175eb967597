package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	task "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/typeurl/v2"
	"gvisor.dev/gvisor/pkg/shim/v1/extension"
	"gvisor.dev/gvisor/pkg/shim/v1/runtimeoptions"

	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// fakeTasks is gVisor's task service as the extension sees it: it records
// the options file each created container was pointed at.
type fakeTasks struct {
	extension.TaskServiceExt // nil: calls the test does not expect panic
	t                        *testing.T
	configPaths              map[string]string // container id -> options file
	deleted                  []string
}

func (f *fakeTasks) configPath(r *task.CreateTaskRequest) {
	var opts runtimeoptions.Options
	if err := typeurl.UnmarshalTo(r.Options, &opts); err != nil {
		f.t.Errorf("container %s: gVisor cannot decode its options: %v", r.ID, err)
	}
	f.configPaths[r.ID] = opts.GetConfigPath()
}

func (f *fakeTasks) Create(_ context.Context, r *task.CreateTaskRequest) (*task.CreateTaskResponse, error) {
	f.configPath(r)
	return &task.CreateTaskResponse{Pid: 1}, nil
}

func (f *fakeTasks) CreateWithFSRestore(_ context.Context, r *extension.CreateWithFSRestoreRequest) (*task.CreateTaskResponse, error) {
	f.configPath(r.Create)
	return &task.CreateTaskResponse{Pid: 2}, nil
}

func (f *fakeTasks) Delete(_ context.Context, r *task.DeleteRequest) (*task.DeleteResponse, error) {
	f.deleted = append(f.deleted, r.ID)
	return &task.DeleteResponse{}, nil
}

// bundle writes an OCI bundle whose spec carries the CRI container type.
func bundle(t *testing.T, dir, containerType string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(map[string]any{"annotations": map[string]string{cri.AnnotationContainerType: containerType}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func newTestExtension(t *testing.T) (*PodExtension, *fakeTasks, *node.StateDir) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Config{StateDir: filepath.Join(dir, "state"), LedgerPath: filepath.Join(dir, "ledger.db")}
	tasks := &fakeTasks{t: t, configPaths: map[string]string{}}
	p, err := NewPodExtension(cfg, tasks)
	if err != nil {
		t.Fatal(err)
	}
	return p, tasks, node.NewStateDir(cfg)
}

// TestEveryContainerGetsTheSandboxOptions: the sandbox and every later
// container, restored ones too, point gVisor at the options file in the
// sandbox's bundle; deleting the sandbox drops its record.
func TestEveryContainerGetsTheSandboxOptions(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p, tasks, state := newTestExtension(t)
	sandbox := bundle(t, filepath.Join(dir, "sb1"), "sandbox")
	if err := os.WriteFile(filepath.Join(sandbox, optionsFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	if _, err := p.Create(ctx, &task.CreateTaskRequest{ID: "sb1", Bundle: sandbox}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, &task.CreateTaskRequest{ID: "c1", Bundle: bundle(t, filepath.Join(dir, "c1"), "container")}); err != nil {
		t.Fatal(err)
	}
	resp, err := p.CreateWithFSRestore(ctx, &extension.CreateWithFSRestoreRequest{Create: &task.CreateTaskRequest{ID: "c2", Bundle: bundle(t, filepath.Join(dir, "c2"), "container")}})
	if err != nil || resp.Pid != 2 {
		t.Fatalf("CreateWithFSRestore = %v, %v", resp, err)
	}
	want := filepath.Join(sandbox, optionsFile)
	for _, id := range []string{"sb1", "c1", "c2"} {
		if got := tasks.configPaths[id]; got != want {
			t.Errorf("container %s: options file %q, want %q", id, got, want)
		}
	}

	if _, err := p.Delete(ctx, &task.DeleteRequest{ID: "sb1"}); err != nil {
		t.Fatal(err)
	}
	if ids, err := state.List(); err != nil || len(ids) != 0 {
		t.Errorf("records after deleting the sandbox = %v, %v; want none", ids, err)
	}
}

// TestSandboxWithoutOptionsIsRefused: a sandbox whose bundle lacks the
// manager's options file never reaches gVisor and leaves no record.
func TestSandboxWithoutOptionsIsRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p, tasks, state := newTestExtension(t)
	sandbox := bundle(t, filepath.Join(dir, "sb1"), "sandbox")

	_, err := p.Create(ctx, &task.CreateTaskRequest{ID: "sb1", Bundle: sandbox})
	if err == nil || !strings.Contains(err.Error(), "sandbox sb1: gVisor options missing") || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("error = %v, want the missing options file", err)
	}
	if len(tasks.configPaths) != 0 {
		t.Errorf("gVisor created %v", tasks.configPaths)
	}
	if ids, err := state.List(); err != nil || len(ids) != 0 {
		t.Errorf("records after the refusal = %v, %v; want none", ids, err)
	}
	if _, err := p.Create(ctx, &task.CreateTaskRequest{ID: "c1", Bundle: bundle(t, filepath.Join(dir, "c1"), "container")}); err == nil {
		t.Error("a container of the refused sandbox was created")
	}
}
