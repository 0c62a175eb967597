package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// testBundle writes an OCI bundle under dir whose spec carries annotations.
func testBundle(t *testing.T, dir string, annotations map[string]string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(map[string]any{"ociVersion": "1.1.0", "annotations": annotations})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// testPod returns a Pod with the pipeline off whose records go to a fresh
// state directory, and that directory.
func testPod(t *testing.T, check func(*Sandbox) error) (*Pod, *StateDir) {
	t.Helper()
	cfg := config.Config{StateDir: t.TempDir()}
	p, err := NewPod(PodOptions{
		Config:       cfg,
		Runtime:      policy.RuntimeRunc,
		DeleteTask:   func(context.Context, string) error { return nil },
		CheckSandbox: check,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, NewStateDir(cfg.StateDir)
}

func TestNewPodRefusesBadOptions(t *testing.T) {
	del := func(context.Context, string) error { return nil }
	if _, err := NewPod(PodOptions{Runtime: "kata", DeleteTask: del}); err == nil || !strings.Contains(err.Error(), `"kata"`) {
		t.Errorf("runtime kata: error = %v, want one naming it", err)
	}
	if _, err := NewPod(PodOptions{Runtime: policy.RuntimeGVisor}); err == nil || !strings.Contains(err.Error(), "DeleteTask") {
		t.Errorf("no DeleteTask: error = %v, want one naming it", err)
	}
}

// TestPodCreatesAndDeletesContainers: every container's create gets the
// sandbox's bundle, the record follows the containers, and deleting the
// sandbox removes the record.
func TestPodCreatesAndDeletesContainers(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p, state := testPod(t, nil)
	sandbox := testBundle(t, filepath.Join(dir, "sb1"), map[string]string{AnnotationContainerType: ContainerTypeSandbox})
	work := testBundle(t, filepath.Join(dir, "c1"), map[string]string{AnnotationContainerType: "container", AnnotationSandboxID: "sb1"})

	var got []string
	create := func(sandboxBundle string) error { got = append(got, sandboxBundle); return nil }
	if err := p.Create(ctx, "sb1", sandbox, create); err != nil {
		t.Fatal(err)
	}
	if err := p.Create(ctx, "c1", work, create); err != nil {
		t.Fatal(err)
	}
	if want := []string{sandbox, sandbox}; !reflect.DeepEqual(got, want) {
		t.Errorf("create got sandbox bundles %q, want %q", got, want)
	}
	sb, err := state.Load("sb1")
	if err != nil || sb.Phase != PhaseCreated || !reflect.DeepEqual(sb.Containers, []string{"c1"}) || sb.Handler != RuncHandler {
		t.Fatalf("record = %+v, %v; want created, handler %s, containers [c1]", sb, err, RuncHandler)
	}
	if err := p.Create(ctx, "sb2", testBundle(t, filepath.Join(dir, "sb2"), map[string]string{AnnotationContainerType: ContainerTypeSandbox}), create); err == nil || !strings.Contains(err.Error(), "already has sandbox sb1") {
		t.Errorf("second sandbox: error = %v", err)
	}

	p.Deleted(ctx, "c1")
	if sb, err := state.Load("sb1"); err != nil || len(sb.Containers) != 0 {
		t.Fatalf("record after deleting c1 = %+v, %v", sb, err)
	}
	p.Deleted(ctx, "sb1")
	if ids, err := state.List(); err != nil || len(ids) != 0 {
		t.Fatalf("records after deleting the sandbox = %v, %v; want none", ids, err)
	}
}

// TestPodRefusedSandboxLeavesNothing: a sandbox refused by CheckSandbox or
// by its task service leaves no record, and the pod takes a sandbox again.
func TestPodRefusedSandboxLeavesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	refuse := errors.New("options missing")
	checkErr := refuse
	p, state := testPod(t, func(sb *Sandbox) error {
		if sb.ID != "sb1" || sb.Bundle != filepath.Join(dir, "sb1") {
			t.Errorf("CheckSandbox got %s in %s", sb.ID, sb.Bundle)
		}
		return checkErr
	})
	sandbox := testBundle(t, filepath.Join(dir, "sb1"), map[string]string{AnnotationContainerType: ContainerTypeSandbox})
	work := testBundle(t, filepath.Join(dir, "c1"), map[string]string{AnnotationContainerType: "container"})
	created := 0
	create := func(string) error { created++; return nil }

	if err := p.Create(ctx, "sb1", sandbox, create); !errors.Is(err, refuse) {
		t.Fatalf("refused by CheckSandbox: error = %v, want %v", err, refuse)
	}
	if created != 0 {
		t.Errorf("the task service created %d containers of a refused sandbox", created)
	}
	if ids, _ := state.List(); len(ids) != 0 {
		t.Errorf("records after a refusal: %v", ids)
	}
	if err := p.Create(ctx, "c1", work, create); err == nil || !strings.Contains(err.Error(), "no sandbox in this shim yet") {
		t.Errorf("container after a refused sandbox: error = %v", err)
	}

	checkErr = nil
	failed := errors.New("runc create failed")
	if err := p.Create(ctx, "sb1", sandbox, func(string) error { return failed }); !errors.Is(err, failed) {
		t.Fatalf("task service failure: error = %v, want %v", err, failed)
	}
	if ids, _ := state.List(); len(ids) != 0 {
		t.Errorf("records after a failed create: %v", ids)
	}
	if err := p.Create(ctx, "sb1", sandbox, create); err != nil || created != 1 {
		t.Fatalf("retry: error = %v, created %d", err, created)
	}
}

// A pod given the pipeline OpenEarly began opening places its sandbox with
// that pipeline and logs the opening's stages; when the opening failed, the
// sandbox is refused with its error, and the next create opens anew.
func TestPodTakesTheEarlyOpening(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	broken := cfg
	broken.Policy.Bundle = filepath.Join(t.TempDir(), "missing")
	for _, tt := range []struct {
		name    string
		cfg     config.Config
		wantErr string
	}{
		{"opens", cfg, ""},
		{"fails", broken, "missing"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			opening := OpenEarly(tt.cfg, policy.RuntimeGVisor)
			if opening == nil {
				t.Fatal("OpenEarly with the pipeline on = nil")
			}
			p, err := NewPod(PodOptions{
				Config: tt.cfg, Runtime: policy.RuntimeGVisor, Opening: opening,
				DeleteTask: func(context.Context, string) error { return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			_, spec := sandboxSpec("research", "early-"+tt.name, nil)
			bundle := t.TempDir()
			if err := writeSpecIfChanged(bundle, nil, spec); err != nil {
				t.Fatal(err)
			}
			err = p.Create(ctx, "early-"+tt.name, bundle, func(string) error { return nil })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Create = %v, want the opening's error (%s)", err, tt.wantErr)
				}
				if p.opening != nil || p.pipeline != nil {
					t.Error("a failed opening is kept for the next create")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.pipeline == nil || p.pipeline != opening.pipeline {
				t.Error("the sandbox was not placed with the early opening's pipeline")
			}
			if p.opening != nil {
				t.Error("the opening is kept after its pipeline was taken")
			}
		})
	}
	if OpenEarly(config.Config{}, policy.RuntimeGVisor) != nil {
		t.Error("OpenEarly with the pipeline off began opening one")
	}
}
