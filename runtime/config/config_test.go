package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr string // substring; empty means success
		check   func(t *testing.T, c Config)
	}{
		{
			name: "defaults with an insecure dev bundle",
			doc:  "[policy]\nbundle = \"/etc/bulkhead/bundle\"\ninsecure_skip_verification = true\n",
			check: func(t *testing.T, c Config) {
				if c.RunscPath != "/usr/local/bin/runsc" || c.Runsc.Platform != "systrap" || !c.Pipeline.Enabled {
					t.Errorf("defaults not applied: %+v", c)
				}
				if got := c.PlanCacheKeyPath(); got != "/var/lib/bulkhead/plan-cache.key" {
					t.Errorf("plan cache key %q, want /var/lib/bulkhead/plan-cache.key", got)
				}
			},
		},
		{
			name: "pipeline off needs no policy",
			doc:  "[pipeline]\nenabled = false\nbenchmark_baseline = true\n",
		},
		{
			name: "every key",
			doc: `runsc_path = "/opt/runsc"
runsc_root = "/run/x/runsc"
state_dir = "/run/x"
ledger_path = "/var/lib/x/ledger.db"
debug = true
log_dir = "/var/log/bulkhead"
[runsc]
platform = "ptrace"
network = "none"
extra_flags = ["--overlay2=none", "watchdog-action=panic", "--strace"]
[policy]
bundle = "/etc/bulkhead/bundle.tar.gz"
key_file = "/etc/bulkhead/key.pem"
key_id = "bulkhead"
scope = "bulkhead"
[pipeline]
enabled = true
`,
			check: func(t *testing.T, c Config) {
				f := c.RunscFlags()
				want := map[string]string{"platform": "ptrace", "network": "none", "overlay2": "none", "watchdog-action": "panic", "strace": "true"}
				for k, v := range want {
					if f[k] != v {
						t.Errorf("flag %s = %q, want %q", k, f[k], v)
					}
				}
			},
		},
		{name: "unknown top-level key", doc: "runsc_pth = \"/x\"\n", wantErr: "unknown key(s) runsc_pth"},
		{name: "unknown nested key", doc: "[runsc]\nplatfrom = \"kvm\"\n", wantErr: "unknown key(s) runsc.platfrom"},
		{name: "bad platform", doc: "[runsc]\nplatform = \"xen\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: `runsc.platform: "xen" is not one of`},
		{name: "bad network", doc: "[runsc]\nnetwork = \"bridge\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: `runsc.network: "bridge"`},
		{name: "relative path", doc: "runsc_path = \"runsc\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: "runsc_path: \"runsc\" must be an absolute path"},
		{name: "empty state dir", doc: "state_dir = \"\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: "state_dir: must be set"},
		{name: "reserved flag", doc: "[runsc]\nextra_flags = [\"--root=/tmp\"]\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: `runsc.extra_flags[0]: "root" is set by Bulkhead`},
		{name: "malformed flag", doc: "[runsc]\nextra_flags = [\"--\"]\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: "runsc.extra_flags[0]"},
		{name: "pipeline without policy", doc: "", wantErr: "policy.bundle: must be set"},
		{name: "rdma vf outside /dev/infiniband", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[rdma.tenant_vfs]\nresearch = [\"/dev/sda\"]\n", wantErr: `rdma.tenant_vfs.research[0]: "/dev/sda" must be under /dev/infiniband`},
		{name: "bad mig backend", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[mig]\nbackend = \"cuda\"\n", wantErr: `mig.backend: "cuda" is not one of`},
		{name: "bad policy evaluator", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[policy]\nevaluator = \"wasm\"\n", wantErr: `policy.evaluator: "wasm" is not one of plan, topdown`},
		{name: "bad cluster cidr", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[netpol]\ncluster_cidrs = [\"10.0.0.0/33\"]\n", wantErr: `netpol.cluster_cidrs[0]`},
		{name: "bundle without key", doc: "[policy]\nbundle = \"/b\"\n", wantErr: "policy.key_file and policy.key_id"},
		{
			name: "plan cache key beside a moved ledger",
			doc:  "ledger_path = \"/var/lib/x/ledger.db\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n",
			check: func(t *testing.T, c Config) {
				if got := c.PlanCacheKeyPath(); got != "/var/lib/x/plan-cache.key" {
					t.Errorf("plan cache key %q, want /var/lib/x/plan-cache.key", got)
				}
			},
		},
		{name: "plan cache key under state_dir", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[policy]\nplan_cache_key = \"/run/bulkhead/keys/plan.key\"\n", wantErr: `policy.plan_cache_key: "/run/bulkhead/keys/plan.key" lies under state_dir "/run/bulkhead"`},
		{name: "plan cache key under state_dir, unclean", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[policy]\nplan_cache_key = \"/var/../run//bulkhead/plan.key\"\n", wantErr: "lies under state_dir"},
		{name: "default plan cache key under state_dir", doc: "ledger_path = \"/run/bulkhead/ledger.db\"\n[pipeline]\nenabled=false\nbenchmark_baseline=true\n", wantErr: "policy.plan_cache_key (unset: plan-cache.key beside ledger_path)"},
		{name: "relative plan cache key", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[policy]\nplan_cache_key = \"plan.key\"\n", wantErr: `policy.plan_cache_key: "plan.key" must be an absolute path`},
		{
			name: "dra on a mock GPU node, kubelet's default directories",
			doc:  "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[mig]\nbackend = \"mock\"\n[dra]\nenabled = true\n",
			check: func(t *testing.T, c Config) {
				if !c.DRA.Enabled || c.DRA.RegistrarDir != "/var/lib/kubelet/plugins_registry" || c.DRA.PluginDir != "/var/lib/kubelet/plugins/mig.bulkhead.dev" {
					t.Errorf("dra %+v, want enabled with the kubelet's default directories", c.DRA)
				}
			},
		},
		{name: "dra without a MIG backend", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[dra]\nenabled = true\n", wantErr: "dra.enabled: true needs a MIG backend"},
		{name: "dra without CDI specs", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[mig]\nbackend = \"nvml\"\ncdi_spec_dir = \"\"\n[dra]\nenabled = true\n", wantErr: "dra.enabled: true needs mig.cdi_spec_dir"},
		{name: "dra relative plugin dir", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[mig]\nbackend = \"nvml\"\n[dra]\nenabled = true\nplugin_dir = \"plugins/x\"\n", wantErr: `dra.plugin_dir: "plugins/x" must be an absolute path`},
		{name: "dra relative registrar dir", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[mig]\nbackend = \"nvml\"\n[dra]\nenabled = true\nregistrar_dir = \"\"\n", wantErr: `dra.registrar_dir: "" must be an absolute path`},
		{name: "dra off ignores its directories", doc: "[pipeline]\nenabled=false\nbenchmark_baseline=true\n[dra]\nplugin_dir = \"x\"\n"},
		{name: "unknown dra key", doc: "[dra]\nenable = true\n", wantErr: "unknown key(s) dra.enable"},
		{name: "wrong type", doc: "debug = \"yes\"\n", wantErr: "line 1"},
		{name: "not toml", doc: "[runsc\n", wantErr: "line"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.doc))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("bogus = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("error = %v, want the path and the key", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.toml")); err == nil {
		t.Fatal("missing file: want an error")
	}
}

func TestConfigPathFromEnvironment(t *testing.T) {
	t.Setenv(PathEnv, "")
	if got := Path(); got != DefaultPath {
		t.Errorf("Path() = %q, want default", got)
	}
	t.Setenv(PathEnv, "/tmp/x.toml")
	if got := Path(); got != "/tmp/x.toml" {
		t.Errorf("Path() = %q", got)
	}
}

// TestDeployedConfigFencesTheNode loads the configuration every node
// installed from deploy/ runs with: its fence must be on, with the cluster's
// ranges and per-tier shared services filled in.
func TestDeployedConfigFencesTheNode(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "deploy", "node", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Netpol.Enabled {
		t.Fatal("deploy/node/config.toml: netpol.enabled is false: nodes installed from deploy/ would run unfenced")
	}
	cluster, shared, err := cfg.Netpol.ClusterPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	if len(cluster) == 0 {
		t.Error("deploy/node/config.toml: netpol.cluster_cidrs is empty")
	}
	for _, tier := range []string{"untrusted", "standard", "trusted"} {
		if len(shared[tier]) == 0 {
			t.Errorf("deploy/node/config.toml: netpol.shared_services.%s is empty", tier)
		}
	}
}

// TestFenceIsOnUnlessTurnedOff: a file without [netpol] gets the fence; only
// an explicit enabled = false turns it off.
func TestFenceIsOnUnlessTurnedOff(t *testing.T) {
	for doc, want := range map[string]bool{
		"[pipeline]\nenabled = false\nbenchmark_baseline = true\n":                            true,
		"[pipeline]\nenabled = false\nbenchmark_baseline = true\n[netpol]\n":                  true,
		"[pipeline]\nenabled = false\nbenchmark_baseline = true\n[netpol]\nenabled = false\n": false,
	} {
		cfg, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Netpol.Enabled != want {
			t.Errorf("%q: netpol.enabled = %v, want %v", doc, cfg.Netpol.Enabled, want)
		}
	}
}

// TestValidateForUse: a command that only reads the node's state validates
// what it reads. The policy, runsc and RDMA keys it never uses cannot stop
// it; the keys it does read, and unknown keys, still do.
func TestValidateForUse(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		shimErr  string // substring; empty means valid for the shim
		stateErr string // substring; empty means valid for UseNodeState
	}{
		{name: "bundle without key", doc: "[policy]\nbundle = \"/b\"\n", shimErr: "policy.key_file and policy.key_id"},
		{name: "pipeline without policy", doc: "", shimErr: "policy.bundle: must be set"},
		{name: "bad evaluator", doc: "[policy]\nbundle = \"/b\"\ninsecure_skip_verification = true\nevaluator = \"wasm\"\n", shimErr: "policy.evaluator"},
		{name: "bad platform", doc: "[pipeline]\nenabled = false\nbenchmark_baseline = true\n[runsc]\nplatform = \"xen\"\n", shimErr: "runsc.platform"},
		{name: "rdma vf outside /dev/infiniband", doc: "[pipeline]\nenabled = false\nbenchmark_baseline = true\n[rdma.tenant_vfs]\nr = [\"/dev/sda\"]\n", shimErr: "rdma.tenant_vfs.r[0]"},
		{name: "relative ledger", doc: "ledger_path = \"l.db\"\n[pipeline]\nenabled = false\nbenchmark_baseline = true\n", shimErr: "ledger_path", stateErr: "ledger_path"},
		{name: "bad mig backend", doc: "[pipeline]\nenabled = false\nbenchmark_baseline = true\n[mig]\nbackend = \"cuda\"\n", shimErr: "mig.backend", stateErr: "mig.backend"},
		{name: "pipeline off without saying why", doc: "[pipeline]\nenabled = false\n", shimErr: "pipeline.benchmark_baseline = true"},
		{name: "a baseline with the pipeline on", doc: "[policy]\nbundle = \"/b\"\ninsecure_skip_verification = true\n[pipeline]\nbenchmark_baseline = true\n", shimErr: "pipeline.benchmark_baseline: true only with pipeline.enabled = false"},
		{name: "relative pin dir", doc: "[pipeline]\nenabled = false\nbenchmark_baseline = true\n[netpol]\npin_dir = \"pins\"\n", shimErr: "netpol.pin_dir", stateErr: "netpol.pin_dir"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, []byte(tt.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, u := range []struct {
				use  Use
				want string
			}{{UseNode, tt.shimErr}, {UseNodeState, tt.stateErr}} {
				_, err := LoadFor(path, u.use)
				switch {
				case u.want == "" && err != nil:
					t.Errorf("use %d: %v, want valid", u.use, err)
				case u.want != "" && (err == nil || !strings.Contains(err.Error(), u.want)):
					t.Errorf("use %d: error %v, want it to contain %q", u.use, err, u.want)
				}
			}
		})
	}
	// Unknown keys are refused whatever the use.
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("[policy]\nkey_fil = \"/k\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFor(path, UseNodeState); err == nil || !strings.Contains(err.Error(), "unknown key(s) policy.key_fil") {
		t.Errorf("unknown key for UseNodeState: %v", err)
	}
}

// TestPlanCacheKeyUnderStateDirThroughALink: a key whose directory is a
// symbolic link into state_dir lies under state_dir.
func TestPlanCacheKeyUnderStateDirThroughALink(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(state, filepath.Join(dir, "keys")); err != nil {
		t.Fatal(err)
	}
	cfg := Default()
	cfg.Pipeline.Enabled, cfg.Pipeline.BenchmarkBaseline = false, true
	cfg.StateDir = state
	cfg.Policy.PlanCacheKey = filepath.Join(dir, "keys", "plan-cache.key")
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "policy.plan_cache_key") {
		t.Fatalf("Validate: %v, want policy.plan_cache_key refused", err)
	}
	cfg.Policy.PlanCacheKey = filepath.Join(dir, "plan-cache.key")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v, want a key beside state_dir accepted", err)
	}
}
