// Package config is the node's configuration file, /etc/bulkhead/config.toml,
// read by the node agent, both shims and `bulkhead node`. It imports nothing
// of the policy engine, the fence or the GPU backends, so that a shim that
// links it links none of them.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/bulkhead-runtime/bulkhead/internal/fspath"
)

// DefaultCDISpecDir is mig.cdi_spec_dir's default: the directory of
// dynamic CDI specs that CDI-aware runtimes and tools read.
const DefaultCDISpecDir = "/var/run/cdi"

// DefaultPath is where the shim reads its configuration unless the
// environment variable named by PathEnv overrides it.
const (
	DefaultPath = "/etc/bulkhead/config.toml"
	PathEnv     = "BULKHEAD_CONFIG"
)

// Config is the shim's own configuration file. containerd's CRI runtime
// options cannot carry it (gVisor's library cannot decode them in a Go-module
// build), so the shim reads this file instead and hands runsc its part.
type Config struct {
	// RunscPath is the absolute path of the runsc binary.
	RunscPath string `toml:"runsc_path"`
	// RuncPath is the absolute path of the runc binary that runs the runc
	// tier's pods (handler bulkhead-runc).
	RuncPath string `toml:"runc_path"`
	// RuncRoot is runc's state root (--root) for the runc tier's containers.
	RuncRoot string `toml:"runc_root"`
	// RunscRoot is runsc's state root (--root). Each sandbox keeps its
	// container state there.
	RunscRoot string `toml:"runsc_root"`
	// StateDir holds Bulkhead's per-sandbox records. It must be private to
	// this node's shims.
	StateDir string `toml:"state_dir"`
	// LedgerPath is the node ledger database (quota, MIG and eBPF
	// reservations) shared by every shim on the node.
	LedgerPath string `toml:"ledger_path"`
	// KubeletRoot is the kubelet's root directory (--root-dir). A bind
	// mount from <kubelet_root>/pods/<the pod's UID> is the pod's own
	// (volumes, token, /etc/hosts); from anywhere else it is a host path.
	KubeletRoot string `toml:"kubelet_root"`
	// ContainerdRoot and ContainerdState are containerd's root and state
	// directories: its CRI plugin keeps each sandbox's resolv.conf,
	// hostname and /dev/shm there.
	ContainerdRoot  string `toml:"containerd_root"`
	ContainerdState string `toml:"containerd_state"`
	// Runsc holds the flags passed to every runsc invocation.
	Runsc RunscConfig `toml:"runsc"`
	// Policy locates the signed policy bundle.
	Policy PolicyConfig `toml:"policy"`
	// Agent locates the node agent, which the shims call for every pod.
	Agent AgentConfig `toml:"agent"`
	// Pipeline switches the placement pipeline (policy, quota, MIG, fence).
	Pipeline PipelineConfig `toml:"pipeline"`
	// MIG selects the GPU backend.
	MIG MIGConfig `toml:"mig"`
	// Netpol configures the eBPF tenant fence.
	Netpol NetpolConfig `toml:"netpol"`
	// RDMA names each tenant's own RDMA virtual function devices.
	RDMA RDMAConfig `toml:"rdma"`
	// DRA is the kubelet plugin the agent hosts (driver mig.bulkhead.dev).
	DRA DRAConfig `toml:"dra"`
	// Debug turns on debug logging in the shim and runsc.
	Debug bool `toml:"debug"`
	// LogDir, when set, receives runsc's debug logs (one directory per sandbox).
	LogDir string `toml:"log_dir"`
}

// RunscConfig holds runsc's flags.
type RunscConfig struct {
	// Platform is runsc's --platform: systrap, ptrace or kvm.
	Platform string `toml:"platform"`
	// Network is runsc's --network: sandbox, host or none.
	Network string `toml:"network"`
	// ExtraFlags are further runsc flags, each "name=value" or "--name=value".
	ExtraFlags []string `toml:"extra_flags"`
}

// PolicyConfig locates the policy bundle and its verification key.
type PolicyConfig struct {
	// Bundle is a bundle directory or .tar.gz; empty disables the policy
	// (only allowed with the pipeline disabled).
	Bundle string `toml:"bundle"`
	// KeyFile is the PEM public key that verifies the bundle's signature.
	KeyFile string `toml:"key_file"`
	// KeyID names KeyFile in the bundle's signatures.
	KeyID string `toml:"key_id"`
	// Scope is the signature scope the bundle must carry.
	Scope string `toml:"scope"`
	// InsecureSkipVerification loads unsigned bundles. Development only.
	InsecureSkipVerification bool `toml:"insecure_skip_verification"`
	// Data is an optional JSON file merged into the bundle's data (tenants).
	Data string `toml:"data"`
	// DecisionLog is a file for decision logs; "-" is stdout, empty is off.
	DecisionLog string `toml:"decision_log"`
	// Evaluator is "plan" (default: OPA's compiled plan, falling back to
	// the interpreter when a bundle needs it) or "topdown" (always OPA's
	// interpreter). See policy.Options.Evaluator.
	Evaluator string `toml:"evaluator"`
	// MaxBundleBytes bounds the bundle once inflated, and the data file;
	// 0 is policy.DefaultMaxBundleBytes. See policy.Options.MaxBundleBytes.
	MaxBundleBytes int64 `toml:"max_bundle_bytes"`
	// MaxBundleFiles bounds the bundle's files; 0 is
	// policy.DefaultMaxBundleFiles. See policy.Options.MaxBundleFiles.
	MaxBundleFiles int `toml:"max_bundle_files"`
	// PlanCacheKey is the node's secret that authenticates the entries of
	// the policy plan cache under state_dir (policy.Options
	// PlanCacheKeyFile): a writer of state_dir who cannot read it cannot
	// make an entry the shims serve. An absolute path outside state_dir;
	// the first shim to open the policy creates it (0600). Empty: Config
	// PlanCacheKeyPath, beside ledger_path.
	PlanCacheKey string `toml:"plan_cache_key"`
}

// AgentConfig locates the node agent (bulkhead-agent): one process per
// node holding the policy, the ledger, the GPU backend and the fence.
type AgentConfig struct {
	// Socket is the agent's unix socket. The shims call it for every pod;
	// it is created 0600 and answers only root callers.
	Socket string `toml:"socket"`
	// MetricsAddress is where the agent serves Prometheus' /metrics
	// (host:port); "" serves none.
	MetricsAddress string `toml:"metrics_address"`
	// Kubeconfig is the file the agent reaches the API server with, to
	// emit Kubernetes Events on refused pods; "" uses the pod's service
	// account when the agent runs in a pod, and emits no Events otherwise.
	Kubeconfig string `toml:"kubeconfig"`
	// NodeName is this node's name in Events; "" is $NODE_NAME (the node
	// DaemonSet sets it from the pod's spec.nodeName), else the host name.
	NodeName string `toml:"node_name"`
}

// Node returns this node's name: NodeName, else $NODE_NAME, else the host
// name.
func (a AgentConfig) Node() string {
	if a.NodeName != "" {
		return a.NodeName
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// PipelineConfig switches the placement pipeline.
type PipelineConfig struct {
	// Enabled runs the pipeline for every sandbox. When false the shim only
	// records sandboxes and passes through to gVisor (used as the baseline
	// of `make bench-start`).
	Enabled bool `toml:"enabled"`
	// BenchmarkBaseline must be true for Enabled to be false: a node whose
	// shim judges nothing runs every pod unjudged, unquota'd and unfenced,
	// so turning the pipeline off says what it is for (the baseline of
	// `make bench-start` and of tests that measure the shim alone).
	BenchmarkBaseline bool `toml:"benchmark_baseline"`
}

// MIGConfig selects the GPU backend.
type MIGConfig struct {
	// Backend is "none" (no GPUs), "mock" (go-nvml's mock servers wrapped to
	// behave like hardware, for nodes without GPUs) or "nvml".
	Backend string `toml:"backend"`
	// MockModel is the mock GPU model: h200, h100, a100-40gb, a100-80gb, b200.
	MockModel string `toml:"mock_model"`
	// MockGPUs is the number of mock GPUs.
	MockGPUs int `toml:"mock_gpus"`
	// MockState is the file the mock node keeps its instances in, shared by
	// every shim on the node.
	MockState string `toml:"mock_state"`
	// CDISpecDir is where the shim writes a CDI spec for each pod's GPU or
	// MIG slice (bulkhead.dev/gpu=<UUID>, one file per sandbox), removed
	// when the pod's reservation is released; "" writes none.
	CDISpecDir string `toml:"cdi_spec_dir"`
}

// DRAConfig switches the node agent's DRA kubelet plugin, which publishes
// the node's MIG capacity as ResourceSlices and prepares the slices the
// scheduler allocates (package runtime/dra).
type DRAConfig struct {
	// Enabled starts the plugin with the agent. It needs a MIG backend,
	// mig.cdi_spec_dir (a claimed slice reaches its container through a
	// CDI spec) and the API server (agent.kubeconfig, or the pod's service
	// account); without the last the agent logs why and serves without it.
	Enabled bool `toml:"enabled"`
	// RegistrarDir is the kubelet's plugin registration directory, where
	// the plugin's registration socket goes.
	RegistrarDir string `toml:"registrar_dir"`
	// PluginDir is the plugin's own directory, where the kubelet finds its
	// dra.sock. Both paths must be the same inside and outside the agent's
	// container.
	PluginDir string `toml:"plugin_dir"`
}

// RDMAConfig names the RDMA devices each tenant owns. Hardware RDMA
// bypasses every packet hook, so it is fenced by device access: a pod keeps
// only its tenant's VF nodes, and only when the policy grants RDMA.
type RDMAConfig struct {
	// TenantVFs maps a tenant to its VF device nodes under /dev/infiniband.
	TenantVFs map[string][]string `toml:"tenant_vfs"`
}

// NetpolConfig configures the eBPF tenant fence.
type NetpolConfig struct {
	// Enabled registers every sandbox in the fence. It is on unless the
	// file says enabled = false: a node without a fence has no cross-tenant,
	// metadata or egress enforcement, and says so on every pod start.
	Enabled bool `toml:"enabled"`
	// PinDir is where maps and links are pinned (on bpffs).
	PinDir string `toml:"pin_dir"`
	// LockPath serialises map updates between shims.
	LockPath string `toml:"lock_path"`
	// ClusterCIDRs are the cluster's pod and service ranges.
	ClusterCIDRs []string `toml:"cluster_cidrs"`
	// SharedServices maps a tier to the CIDRs every pod of it may reach (DNS, API server).
	SharedServices map[string][]string `toml:"shared_services"`
}

// ClusterPrefixes parses cluster_cidrs and shared_services, naming the
// first entry that is not a CIDR.
func (n NetpolConfig) ClusterPrefixes() (cluster []netip.Prefix, shared map[string][]netip.Prefix, err error) {
	shared = map[string][]netip.Prefix{}
	for i, c := range n.ClusterCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, nil, fmt.Errorf("netpol.cluster_cidrs[%d]: %q is not a CIDR", i, c)
		}
		cluster = append(cluster, p)
	}
	for tier, cidrs := range n.SharedServices {
		for i, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				return nil, nil, fmt.Errorf("netpol.shared_services.%s[%d]: %q is not a CIDR", tier, i, c)
			}
			shared[tier] = append(shared[tier], p)
		}
	}
	return cluster, shared, nil
}

// Default is the configuration used for keys the file leaves out.
func Default() Config {
	return Config{
		RunscPath:       "/usr/local/bin/runsc",
		RuncPath:        "/usr/local/bin/runc",
		RuncRoot:        "/run/bulkhead/runc",
		RunscRoot:       "/run/bulkhead/runsc",
		StateDir:        "/run/bulkhead",
		LedgerPath:      "/var/lib/bulkhead/ledger.db",
		KubeletRoot:     "/var/lib/kubelet",
		ContainerdRoot:  "/var/lib/containerd",
		ContainerdState: "/run/containerd",
		Runsc:           RunscConfig{Platform: "systrap", Network: "sandbox"},
		Agent:           AgentConfig{Socket: "/run/bulkhead/agent.sock"},
		Pipeline:        PipelineConfig{Enabled: true},
		MIG:             MIGConfig{Backend: "none", MockModel: "h200", MockGPUs: 1, MockState: "/var/lib/bulkhead/mock-gpus.json", CDISpecDir: DefaultCDISpecDir},
		Netpol:          NetpolConfig{Enabled: true, PinDir: "/sys/fs/bpf/bulkhead", LockPath: "/run/bulkhead/netpol.lock"},
		DRA:             DRAConfig{RegistrarDir: "/var/lib/kubelet/plugins_registry", PluginDir: "/var/lib/kubelet/plugins/mig.bulkhead.dev"},
	}
}

// Path returns the configuration path from the environment or the default.
func Path() string {
	if p := os.Getenv(PathEnv); p != "" {
		return p
	}
	return DefaultPath
}

// Use is what a command does with the configuration. Validation
// checks the keys that use reads and no others, so that a read-only look at
// a node does not demand, say, the key of a policy it never loads. Unknown
// keys are refused whatever the use.
type Use int

const (
	// UseNode is the agent's and the shims' use: every key is checked.
	UseNode Use = iota
	// UseNodeState is `bulkhead node status` and `bulkhead node gc`: the
	// node's paths, mig.* and netpol.* are checked; runsc.*, rdma.* and
	// policy.* are not (neither command runs runsc or loads the policy;
	// status reads the quotas it shows from policy.data or policy.bundle
	// when they are readable, and shows none otherwise).
	UseNodeState
)

// Load reads the configuration file at path and validates it for the
// shim (every key).
func Load(path string) (Config, error) {
	return LoadFor(path, UseNode)
}

// LoadFor reads the configuration file at path and validates the keys
// that use reads.
func LoadFor(path string, use Use) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	cfg, err := decode(data)
	if err == nil {
		err = cfg.ValidateFor(use)
	}
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes a configuration document strictly (unknown keys are
// refused) over Default and validates it for the shim.
func Parse(data []byte) (Config, error) {
	cfg, err := decode(data)
	if err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// decode decodes a configuration document strictly over Default.
func decode(data []byte) (Config, error) {
	cfg := Default()
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		var strict *toml.StrictMissingError
		if errors.As(err, &strict) {
			keys := make([]string, 0, len(strict.Errors))
			for _, e := range strict.Errors {
				keys = append(keys, strings.Join(e.Key(), "."))
			}
			return Config{}, fmt.Errorf("unknown key(s) %s: not a Bulkhead setting", strings.Join(keys, ", "))
		}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return Config{}, fmt.Errorf("line %d column %d: %s", row, col, de.Error())
		}
		return Config{}, err
	}
	return cfg, nil
}

var (
	validPlatforms = []string{"systrap", "ptrace", "kvm"}
	validNetworks  = []string{"sandbox", "host", "none"}
	// Evaluators are policy.Options.Evaluator's names ("" is the default,
	// plan), here so that the shims need not link the policy engine;
	// runtime's TestConfigEvaluatorsArePolicys keeps them policy's.
	Evaluators = []string{"", "plan", "topdown"}
	// reservedFlags are set by the shim itself and may not be overridden.
	reservedFlags = []string{"root", "platform", "network", "debug", "debug-log", "log", "log-format"}
)

// Validate checks every field (as the agent and shims read them) and names the first bad one.
func (c Config) Validate() error {
	return c.ValidateFor(UseNode)
}

// ValidateFor checks the fields that use reads (see Use) and names
// the first bad one.
func (c Config) ValidateFor(use Use) error {
	for _, p := range []struct{ key, val string }{
		{"runsc_path", c.RunscPath}, {"runc_path", c.RuncPath}, {"runc_root", c.RuncRoot}, {"runsc_root", c.RunscRoot}, {"state_dir", c.StateDir}, {"ledger_path", c.LedgerPath},
		{"kubelet_root", c.KubeletRoot}, {"containerd_root", c.ContainerdRoot}, {"containerd_state", c.ContainerdState},
	} {
		if p.val == "" {
			return fmt.Errorf("%s: must be set", p.key)
		}
		if !filepath.IsAbs(p.val) {
			return fmt.Errorf("%s: %q must be an absolute path", p.key, p.val)
		}
	}
	if !filepath.IsAbs(c.Agent.Socket) {
		return fmt.Errorf("agent.socket: %q must be an absolute path", c.Agent.Socket)
	}
	if c.Agent.Kubeconfig != "" && !filepath.IsAbs(c.Agent.Kubeconfig) {
		return fmt.Errorf("agent.kubeconfig: %q must be an absolute path", c.Agent.Kubeconfig)
	}
	if c.LogDir != "" && !filepath.IsAbs(c.LogDir) {
		return fmt.Errorf("log_dir: %q must be an absolute path", c.LogDir)
	}
	if use == UseNode {
		if err := c.validateNodeOnly(); err != nil {
			return err
		}
	}
	switch c.MIG.Backend {
	case "none", "nvml":
	case "mock":
		// A file may name the mock; whether the binary links it (the tag
		// bulkhead_mockgpu) is mig.OpenBackend's to say when it opens.
		if c.MIG.MockGPUs < 1 || c.MIG.MockGPUs > 8 {
			return fmt.Errorf("mig.mock_gpus: %d must be 1 to 8", c.MIG.MockGPUs)
		}
		if !filepath.IsAbs(c.MIG.MockState) {
			return fmt.Errorf("mig.mock_state: %q must be an absolute path", c.MIG.MockState)
		}
	default:
		return fmt.Errorf("mig.backend: %q is not one of none, mock, nvml", c.MIG.Backend)
	}
	if c.MIG.CDISpecDir != "" && !filepath.IsAbs(c.MIG.CDISpecDir) {
		return fmt.Errorf("mig.cdi_spec_dir: %q must be an absolute path (or \"\" to write no CDI specs)", c.MIG.CDISpecDir)
	}
	if err := c.DRA.validate(c.MIG); err != nil {
		return err
	}
	if _, _, err := c.Netpol.ClusterPrefixes(); err != nil {
		return err
	}
	if c.Netpol.Enabled && (c.Netpol.PinDir == "" || !filepath.IsAbs(c.Netpol.PinDir)) {
		return fmt.Errorf("netpol.pin_dir: %q must be an absolute path on bpffs", c.Netpol.PinDir)
	}
	return nil
}

func (d DRAConfig) validate(m MIGConfig) error {
	if !d.Enabled {
		return nil
	}
	if m.Backend == "none" {
		return errors.New("dra.enabled: true needs a MIG backend to publish and prepare slices (mig.backend is none)")
	}
	if m.CDISpecDir == "" {
		return errors.New("dra.enabled: true needs mig.cdi_spec_dir: a claimed slice reaches its container only through a CDI spec")
	}
	if !filepath.IsAbs(d.RegistrarDir) {
		return fmt.Errorf("dra.registrar_dir: %q must be an absolute path (the kubelet's plugins_registry)", d.RegistrarDir)
	}
	if !filepath.IsAbs(d.PluginDir) {
		return fmt.Errorf("dra.plugin_dir: %q must be an absolute path", d.PluginDir)
	}
	return nil
}

// validateNodeOnly checks what only the agent and the shims read: runsc's flags, the
// tenants' RDMA devices and the policy.
func (c Config) validateNodeOnly() error {
	if !slices.Contains(validPlatforms, c.Runsc.Platform) {
		return fmt.Errorf("runsc.platform: %q is not one of %s", c.Runsc.Platform, strings.Join(validPlatforms, ", "))
	}
	if !slices.Contains(validNetworks, c.Runsc.Network) {
		return fmt.Errorf("runsc.network: %q is not one of %s", c.Runsc.Network, strings.Join(validNetworks, ", "))
	}
	if _, err := c.Runsc.flagMap(); err != nil {
		return err
	}
	for tenant, devs := range c.RDMA.TenantVFs {
		for i, d := range devs {
			if !strings.HasPrefix(d, "/dev/infiniband/") {
				return fmt.Errorf("rdma.tenant_vfs.%s[%d]: %q must be under /dev/infiniband", tenant, i, d)
			}
		}
	}
	if !c.Pipeline.Enabled && !c.Pipeline.BenchmarkBaseline {
		return errors.New("pipeline.enabled: false runs every pod unjudged, outside quota and unfenced; a node refuses it unless pipeline.benchmark_baseline = true says it is a benchmark baseline")
	}
	if c.Pipeline.Enabled && c.Pipeline.BenchmarkBaseline {
		return errors.New("pipeline.benchmark_baseline: true only with pipeline.enabled = false")
	}
	if c.Pipeline.Enabled && c.Policy.Bundle == "" {
		return errors.New("policy.bundle: must be set while pipeline.enabled is true (the pipeline fails closed without a policy)")
	}
	if !slices.Contains(Evaluators, c.Policy.Evaluator) {
		return fmt.Errorf("policy.evaluator: %q is not one of %s", c.Policy.Evaluator, strings.Join(Evaluators[1:], ", "))
	}
	if c.Policy.MaxBundleBytes < 0 || c.Policy.MaxBundleFiles < 0 {
		return fmt.Errorf("policy.max_bundle_bytes %d, policy.max_bundle_files %d: must not be negative (0: the default)", c.Policy.MaxBundleBytes, c.Policy.MaxBundleFiles)
	}
	if c.Policy.Bundle != "" && !c.Policy.InsecureSkipVerification && (c.Policy.KeyFile == "" || c.Policy.KeyID == "") {
		return errors.New("policy.key_file and policy.key_id: must be set to verify the bundle (or set policy.insecure_skip_verification for development)")
	}
	return c.checkPlanCacheKey()
}

// PlanCacheKeyPath is policy.plan_cache_key, or by default plan-cache.key
// beside ledger_path (/var/lib/bulkhead/plan-cache.key): node state that
// outlives a pod, outside state_dir, where only root writes.
func (c Config) PlanCacheKeyPath() string {
	if c.Policy.PlanCacheKey != "" {
		return c.Policy.PlanCacheKey
	}
	return filepath.Join(filepath.Dir(c.LedgerPath), "plan-cache.key")
}

// checkPlanCacheKey refuses a plan cache key (PlanCacheKeyPath) that is
// relative or lies under state_dir, as written or with symbolic links
// resolved: whoever may write state_dir, which holds the cache, could read
// or replace the key that authenticates it.
func (c Config) checkPlanCacheKey() error {
	key := c.PlanCacheKeyPath()
	setting := "policy.plan_cache_key"
	if c.Policy.PlanCacheKey == "" {
		setting += " (unset: plan-cache.key beside ledger_path)"
	}
	if !filepath.IsAbs(key) {
		return fmt.Errorf("%s: %q must be an absolute path", setting, key)
	}
	resolve := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return filepath.Clean(p)
	}
	if fspath.Under(filepath.Clean(key), filepath.Clean(c.StateDir)) || fspath.Under(filepath.Join(resolve(filepath.Dir(key)), filepath.Base(key)), resolve(c.StateDir)) {
		return fmt.Errorf("%s: %q lies under state_dir %q, which holds the plan cache it authenticates: a writer of state_dir could read or replace it; set it outside", setting, key, c.StateDir)
	}
	return nil
}

// RunscFlags returns every runsc flag (without leading dashes) the shim
// passes: platform, network and the extra flags.
func (c Config) RunscFlags() map[string]string {
	m, _ := c.Runsc.flagMap()
	m["platform"] = c.Runsc.Platform
	m["network"] = c.Runsc.Network
	return m
}

func (r RunscConfig) flagMap() (map[string]string, error) {
	m := map[string]string{}
	for i, f := range r.ExtraFlags {
		name, value, ok := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if !ok {
			value = "true"
		}
		if name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("runsc.extra_flags[%d]: %q is not a flag of the form name=value", i, f)
		}
		if slices.Contains(reservedFlags, name) {
			return nil, fmt.Errorf("runsc.extra_flags[%d]: %q is set by Bulkhead itself (use the dedicated key)", i, name)
		}
		m[name] = value
	}
	return m, nil
}
