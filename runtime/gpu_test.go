package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// A pod that holds a GPU or MIG slice has a CDI spec for it in
// mig.cdi_spec_dir, which CDI's own library reads and resolves, and every
// container of the pod names it; releasing the pod removes the spec.
func TestGPUCDISpecLivesWithThePod(t *testing.T) {
	tests := []struct {
		name, ns, profile, runtime string
		wantPrefix                 string // of the CDI device name
	}{
		{name: "slice on runc", ns: "platform", profile: "3g.71gb", runtime: policy.RuntimeRunc, wantPrefix: "MIG-"},
		{name: "whole GPU in gVisor", ns: "research", profile: "3g.71gb", runtime: policy.RuntimeGVisor, wantPrefix: "GPU-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := testPipelineWith(t, func(cfg *config.Config) { cfg.MIG.CDISpecDir = dir })
			sb, spec := sandboxSpec(tt.ns, "gpu", map[string]string{policy.AnnotationGPUProfile: tt.profile})
			sb.Runtime = tt.runtime
			if tt.runtime == policy.RuntimeRunc {
				sb.Handler = RuncHandler
			}
			a, err := place(t, p, sb, spec)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "bulkhead.dev-gpu_"+sb.ID+".json")
			cs, err := cdilib.ReadSpec(path, 0)
			if err != nil {
				t.Fatalf("CDI reads the pod's spec: %v", err)
			}
			if len(cs.Devices) != 1 || !strings.HasPrefix(cs.Devices[0].Name, tt.wantPrefix) {
				t.Fatalf("CDI devices %+v, want one %s...", cs.Devices, tt.wantPrefix)
			}
			id := cs.Devices[0].Name
			if a.Reservation.Instance != nil && a.Reservation.Instance.UUID != id {
				t.Errorf("CDI device %s, instance %s", id, a.Reservation.Instance.UUID)
			}
			name := inject.CDIName(inject.CDIKind, id)
			if got := spec.Annotations[inject.CDIAnnotation]; got != name {
				t.Errorf("sandbox annotation %s = %q, want %q", inject.CDIAnnotation, got, name)
			}
			// A CDI-aware runtime resolves the name to the same device id.
			cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dir), cdilib.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			viaCDI := &specs.Spec{Process: &specs.Process{}}
			if _, err := cache.InjectDevices(viaCDI, name); err != nil {
				t.Fatalf("CDI injects %s: %v", name, err)
			}
			if env := strings.Join(viaCDI.Process.Env, " "); env != inject.VisibleDevicesEnv+"="+id {
				t.Errorf("CDI env %q", env)
			}
			// The pod's other containers name it too.
			ctr := &specs.Spec{}
			if err := p.InjectGPU(a.Reservation, ctr); err != nil {
				t.Fatal(err)
			}
			if ctr.Annotations[inject.CDIAnnotation] != name || !strings.Contains(strings.Join(ctr.Process.Env, " "), id) {
				t.Errorf("container spec annotations %v env %v", ctr.Annotations, ctr.Process.Env)
			}
			if err := p.Node().Release(context.Background(), sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("CDI spec left after release: %v", err)
			}
		})
	}
}

// GC removes the CDI specs no reservation holds and keeps the others.
func TestGCRemovesOrphanCDISpecs(t *testing.T) {
	dir := t.TempDir()
	p := testPipelineWith(t, func(cfg *config.Config) { cfg.MIG.CDISpecDir = dir })
	sb, spec := sandboxSpec("research", "live", map[string]string{policy.AnnotationGPUProfile: "whole"})
	if _, err := place(t, p, sb, spec); err != nil {
		t.Fatal(err)
	}
	// A spec left by a shim that died after writing it.
	orphan, err := inject.CDISpec(inject.CDIKind, inject.Edits{}, map[string]inject.Edits{"GPU-gone": {Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-gone"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inject.WriteCDISpec(dir, "dead", orphan); err != nil {
		t.Fatal(err)
	}
	// The live pod still has runsc state, as a running gVisor sandbox does.
	if err := os.MkdirAll(filepath.Join(p.node.Config().RunscRoot, "k8s.io"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.node.Config().RunscRoot, "k8s.io", "pause_sandbox:"+sb.ID+".state"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := p.Node().GC(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rep.CDISpecs, ",") != "dead" {
		t.Errorf("gc removed CDI specs of %v, want [dead]", rep.CDISpecs)
	}
	owners, err := inject.CDISpecOwners(dir, inject.CDIKind)
	if err != nil || strings.Join(owners, ",") != sb.ID {
		t.Errorf("CDI specs after gc: %v %v, want the live pod's", owners, err)
	}
}

// On real GPUs the node's allocator is strict: a whole GPU never comes from
// a GPU in MIG mode (CUDA would see no device there); on the mock it may.
func TestAllocatorStrictOnRealGPUs(t *testing.T) {
	tests := []struct {
		backend string
		want    string // "" for a whole-GPU placement, else part of the refusal
	}{
		{"nvml", "MIG mode on: no whole GPU"},
		{"mock", ""},
	}
	for _, tt := range tests {
		t.Run(tt.backend, func(t *testing.T) {
			ledger, err := node.OpenLedger(filepath.Join(t.TempDir(), "ledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Default()
			cfg.MIG.Backend = tt.backend
			// No NVML is opened: the pipeline gets the GPUs as the backend
			// would list them, all in MIG mode.
			p := NewPipeline(node.New(cfg, node.Parts{Ledger: ledger, GPUs: mig.NodeGPUs("h200", 1)}), nil)
			err = ledger.View(func(tx *node.LedgerTx) error {
				alloc, err := p.allocator(tx)
				if err != nil {
					return err
				}
				_, err = alloc.Allocate(mig.Request{Owner: "o", Tenant: "t", WholeGPU: true})
				return err
			})
			if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("whole GPU on a MIG-enabled GPU with backend %s: %v, want %q", tt.backend, err, tt.want)
			}
		})
	}
}
