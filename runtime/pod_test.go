package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
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
func testPod(t *testing.T, check func(*node.Sandbox) error) (*Pod, *node.StateDir) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Config{StateDir: filepath.Join(dir, "state"), LedgerPath: filepath.Join(dir, "ledger.db")}
	p, err := NewPod(PodOptions{
		Config:       cfg,
		Runtime:      policy.RuntimeRunc,
		DeleteTask:   func(context.Context, string) error { return nil },
		CheckSandbox: check,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, node.NewStateDir(cfg)
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
	sandbox := testBundle(t, filepath.Join(dir, "sb1"), map[string]string{cri.AnnotationContainerType: cri.ContainerTypeSandbox})
	work := testBundle(t, filepath.Join(dir, "c1"), map[string]string{cri.AnnotationContainerType: "container", cri.AnnotationSandboxID: "sb1"})

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
	if err != nil || sb.Phase != node.PhaseCreated || !reflect.DeepEqual(sb.Containers, []string{"c1"}) || sb.Handler != RuncHandler {
		t.Fatalf("record = %+v, %v; want created, handler %s, containers [c1]", sb, err, RuncHandler)
	}
	if err := p.Create(ctx, "sb2", testBundle(t, filepath.Join(dir, "sb2"), map[string]string{cri.AnnotationContainerType: cri.ContainerTypeSandbox}), create); err == nil || !strings.Contains(err.Error(), "already has sandbox sb1") {
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
	p, state := testPod(t, func(sb *node.Sandbox) error {
		if sb.ID != "sb1" || sb.Bundle != filepath.Join(dir, "sb1") {
			t.Errorf("CheckSandbox got %s in %s", sb.ID, sb.Bundle)
		}
		return checkErr
	})
	sandbox := testBundle(t, filepath.Join(dir, "sb1"), map[string]string{cri.AnnotationContainerType: cri.ContainerTypeSandbox})
	work := testBundle(t, filepath.Join(dir, "c1"), map[string]string{cri.AnnotationContainerType: "container"})
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

// TestResumePodServesWhatAnotherAgentAdmitted: a pod placed by one agent is
// resumed by the next from its record and the ledger, with the decision
// and input it was admitted under; its later containers are judged and its
// delete releases everything.
func TestResumePodServesWhatAnotherAgentAdmitted(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t)
	pl, err := OpenPipeline(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := PodOptions{Config: cfg, Runtime: policy.RuntimeGVisor, ShimPID: os.Getpid(), Pipeline: pl,
		DeleteTask: func(context.Context, string) error { return nil }}
	first, err := NewPod(opts)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, spec := sandboxSpec("research", "resumed", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
	spec.Annotations[cri.AnnotationSandboxMemory] = "1073741824"
	sandbox := filepath.Join(dir, "sb")
	if err := os.MkdirAll(sandbox, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeSpecIfChanged(sandbox, nil, spec); err != nil {
		t.Fatal(err)
	}
	if err := first.Create(ctx, "sb", sandbox, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}

	if _, err := ResumePod(PodOptions{Config: cfg, Runtime: policy.RuntimeRunc, ShimPID: os.Getpid(), Pipeline: pl,
		DeleteTask: opts.DeleteTask}, "sb"); err == nil || !strings.Contains(err.Error(), "runtime gvisor") {
		t.Errorf("resume by a runc shim: error = %v, want one naming the pod's runtime", err)
	}
	if _, err := ResumePod(opts, "never-created"); err == nil {
		t.Error("resume of a sandbox without a record: no error")
	}
	p, err := ResumePod(opts, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if p.admission.Reservation.Tenant != "research" || p.admission.Reservation.GPU == nil || p.admission.Decision.Tenant != "research" || p.admission.Input.Request.MemoryBytes != 1<<30 {
		t.Fatalf("resumed admission = %+v, want research's, with its GPU and 1 GiB", p.admission)
	}
	work := filepath.Join(dir, "c1")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	cspec := containerSpec("main", 1<<29)
	// Sharing the host's PID namespace, which tier standard forbids.
	cspec.Linux.Namespaces = slices.DeleteFunc(slices.Clone(cspec.Linux.Namespaces), func(ns specs.LinuxNamespace) bool { return ns.Type == specs.PIDNamespace })
	if err := writeSpecIfChanged(work, nil, cspec); err != nil {
		t.Fatal(err)
	}
	if err := p.Create(ctx, "c1", work, func(string) error { return nil }); err == nil || !strings.Contains(err.Error(), "workload.host_namespace") {
		t.Errorf("a container sharing the host's PID namespace in a resumed pod: error = %v, want workload.host_namespace", err)
	}
	p.Deleted(ctx, "sb")
	if err := pl.node.Ledger().View(func(tx *node.LedgerTx) error {
		res, err := tx.Get("sb")
		if res != nil {
			t.Errorf("reservation after the resumed pod's delete: %+v", res)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

func TestNewPodNeedsThePipelineItIsToldToRun(t *testing.T) {
	cfg := config.Default()
	_, err := NewPod(PodOptions{Config: cfg, Runtime: policy.RuntimeGVisor, DeleteTask: func(context.Context, string) error { return nil }})
	if err == nil || !strings.Contains(err.Error(), "no pipeline") {
		t.Errorf("pipeline.enabled without a pipeline: error = %v", err)
	}
}

func TestSandboxFromSpec(t *testing.T) {
	spec := &specs.Spec{
		Annotations: map[string]string{
			cri.AnnotationContainerType:    "sandbox",
			cri.AnnotationSandboxNamespace: "agents",
			cri.AnnotationSandboxName:      "coder-1",
			cri.AnnotationSandboxUID:       "u-1",
			"bulkhead.dev/gpu-profile":     "1g.18gb",
			"bulkhead.dev/tenant":          "someone-else",
			"other.io/x":                   "y",
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace},
			{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"},
		}},
	}
	sb := SandboxFromSpec("id1", "/b", spec)
	if sb.Namespace != "agents" || sb.Name != "coder-1" || sb.UID != "u-1" || sb.Handler != DefaultHandler {
		t.Errorf("identity: %+v", sb)
	}
	if sb.NetNS != "/var/run/netns/cni-1" {
		t.Errorf("netns = %q", sb.NetNS)
	}
	want := map[string]string{"bulkhead.dev/gpu-profile": "1g.18gb", "bulkhead.dev/tenant": "someone-else"}
	if !reflect.DeepEqual(sb.Annotations, want) {
		t.Errorf("annotations = %v", sb.Annotations)
	}
	spec.Annotations[cri.AnnotationRuntimeHandler] = "bulkhead-debug"
	if sb := SandboxFromSpec("id1", "/b", spec); sb.Handler != "bulkhead-debug" {
		t.Errorf("handler from annotation = %q", sb.Handler)
	}
}
