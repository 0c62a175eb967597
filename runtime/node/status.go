package node

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// Status is what `bulkhead node status` reports: the node agent's own
// state and what the node holds (ledger, GPUs, fence, quotas). The agent
// serves it (agentapi.MethodStatus); on a node whose agent is down it is
// read from the node's files (ReadStatus).
type Status struct {
	// Agent is the node agent as it reported itself, or why it could not
	// be asked.
	Agent      *AgentStatus    `json:"agent"`
	Tenants    []TenantStatus  `json:"tenants"`
	GPUs       []mig.GPUUsage  `json:"gpus"`
	Placements []mig.Placement `json:"placements"`
	// Instances are the MIG instances the node's pods hold (runc tier).
	Instances  []MIGInstance           `json:"mig_instances"`
	Endpoints  []netpol.EndpointInfo   `json:"endpoints"`
	Drops      map[string]netpol.Stats `json:"drops"`
	Sandboxes  []*Reservation          `json:"sandboxes"`
	Quota      map[string]TenantQuota  `json:"quota,omitempty"`
	LedgerPath string                  `json:"ledger_path"`
	// Ledger, when not empty, says why there are no sandboxes to list.
	Ledger string `json:"ledger,omitempty"`
	// Fence is "enabled" or FenceDisabled.
	Fence string `json:"fence"`
}

// AgentStatus is the node agent's part of a Status.
type AgentStatus struct {
	// Running is true when the agent answered: the rest of the report is
	// its live view.
	Running bool `json:"running"`
	// Socket is the agent's socket (agent.socket).
	Socket string `json:"socket"`
	// ReadOnly, when the agent could not be asked, says why and that the
	// report was read from the node's files instead.
	ReadOnly string `json:"read_only,omitempty"`
	// PID is the agent's process id.
	PID int `json:"pid,omitempty"`
	// StartedAt is when the agent opened the node.
	StartedAt time.Time `json:"started_at,omitzero"`
	// BundleRevision is the policy bundle's revision every decision names.
	BundleRevision string `json:"bundle_revision,omitempty"`
	// BundleLoadedAt is when BundleRevision became active.
	BundleLoadedAt time.Time `json:"bundle_loaded_at,omitzero"`
	// ReloadError is why the last reload was refused (the active bundle
	// stayed); empty when the last reload succeeded or none happened.
	ReloadError string `json:"reload_error,omitempty"`
	// Pods is how many pods the agent serves now.
	Pods int `json:"pods"`
	// OpsInFlight is how many calls wait for a shim's act.
	OpsInFlight int `json:"ops_in_flight"`
	// Cluster is what the agent knows of the other nodes' pods.
	Cluster ClusterSync `json:"cluster"`
}

// ClusterSync is what the node agent knows of the other nodes' pods, whose
// addresses the fence maps to their tenants, and of the other nodes, whose
// addresses it keeps in the cluster.
type ClusterSync struct {
	// Watching: the agent reaches an API server and has a fence to keep.
	// When false, the fence knows no pod of another node: each is an
	// unknown cluster address.
	Watching bool `json:"watching"`
	// Synced: the first full list of pods and nodes is in the fence. Until
	// then every other node's pod is an unknown cluster address, and the
	// other nodes' addresses are as an earlier agent left them.
	Synced bool `json:"synced"`
	// Connected: the last list or watch of the API server succeeded. When
	// false, the fence keeps the pods as last seen and knows no new one.
	Connected bool `json:"connected"`
	// LastContact is when the API server last answered a list or watch, or
	// sent an event.
	LastContact time.Time `json:"last_contact,omitzero"`
	// LastApplied is when the fence last matched the agent's view.
	LastApplied time.Time `json:"last_applied,omitzero"`
	// RemoteAddresses is how many addresses of other nodes' pods the fence holds.
	RemoteAddresses int `json:"remote_addresses"`
	// RemoteNodes is how many addresses of other nodes (InternalIP,
	// ExternalIP) the fence holds in the cluster, owned by no tenant.
	RemoteNodes int `json:"remote_nodes"`
	// LastError is the last failure of the watch or of writing the fence.
	LastError string `json:"last_error,omitempty"`
}

// MIGInstance is a MIG instance and the pod holding it.
type MIGInstance struct {
	mig.Instance
	Sandbox string `json:"sandbox"`
	Tenant  string `json:"tenant"`
}

// TenantStatus is a tenant's usage on this node.
type TenantStatus struct {
	Tenant      string `json:"tenant"`
	Tier        string `json:"tier"`
	Sandboxes   int    `json:"sandboxes"`
	GPUSlices   int    `json:"gpu_slices"`
	MemoryBytes int64  `json:"memory_bytes"`
}

// TenantQuota is a tenant's quota as the policy data states it.
type TenantQuota struct {
	Sandboxes int    `json:"sandboxes,omitempty"`
	GPUSlices int    `json:"gpu_slices,omitempty"`
	Memory    string `json:"memory,omitempty"`
}

// FenceDisabled is Status.Fence on a node whose operator turned the
// fence off.
const FenceDisabled = "DISABLED (netpol.enabled = false): no cross-tenant, metadata or egress enforcement on this node"

// ReadStatus reads the node's state read-only, as cfg locates it: the
// ledger, the GPUs and the pinned fence are opened as they are and never
// created, so it works on a node whose agent is stopped and leaves the
// node as it found it. Agent is left nil: the caller says who is asking.
func ReadStatus(cfg config.Config) (*Status, error) {
	st := &Status{Drops: map[string]netpol.Stats{}, LedgerPath: cfg.LedgerPath, Fence: "enabled"}
	if !cfg.Netpol.Enabled {
		st.Fence = FenceDisabled
	}
	ledger, err := OpenLedgerReadOnly(cfg.LedgerPath)
	switch {
	case errors.Is(err, ErrNoLedger):
		st.Ledger = fmt.Sprintf("none at %s (ledger_path): no Bulkhead pod has run on this node", cfg.LedgerPath)
	case err != nil:
		return nil, fmt.Errorf("ledger_path: %w", err)
	default:
		if err := ledger.View(func(tx *LedgerTx) error {
			var err error
			st.Sandboxes, err = tx.List()
			return err
		}); err != nil {
			return nil, fmt.Errorf("ledger_path: %w", err)
		}
	}
	gpus, err := GPUsReadOnly(cfg)
	if err != nil {
		return nil, err
	}
	byTenant := map[string]*TenantStatus{}
	for _, r := range st.Sandboxes {
		ts := byTenant[r.Tenant]
		if ts == nil {
			ts = &TenantStatus{Tenant: r.Tenant, Tier: r.Tier}
			byTenant[r.Tenant] = ts
		}
		ts.Sandboxes++
		ts.GPUSlices += r.GPUSlices()
		ts.MemoryBytes += r.MemoryBytes
		if r.GPU != nil {
			st.Placements = append(st.Placements, *r.GPU)
		}
		if r.Instance != nil {
			st.Instances = append(st.Instances, MIGInstance{Instance: *r.Instance, Sandbox: r.SandboxID, Tenant: r.Tenant})
		}
	}
	for _, ts := range byTenant {
		st.Tenants = append(st.Tenants, *ts)
	}
	sort.Slice(st.Tenants, func(i, j int) bool { return st.Tenants[i].Tenant < st.Tenants[j].Tenant })
	if len(gpus) > 0 {
		alloc, err := mig.NewAllocator(gpus, st.Placements)
		if err != nil {
			return nil, err
		}
		st.GPUs = alloc.Usage()
	}
	st.Quota = readQuotas(cfg.Policy.Data)
	if st.Quota == nil {
		st.Quota = readQuotas(cfg.Policy.Bundle)
	}
	if cfg.Netpol.Enabled {
		fence, err := netpol.OpenReadOnly(cfg.Netpol.PinDir)
		if errors.Is(err, netpol.ErrNoFence) {
			st.Fence = fmt.Sprintf("enabled, none pinned yet at %s (netpol.pin_dir): no pod has registered with it", cfg.Netpol.PinDir)
			return st, nil
		}
		if err != nil {
			return nil, fmt.Errorf("netpol.pin_dir: %w", err)
		}
		defer fence.Close()
		if st.Endpoints, err = fence.Endpoints(); err != nil {
			return nil, err
		}
		// Counters outlive pods: report every tenant the policy or the
		// ledger names that the fence has seen.
		tenants := map[string]bool{}
		for _, ts := range st.Tenants {
			tenants[ts.Tenant] = true
		}
		for t := range st.Quota {
			tenants[t] = true
		}
		for t := range tenants {
			if s, err := fence.Stats(t); err == nil {
				st.Drops[t] = s
			}
		}
	}
	return st, nil
}

// readQuotas reads data.bulkhead.tenants[*].quota from a policy data file,
// a bundle directory or a bundle .tar.gz; nil when there is none to read.
func readQuotas(path string) map[string]TenantQuota {
	if path == "" {
		return nil
	}
	b, err := readBundleData(path)
	if err != nil {
		return nil
	}
	var doc struct {
		Bulkhead struct {
			Tenants map[string]struct {
				Quota TenantQuota `json:"quota"`
			} `json:"tenants"`
		} `json:"bulkhead"`
	}
	if json.Unmarshal(b, &doc) != nil {
		return nil
	}
	out := map[string]TenantQuota{}
	for t, v := range doc.Bulkhead.Tenants {
		out[t] = v.Quota
	}
	return out
}

// readBundleData returns the data document at path: a data file, a bundle
// directory's data.json or a bundle .tar.gz's.
func readBundleData(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return os.ReadFile(filepath.Join(path, "data.json"))
	}
	if !strings.HasSuffix(path, ".tar.gz") {
		return os.ReadFile(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, err
		}
		if strings.TrimPrefix(h.Name, "/") == "data.json" {
			return io.ReadAll(io.LimitReader(tr, 64<<20))
		}
	}
}
