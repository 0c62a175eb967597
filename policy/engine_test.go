package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func ruleIDs(d Decision) []string {
	ids := make([]string, len(d.Reasons))
	for i, r := range d.Reasons {
		ids[i] = r.Rule
	}
	return ids
}

func TestDecideDefaultBundle(t *testing.T) {
	e := openDefault(t)
	tests := []struct {
		name     string
		edit     func(in *Input)
		allow    bool
		rules    []string
		runtime  string
		tier     string
		rdma     string
		egress   []string
		warnings int
	}{
		{name: "untrusted agent with 1g slice in gVisor", edit: func(in *Input) { in.Request.GPU = &GPURequest{Profile: "1g.18gb", Count: 1} }, rules: []string{"gpu.mig_in_gvisor"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted empty handler", edit: func(in *Input) { in.Pod.RuntimeHandler = "" }, rules: []string{"runtime.handler_required"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted runc", edit: func(in *Input) { in.Pod.RuntimeHandler = "runc" }, rules: []string{"runtime.runc_forbidden"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted whole GPU", edit: func(in *Input) { in.Request.GPU = &GPURequest{Profile: "whole", Count: 1} }, rules: []string{"gpu.max_slices", "gpu.whole_forbidden", "quota.gpu_slices"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted 4g slice", edit: func(in *Input) { in.Request.GPU = &GPURequest{Profile: "4g.71gb", Count: 1} }, rules: []string{"gpu.mig_in_gvisor", "gpu.profile_too_large"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted 3g slice", edit: func(in *Input) { in.Request.GPU = &GPURequest{Profile: "3g.71gb", Count: 1} }, rules: []string{"gpu.mig_in_gvisor"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted RDMA", edit: func(in *Input) { in.Request.RDMA = true }, rules: []string{"rdma.forbidden"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted privileged", edit: func(in *Input) { in.Pod.Containers[0].Privileged = true }, rules: []string{"workload.privileged"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted host network", edit: func(in *Input) { in.Pod.HostNetwork = true }, rules: []string{"workload.host_namespace"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "untrusted unpinned image warns", edit: func(in *Input) { in.Pod.Containers[0].Image = "busybox" }, allow: true, rules: []string{"workload.image_unpinned"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}, warnings: 1},
		{name: "sandbox quota", edit: func(in *Input) { in.Usage.Sandboxes = 20 }, rules: []string{"quota.sandboxes"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "GPU slice quota", edit: func(in *Input) { in.Usage.GPUSlices, in.Request.GPU = 6, &GPURequest{Profile: "1g.18gb", Count: 1} }, rules: []string{"gpu.mig_in_gvisor", "quota.gpu_slices"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "memory quota", edit: func(in *Input) { in.Usage.MemoryBytes = 64 << 30 }, rules: []string{"quota.memory"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "unknown namespace", edit: func(in *Input) { in.Namespace = "default"; in.Request.GPU = nil }, rules: []string{"tenant.unknown_namespace"}, runtime: RuntimeGVisor, rdma: RDMADeny, egress: []string{}},
		{name: "identity annotation lies", edit: func(in *Input) { in.Pod.Annotations = map[string]string{"bulkhead.dev/tier": "trusted"} }, rules: []string{"identity.annotation_mismatch"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
		{name: "standard whole GPU and RDMA", edit: func(in *Input) {
			in.Namespace, in.Request.GPU, in.Request.RDMA = "research", &GPURequest{Profile: "whole", Count: 1}, true
		}, allow: true, runtime: RuntimeGVisor, tier: "standard", rdma: RDMAOwnVF},
		{name: "standard runc", edit: func(in *Input) { in.Namespace, in.Pod.RuntimeHandler = "research", "runc" }, rules: []string{"runtime.runc_forbidden"}, runtime: RuntimeGVisor, tier: "standard", rdma: RDMADeny},
		{name: "trusted runc is audited", edit: func(in *Input) { in.Namespace, in.Pod.RuntimeHandler = "platform", "runc" }, allow: true, rules: []string{"runtime.runc_used"}, runtime: RuntimeRunc, tier: "trusted", rdma: RDMADeny},
		{name: "wrong contract version", edit: func(in *Input) { in.Version = "v0" }, rules: []string{"input.version_unsupported"}, runtime: RuntimeGVisor, tier: "untrusted", rdma: RDMADeny, egress: []string{"10.96.0.0/12"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := agentPod()
			tt.edit(&in)
			d, err := e.Decide(context.Background(), in)
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			if d.Allow != tt.allow {
				t.Errorf("allow = %v, want %v (reasons %+v)", d.Allow, tt.allow, d.Reasons)
			}
			if got := ruleIDs(d); !slices.Equal(got, tt.rules) && !(len(got) == 0 && len(tt.rules) == 0) {
				t.Errorf("rules = %v, want %v", got, tt.rules)
			}
			if d.Runtime != tt.runtime || d.Tier != tt.tier || d.RDMA != tt.rdma {
				t.Errorf("runtime/tier/rdma = %s/%s/%s, want %s/%s/%s", d.Runtime, d.Tier, d.RDMA, tt.runtime, tt.tier, tt.rdma)
			}
			if (d.Network.EgressCIDRs == nil) != (tt.egress == nil) || !slices.Equal(d.Network.EgressCIDRs, tt.egress) {
				t.Errorf("egress = %#v, want %#v", d.Network.EgressCIDRs, tt.egress)
			}
			if len(d.Warnings) != tt.warnings {
				t.Errorf("warnings = %v, want %d", d.Warnings, tt.warnings)
			}
			if d.ID == "" || d.Revision != "bulkhead-default-1" {
				t.Errorf("id/revision = %q/%q", d.ID, d.Revision)
			}
			for _, r := range d.Reasons {
				if r.Message == "" || r.Enforcement == "" {
					t.Errorf("reason %+v lacks message or enforcement", r)
				}
			}
		})
	}
}

func TestQuotaMessageNamesTenantUsedAndLimit(t *testing.T) {
	e := openDefault(t)
	in := agentPod()
	in.Usage.Sandboxes = 20
	d, _ := e.Decide(context.Background(), in)
	if len(d.Reasons) != 1 {
		t.Fatalf("reasons = %+v", d.Reasons)
	}
	want := `tenant "agents" runs 20 sandboxes; one more exceeds its quota of 20`
	if d.Reasons[0].Message != want {
		t.Errorf("message = %q, want %q", d.Reasons[0].Message, want)
	}
}

// TestAstInputMatchesJSON checks that the hand-built Rego input equals the
// JSON encoding of Input, which is what `opa eval --input` would see and
// what the decision log writes (it reads the Rego value back).
func TestAstInputMatchesJSON(t *testing.T) {
	full := agentPod()
	full.Pod.Annotations = map[string]string{"a": "1", "b/c": "2"}
	full.Pod.Labels = map[string]string{"app": "x"}
	full.Pod.HostIPC, full.Pod.HostPID, full.Pod.HostNetwork = true, true, true
	full.Pod.Containers = append(full.Pod.Containers, Container{Name: "side", Privileged: true, Devices: []string{"/dev/kvm"}, Env: map[string]string{"K": "v"}, MemoryBytes: 5 << 40},
		Container{Name: "debug", Ephemeral: true, Mounts: []Mount{{HostPath: "/", Path: "/host", ReadOnly: true}, {HostPath: "/var/log"}},
			AddedCapabilities: []string{"SYS_ADMIN", "NET_RAW"}, HostPorts: []int32{80, 443}, SeccompProfile: "Unconfined", AppArmorProfile: "Unconfined"})
	full.Pod.Volumes = []Volume{{Name: "root", Type: "hostPath", HostPath: "/"}, {Name: "scratch", Type: "emptyDir"}, {Name: "pv-1", Type: "nfs", MayBeClaim: true}}
	full.Pod.Sysctls = map[string]string{"net.core.somaxconn": "1024"}
	full.Request.RDMA = true
	full.Pod.ResourceClaims = []ResourceClaim{
		{Name: "gpus", TemplateName: "all-gpus", Read: true, Requests: []DeviceRequest{{Name: "gpu", DeviceClass: "gpu.nvidia.com", AllocationMode: "All"}}},
		{Name: "shared", ClaimName: "team-gpu", Read: true, Requests: []DeviceRequest{{Name: "x/a", DeviceClass: "gpu.example.com", AllocationMode: "ExactCount", Count: 2}, {Name: "x/b", DeviceClass: "mig.nvidia.com"}}},
		{Name: "unread", TemplateName: "t"},
	}
	full.Node.GPUs[0].Tenants = []string{"x"}
	cases := map[string]Input{"zero": {}, "agent": agentPod(), "full": full}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		cases[fmt.Sprintf("drawn-%d", i)] = randomInput(r)
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := astValueFromJSON(b)
			if err != nil {
				t.Fatal(err)
			}
			if got := in.astValue(); got.Compare(want) != 0 {
				t.Errorf("astValue = %v\nJSON     = %v", got, want)
			}
		})
	}
}

// failBundle answers according to input.namespace so one bundle can show
// every fail-closed path; the probe input (namespace "") gets a valid answer.
const failBundle = `package bulkhead

valid := {
	"allow": true, "reasons": [], "tenant": "", "tier": "", "runtime": "gvisor",
	"gpu": {"allowed_profiles": [], "max_slices": 0, "whole_gpu": false, "exclusive_physical_gpu": true, "mig_in_sandbox": "refuse"},
	"network": {"isolation": "tenant", "egress_cidrs": [], "deny_metadata": true},
	"rdma": "deny", "warnings": [],
}

decision := valid if input.namespace == ""

decision := valid if {
	input.namespace == "error"
	units.parse_bytes("not a size")
}

decision := object.union(valid, {"runtime": "kata"}) if input.namespace == "shape"

decision := object.union(valid, {"reasons": [{"rule": "x.y", "message": "m", "enforcement": "deny"}]}) if input.namespace == "lying"

decision := object.union(valid, {"gpu": {"max_slices": "7"}}) if input.namespace == "string-number"

decision := object.remove(valid, ["network"]) if input.namespace == "missing"
`

func TestDecideFailsClosed(t *testing.T) {
	dir := writeBundleDir(t, map[string]string{"decision.rego": failBundle})
	e, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		namespace string
		rule      string
		detail    string
	}{
		{"undefined", RuleUndefined, "undefined"},
		{"error", RuleError, "parse_bytes"},
		{"shape", RuleShape, `decision.runtime: "kata" is not one of`},
		{"lying", RuleShape, "allow is true although a deny reason fired"},
		{"string-number", RuleShape, "decision.gpu.max_slices: want a number, got a string"},
		{"missing", RuleShape, "decision.network: want an object"},
	}
	for _, tt := range tests {
		t.Run(tt.namespace, func(t *testing.T) {
			d, err := e.Decide(context.Background(), Input{Version: ContractVersion, Kind: KindSandbox, Namespace: tt.namespace})
			if err == nil {
				t.Fatal("Decide returned no error")
			}
			if d.Allow {
				t.Fatal("fail-closed decision allows")
			}
			if len(d.Reasons) != 1 || d.Reasons[0].Rule != tt.rule || d.Reasons[0].Enforcement != EnforceDeny {
				t.Fatalf("reasons = %+v, want one %s deny", d.Reasons, tt.rule)
			}
			if !strings.Contains(d.Reasons[0].Message, tt.detail) {
				t.Errorf("message %q does not mention %q", d.Reasons[0].Message, tt.detail)
			}
			if d.Runtime != RuntimeGVisor || d.RDMA != RDMADeny || !d.Network.DenyMetadata || d.Network.EgressCIDRs == nil || d.ID == "" || d.Revision == "" {
				t.Errorf("fail-closed decision is not the most restrictive one: %+v", d)
			}
		})
	}
	// The probe input itself is fine.
	if d, err := e.Decide(context.Background(), Input{Version: ContractVersion, Kind: KindSandbox}); err != nil || !d.Allow {
		t.Errorf("valid answer: %+v, %v", d, err)
	}
}

func TestDecideCancelledContextFailsClosed(t *testing.T) {
	e := openDefault(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := e.Decide(ctx, agentPod())
	if err == nil || d.Allow || d.Reasons[0].Rule != RuleError {
		t.Fatalf("cancelled Decide = %+v, %v", d, err)
	}
}

func TestOpenRefusesNonDeterministicBuiltins(t *testing.T) {
	for _, call := range []string{
		`http.send({"method": "GET", "url": "http://169.254.169.254/"})`,
		`net.lookup_ip_addr("example.org")`,
		`time.now_ns()`,
		`rand.intn("x", 10)`,
		`uuid.rfc4122("x")`,
		`opa.runtime()`,
	} {
		name := call[:strings.Index(call, "(")]
		t.Run(name, func(t *testing.T) {
			dir := writeBundleDir(t, map[string]string{"x.rego": "package bulkhead\n\nx := " + call + "\n\ndecision := {}\n"})
			_, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Fatalf("Open = %v, want an error naming %s", err, name)
			}
		})
	}
}

func TestOpenRefusesBundleWithoutDecision(t *testing.T) {
	dir := writeBundleDir(t, map[string]string{"x.rego": "package bulkhead\n\nallow := true\n"})
	_, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), RuleUndefined) {
		t.Fatalf("Open = %v, want the probe to refuse an undefined decision", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	dir := t.TempDir()
	kp := newKeyPair(t, dir, "k")
	rego := repoPath(t, "rego")
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no bundle", Options{InsecureSkipVerification: true}, "BundlePath is required"},
		{"missing bundle", Options{BundlePath: filepath.Join(dir, "nope"), InsecureSkipVerification: true}, "BundlePath"},
		{"no keys", Options{BundlePath: rego}, "Keys is required"},
		{"no key id", Options{BundlePath: rego, Keys: map[string]string{"k": kp.pubPath}, Scope: "s"}, "KeyID is required"},
		{"unknown key id", Options{BundlePath: rego, Keys: map[string]string{"k": kp.pubPath}, KeyID: "j", Scope: "s"}, `KeyID "j" is not a key`},
		{"no scope", Options{BundlePath: rego, Keys: map[string]string{"k": kp.pubPath}, KeyID: "k"}, "Scope is required"},
		{"insecure and keys", Options{BundlePath: rego, Keys: map[string]string{"k": kp.pubPath}, KeyID: "k", InsecureSkipVerification: true}, "choose one"},
		{"bad algorithm", Options{BundlePath: rego, Keys: map[string]string{"k": kp.pubPath}, KeyID: "k", Scope: "s", KeyAlgorithm: "none"}, "KeyAlgorithm"},
		{"key not PEM", Options{BundlePath: rego, Keys: map[string]string{"k": filepath.Join(dir, "missing.pem")}, KeyID: "k", Scope: "s"}, `Keys["k"]`},
		{"private key given", Options{BundlePath: rego, Keys: map[string]string{"k": kp.privPath}, KeyID: "k", Scope: "s"}, "not a public key"},
		{"negative log size", Options{BundlePath: rego, InsecureSkipVerification: true, DecisionLogMaxBytes: -1}, "DecisionLogMaxBytes"},
		{"negative backups", Options{BundlePath: rego, InsecureSkipVerification: true, DecisionLogBackups: -1}, "DecisionLogBackups"},
		{"missing data", Options{BundlePath: rego, InsecureSkipVerification: true, DataPath: filepath.Join(dir, "nope.json")}, "DataPath"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.Logger = quietLogger()
			_, err := Open(context.Background(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open = %v, want error containing %q", err, tt.want)
			}
		})
	}
}

func TestDataPathMerge(t *testing.T) {
	dir := t.TempDir()
	conflict := filepath.Join(dir, "conflict.json")
	if err := os.WriteFile(conflict, []byte(`{"bulkhead": {"default_handler_runtime": "gvisor"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	notObject := filepath.Join(dir, "array.json")
	if err := os.WriteFile(notObject, []byte(`[1]`), 0o644); err != nil {
		t.Fatal(err)
	}
	file := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name, tc := range map[string]struct{ path, want string }{
		"redefines a bundle value": {conflict, `key "bulkhead.default_handler_runtime": only bulkhead.tenants may come from outside the signed bundle`},
		"not an object":            {notObject, "want a JSON object"},
		// Unsigned data must never weaken the signed policy.
		"downgrades enforcement": {file("enf.json", `{"bulkhead": {"tenants": {}, "enforcement": {"workload.host_path": "audit"}}}`), `key "bulkhead.enforcement"`},
		"redefines a tier":       {file("tiers.json", `{"bulkhead": {"tiers": {"untrusted": {"allowed_host_paths": ["/"]}}}}`), `key "bulkhead.tiers"`},
		"remaps handlers":        {file("handlers.json", `{"bulkhead": {"handlers": {"runc": "gvisor"}}}`), `key "bulkhead.handlers"`},
		"outside bulkhead":       {file("other.json", `{"system": {"x": 1}}`), `key "system"`},
		"bulkhead not an object": {file("str.json", `{"bulkhead": "x"}`), `want an object holding only "tenants"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Open(context.Background(), Options{BundlePath: repoPath(t, "rego"), DataPath: tc.path, InsecureSkipVerification: true, Logger: quietLogger()})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Open = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSignedBundles(t *testing.T) {
	dir := t.TempDir()
	ops := newKeyPair(t, dir, "ops")
	rogue := newKeyPair(t, dir, "rogue")
	rego := repoPath(t, "rego")
	tests := []struct {
		name   string
		build  func(out string)
		keys   map[string]string
		scope  string
		want   string // "" means it loads
		revise func(out string)
	}{
		{name: "signed", build: func(out string) { buildBundle(t, rego, out, &ops, "ops", "cluster-a") }},
		{name: "key given as PEM text", build: func(out string) { buildBundle(t, rego, out, &ops, "ops", "cluster-a") }, keys: map[string]string{"ops": ops.pubPEM}},
		{name: "unsigned", build: func(out string) { buildBundle(t, rego, out, nil, "", "") }, want: "missing .signatures.json"},
		{name: "other scope", build: func(out string) { buildBundle(t, rego, out, &ops, "ops", "cluster-b") }, want: `scope mismatch: this node enforces scope "cluster-a", the bundle's signature carries "cluster-b"`},
		{name: "signed by another key under our id", build: func(out string) { buildBundle(t, rego, out, &rogue, "ops", "cluster-a") }, want: "failed to verify"},
		{name: "signed by a key id we do not trust", build: func(out string) { buildBundle(t, rego, out, &rogue, "rogue", "cluster-a") }, want: "failed to verify"},
		{name: "tampered data", build: func(out string) {
			buildBundle(t, rego, out, &ops, "ops", "cluster-a")
			rewriteTar(t, out, func(name string, c []byte) []byte {
				if strings.HasSuffix(name, "data.json") {
					var data map[string]any
					if err := json.Unmarshal(c, &data); err != nil {
						t.Fatal(err)
					}
					data["bulkhead"].(map[string]any)["tiers"].(map[string]any)["untrusted"].(map[string]any)["rdma"] = "own-vf"
					c, _ = json.Marshal(data)
				}
				return c
			})
		}, want: "digest mismatch"},
		{name: "file added after signing", build: func(out string) {
			buildBundle(t, rego, out, &ops, "ops", "cluster-a")
			rewriteTar(t, out, func(name string, c []byte) []byte {
				if strings.HasSuffix(name, "rdma.rego") {
					return append(c, []byte("\nallow_all := true\n")...)
				}
				return c
			})
		}, want: "digest mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "bundle.tar.gz")
			tt.build(out)
			keys := tt.keys
			if keys == nil {
				keys = map[string]string{"ops": ops.pubPath}
			}
			e, err := Open(context.Background(), Options{
				BundlePath: out, Keys: keys, KeyID: "ops", Scope: "cluster-a",
				DataPath: repoPath(t, "rego/examples/tenants.demo.json"), Logger: quietLogger(),
			})
			if tt.want != "" {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("Open = %v, want refusal containing %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			d, err := e.Decide(context.Background(), agentPod())
			if err != nil || !d.Allow || d.Revision != "bulkhead-default-1" {
				t.Fatalf("Decide = %+v, %v", d, err)
			}
		})
	}
}

func TestReloadKeepsLastGoodBundle(t *testing.T) {
	dir := t.TempDir()
	ops := newKeyPair(t, dir, "ops")
	rogue := newKeyPair(t, dir, "rogue")
	src := writeBundleDir(t, map[string]string{
		".manifest":     `{"revision": "r1", "roots": ["bulkhead"]}`,
		"decision.rego": strings.Replace(failBundle, `input.namespace == ""`, `input.namespace != "nothing-matches"`, 1),
	})
	out := filepath.Join(dir, "bundle.tar.gz")
	buildBundle(t, src, out, &ops, "ops", "s")
	e, err := Open(context.Background(), Options{BundlePath: out, Keys: map[string]string{"ops": ops.pubPath}, KeyID: "ops", Scope: "s", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	setRevision := func(rev string) {
		if err := os.WriteFile(filepath.Join(src, ".manifest"), []byte(`{"revision": "`+rev+`", "roots": ["bulkhead"]}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name    string
		prepare func()
		wantErr string
		wantRev string
	}{
		{"good update", func() { setRevision("r2"); buildBundle(t, src, out, &ops, "ops", "s") }, "", "r2"},
		{"rogue signature", func() { setRevision("r3"); buildBundle(t, src, out, &rogue, "ops", "s") }, "failed to verify", "r2"},
		{"truncated file", func() {
			if err := os.WriteFile(out, []byte("not gzip"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "bundle read failed", "r2"},
		{"compile error", func() {
			if err := os.WriteFile(filepath.Join(src, "bad.rego"), []byte("package bulkhead\n\ndecision := x\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			setRevision("r4")
			buildBundle(t, src, out, &ops, "ops", "s")
		}, "revision r4", "r2"},
		{"fixed", func() {
			os.Remove(filepath.Join(src, "bad.rego"))
			setRevision("r5")
			buildBundle(t, src, out, &ops, "ops", "s")
		}, "", "r5"},
	}
	for _, st := range steps {
		st.prepare()
		err := e.Reload(context.Background())
		if st.wantErr == "" && err != nil {
			t.Fatalf("%s: Reload: %v", st.name, err)
		}
		if st.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), st.wantErr) || !strings.Contains(err.Error(), "revision "+st.wantRev+" stays active") {
				t.Fatalf("%s: Reload = %v, want %q and the active revision %s", st.name, err, st.wantErr, st.wantRev)
			}
		}
		if got := e.Revision(); got != st.wantRev {
			t.Fatalf("%s: Revision = %s, want %s", st.name, got, st.wantRev)
		}
		d, err := e.Decide(context.Background(), Input{Version: ContractVersion, Kind: KindSandbox})
		if err != nil || d.Revision != st.wantRev {
			t.Fatalf("%s: Decide after reload = %+v, %v", st.name, d, err)
		}
	}
}

// TestConcurrentDecideAndReload runs decisions while bundles swap; every
// decision must come from one whole revision. Run with -race in CI.
func TestConcurrentDecideAndReload(t *testing.T) {
	e := openDefault(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				d, err := e.Decide(ctx, agentPod())
				if err != nil || !d.Allow || d.Revision != "bulkhead-default-1" {
					errs <- errors.New("bad decision during reload: " + d.Revision)
					return
				}
			}
		}()
	}
	for i := 0; i < 3; i++ {
		if err := e.Reload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
