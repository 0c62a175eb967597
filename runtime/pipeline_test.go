package runtime

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// testTenants are the node's data file: tenants of the tiers that open
// themselves to it (unsigned_tenants).
const testTenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"], "quota": {"sandboxes": 2, "gpu_slices": 3, "memory": "8Gi"}},
  "research": {"tier": "standard",  "namespaces": ["research"], "quota": {"sandboxes": 10, "gpu_slices": 14, "memory": "64Gi"}}
}}}`

// signedTenants are signed into the bundle (policyBundle): platform's tier,
// trusted, keeps to signed tenants, so the data file cannot name it.
const signedTenants = `{"bulkhead": {"tenants": {
  "platform": {"tier": "trusted",   "namespaces": ["platform"]}
}}}`

// policyBundle is the default bundle with signedTenants in its data and
// edits applied, as a security team builds a node's bundle.
func policyBundle(t testing.TB, edits ...policytest.Edit) string {
	t.Helper()
	return policytest.BundleWithTenants(t, signedTenants, edits...)
}

// testPipeline is the real pipeline on the default bundle, a real ledger
// and a mock H200 node, without the fence (no root needed).
func testPipeline(t *testing.T) *Pipeline {
	t.Helper()
	return testPipelineWith(t, nil)
}

// testPipelineWith is testPipeline on testConfig as edit changes it.
func testPipelineWith(t *testing.T, edit func(*config.Config)) *Pipeline {
	t.Helper()
	cfg := testConfig(t)
	if edit != nil {
		edit(&cfg)
	}
	p, err := OpenPipeline(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig is a node's configuration with policyBundle, the tenants of
// testTenants as its data file, two mock H200s and the fence off (it needs
// root; test/e2e runs it), every file in a fresh directory.
func testConfig(t testing.TB) config.Config {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(data, []byte(testTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle := policyBundle(t)
	cfg := config.Default()
	cfg.RunscRoot = filepath.Join(dir, "runsc")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Policy = config.PolicyConfig{Bundle: bundle, InsecureSkipVerification: true, Data: data}
	cfg.MIG = config.MIGConfig{Backend: "mock", MockModel: "h200", MockGPUs: 2, MockState: filepath.Join(dir, "gpus.json")}
	cfg.Netpol.Enabled = false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func sandboxSpec(ns, name string, ann map[string]string) (*node.Sandbox, *specs.Spec) {
	spec := &specs.Spec{Annotations: map[string]string{
		cri.AnnotationContainerType: "sandbox", cri.AnnotationSandboxNamespace: ns, cri.AnnotationSandboxName: name,
	}, Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-" + name},
	}}}
	for k, v := range ann {
		spec.Annotations[k] = v
	}
	sb := SandboxFromSpec(ns+"-"+name, "/bundle", spec)
	sb.CreatedAt, sb.Runtime = time.Now(), policy.RuntimeGVisor
	return sb, spec
}

// place runs Pipeline.Place for sb with a task service that creates and
// deletes nothing, in a bundle directory of its own.
func place(t *testing.T, p *Pipeline, sb *node.Sandbox, spec *specs.Spec) (*Admission, error) {
	t.Helper()
	sb.Bundle = t.TempDir()
	return p.Place(context.Background(), sb, spec, SandboxTask{
		Create: func(context.Context) error { return nil },
		Delete: func(context.Context) error { return nil },
	})
}

func TestAdmitDecidesReservesAndReleases(t *testing.T) {
	p := testPipeline(t)
	ctx := context.Background()
	tests := []struct {
		ns, name string
		ann      map[string]string
		wantErr  []string // substrings of the refusal; nil means admitted
		check    func(t *testing.T, r *node.Reservation, spec *specs.Spec)
	}{
		{ns: "nowhere", name: "x", wantErr: []string{"nowhere/x", "tenant.unknown_namespace"}},
		{ns: "agents", name: "bad", ann: map[string]string{policy.AnnotationGPUCount: "two", policy.AnnotationGPUProfile: "1g.18gb"}, wantErr: []string{policy.AnnotationGPUCount, "integer from 1 to 64"}},
		{ns: "agents", name: "mig", ann: map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}, wantErr: []string{"tenant agents", "gpu.mig_in_gvisor", "nvidia-caps"}},
		{ns: "agents", name: "whole", ann: map[string]string{policy.AnnotationGPUProfile: "whole"}, wantErr: []string{"tenant agents"}},
		{ns: "agents", name: "a1", check: func(t *testing.T, r *node.Reservation, _ *specs.Spec) {
			if r.Tenant != "agents" || r.Tier != "untrusted" || r.State != node.StateActive || r.GPU != nil {
				t.Errorf("reservation %+v", r)
			}
		}},
		{ns: "research", name: "r1", ann: map[string]string{policy.AnnotationGPUProfile: "3g.71gb"}, check: func(t *testing.T, r *node.Reservation, spec *specs.Spec) {
			if r.GPU == nil || !r.GPU.Whole() || r.GPUSlices() != 7 {
				t.Errorf("standard tier MIG request in gVisor: placement %+v, want the whole-GPU fallback", r.GPU)
			}
			var env string
			if spec.Process != nil {
				env = strings.Join(spec.Process.Env, " ")
			}
			if !strings.Contains(env, "NVIDIA_VISIBLE_DEVICES=GPU-") || spec.Annotations[AnnotationGPUPlacement] == "" {
				t.Errorf("GPU not injected: env %q annotations %v", env, spec.Annotations)
			}
		}},
		{ns: "agents", name: "a2"},
		{ns: "agents", name: "a3", wantErr: []string{"quota.sandboxes", "agents"}},
	}
	for _, tt := range tests {
		t.Run(tt.ns+"/"+tt.name, func(t *testing.T) {
			sb, spec := sandboxSpec(tt.ns, tt.name, tt.ann)
			a, err := place(t, p, sb, spec)
			if tt.wantErr != nil {
				var refused *RefusedError
				if !errors.As(err, &refused) {
					t.Fatalf("Admit = %v, want a refusal", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal %q lacks %q", err, w)
					}
				}
				// Nothing is reserved for a refused pod.
				_ = p.node.Ledger().View(func(tx *node.LedgerTx) error {
					if got, _ := tx.Get(sb.ID); got != nil {
						t.Errorf("refused pod left reservation %+v", got)
					}
					return nil
				})
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, a.Reservation, spec)
			}
		})
	}
	// Release gives everything back; releasing twice is harmless.
	for _, id := range []string{"agents-a1", "agents-a2", "research-r1", "research-r1"} {
		if err := p.Node().Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	_ = p.node.Ledger().View(func(tx *node.LedgerTx) error {
		all, _ := tx.List()
		if len(all) != 0 {
			t.Errorf("ledger after release: %d reservations", len(all))
		}
		return nil
	})
}

func TestAdmitInjectedFailuresUnwind(t *testing.T) {
	p := testPipeline(t)
	for _, step := range Steps {
		p.failAt = step
		sb, spec := sandboxSpec("research", "f-"+step, map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
		sb.Bundle = t.TempDir()
		var created, deleted int
		_, err := p.Place(context.Background(), sb, spec, SandboxTask{
			Create: func(context.Context) error { created++; return nil },
			Delete: func(context.Context) error { deleted++; return nil },
		})
		if err == nil || !strings.Contains(err.Error(), "injected failure") {
			t.Fatalf("step %s: Place = %v", step, err)
		}
		// The sandbox is deleted exactly when it was created.
		if created != deleted {
			t.Errorf("step %s: sandbox created %d times, deleted %d", step, created, deleted)
		}
		_ = p.node.Ledger().View(func(tx *node.LedgerTx) error {
			if all, _ := tx.List(); len(all) != 0 {
				t.Errorf("step %s left %d reservations", step, len(all))
			}
			return nil
		})
		if insts, _ := p.node.Backend().Instances(); len(insts) != 0 {
			t.Errorf("step %s left MIG instances %+v", step, insts)
		}
	}
}

func TestRDMAGrantFollowsPolicyAndRequest(t *testing.T) {
	p := testPipelineWith(t, func(cfg *config.Config) {
		cfg.RDMA.TenantVFs = map[string][]string{"research": {"/dev/infiniband/uverbs3"}}
	})
	for _, tt := range []struct {
		ns, name, rdma string
		want           bool
	}{
		{"research", "asks", "true", true}, // standard tier: own-vf
		{"research", "silent", "", false},  // not asked
		{"agents", "asks", "true", false},  // untrusted: deny (the policy may refuse outright)
	} {
		ann := map[string]string{}
		if tt.rdma != "" {
			ann[policy.AnnotationRDMA] = tt.rdma
		}
		sb, spec := sandboxSpec(tt.ns, tt.name, ann)
		a, err := place(t, p, sb, spec)
		if err != nil {
			if tt.want {
				t.Fatalf("%s/%s: %v", tt.ns, tt.name, err)
			}
			continue
		}
		g := p.RDMAGrant(a, sb)
		if g.Allowed != tt.want {
			t.Errorf("%s/%s: grant %+v, want allowed=%v", tt.ns, tt.name, g, tt.want)
		}
		if g.Allowed && (len(g.Devices) != 1 || g.Devices[0] != "/dev/infiniband/uverbs3") {
			t.Errorf("%s/%s: devices %v, want the tenant's VF", tt.ns, tt.name, g.Devices)
		}
	}
}

// A node configured to verify bundles refuses to place pods with an
// unsigned one: the pipeline does not open, so the shim refuses the pod.
func TestPipelineRefusesUnsignedBundle(t *testing.T) {
	dir := t.TempDir()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	bundle, _ := filepath.Abs("../rego")
	cfg := config.Default()
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Netpol.Enabled = false
	cfg.Policy = config.PolicyConfig{Bundle: bundle, KeyFile: keyFile, KeyID: "bulkhead", Scope: "bulkhead"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err = OpenPipeline(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "policy") {
		t.Fatalf("OpenPipeline with an unsigned bundle = %v, want a policy verification error", err)
	}
	t.Logf("refused: %v", err)
}

// TestPodRefusedWhenTheFenceCannotLoad: with the fence on (the default), a
// node whose fence cannot be loaded opens no pipeline, so the shim refuses
// every pod rather than run it unfenced.
func TestPodRefusedWhenTheFenceCannotLoad(t *testing.T) {
	dir := t.TempDir()
	notADir := filepath.Join(dir, "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(data, []byte(testTenants), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle, _ := filepath.Abs("../rego")
	cfg := config.Default()
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Policy = config.PolicyConfig{Bundle: bundle, InsecureSkipVerification: true, Data: data}
	cfg.Netpol.PinDir = filepath.Join(notADir, "bulkhead") // bpffs cannot be mounted on a file
	if !cfg.Netpol.Enabled {
		t.Fatal("the fence must be on by default")
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenPipeline(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "netpol") {
		t.Fatalf("OpenPipeline with a fence that cannot load = %v, want a netpol error", err)
	}
}

// nodeDecider records the node of the last input it decided.
type nodeDecider struct {
	policy.Decider
	node *policy.Node
}

func (d *nodeDecider) Decide(ctx context.Context, in policy.Input) (policy.Decision, error) {
	d.node = in.Node
	return d.Decider.Decide(ctx, in)
}

func (d *nodeDecider) Unwrap() policy.Decider { return d.Decider }

// TestPlaceNamesTheNode: the policy input of a placement names the node
// (agent.node_name, else $NODE_NAME as the DaemonSet sets it), so that
// refusals such as [gpu.no_capacity] say which node.
func TestPlaceNamesTheNode(t *testing.T) {
	for _, tc := range []struct{ name, configured, env, want string }{
		{"agent.node_name", "node-7", "node-from-env", "node-7"},
		{"NODE_NAME", "", "node-from-env", "node-from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			base := testPipelineWith(t, func(c *config.Config) { c.Agent.NodeName = tc.configured })
			d := &nodeDecider{Decider: base.decider}
			sb, spec := sandboxSpec("research", "named", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
			if _, err := place(t, NewPipeline(base.node, d), sb, spec); err != nil {
				t.Fatal(err)
			}
			if d.node == nil || d.node.Name != tc.want {
				t.Errorf("the placement's input names node %+v, want %q", d.node, tc.want)
			}
		})
	}
}
