package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// Sandbox is Bulkhead's record of one pod sandbox. It is written to the
// state directory before the sandbox is created, so a crash at any later
// point leaves a record that GC can act on. It is sealed (seal.go): Load
// returns only what this node wrote.
type Sandbox struct {
	// ID is the CRI sandbox id (the pause container's id).
	ID string `json:"id"`
	// Namespace, Name and UID identify the pod in Kubernetes.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// Handler is the CRI runtime handler that selected Bulkhead.
	Handler string `json:"handler"`
	// Bundle is the sandbox container's OCI bundle directory.
	Bundle string `json:"bundle"`
	// NetNS is the path of the pod's network namespace, if any.
	NetNS string `json:"netns,omitempty"`
	// Annotations are the pod's bulkhead.dev/ requests.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Containers are the ids of the workload containers created in the sandbox.
	Containers []string `json:"containers,omitempty"`
	// Limits are the live containers' limits (the sandbox container's
	// included) as their runtime was last told, by container id: an update
	// of a container's resources is judged against them.
	Limits map[string]ContainerLimits `json:"limits,omitempty"`
	// Phase is PhaseCreating until runsc created the sandbox, then PhaseCreated.
	Phase string `json:"phase"`
	// ShimPID is the pid of the shim process serving the pod: while it
	// runs, the pod is alive.
	ShimPID   int       `json:"shim_pid"`
	CreatedAt time.Time `json:"created_at"`
	// Tenant is the tenant the policy derived from Namespace.
	Tenant string `json:"tenant,omitempty"`
	// Runtime is the runtime of the shim that serves the pod:
	// policy.RuntimeGVisor or policy.RuntimeRunc.
	Runtime string `json:"runtime,omitempty"`
	// Decision and Input are what the pod was admitted under (Admission),
	// so that an agent restarted while the pod runs judges its later
	// containers and updates as the one that admitted it did.
	Decision *policy.Decision `json:"decision,omitempty"`
	Input    *policy.Input    `json:"input,omitempty"`
}

// RuleRecordLedger names the rule a record breaks that says the pod is
// another than its reservation in the ledger does.
const RuleRecordLedger = "node.record_ledger"

// CheckReservation refuses a record whose identity is not what the
// ledger's reservation res holds for the sandbox: the namespace, pod,
// tenant and tier it was admitted as, in the record itself and in the
// decision and input kept with it, and the input's pod as the record
// names it. The ledger lies outside state_dir: a record that agrees with
// it claims no identity its pod was not admitted with.
func (sb *Sandbox) CheckReservation(res *Reservation) error {
	// from says where the value the record must hold comes from.
	type field struct{ name, record, want, from string }
	const ledger, record = "the ledger's reservation", "the record"
	fields := []field{
		{"sandbox id", sb.ID, res.SandboxID, ledger},
		{"namespace", sb.Namespace, res.Namespace, ledger},
		{"pod", sb.Name, res.Pod, ledger},
		{"tenant", sb.Tenant, res.Tenant, ledger},
	}
	if d := sb.Decision; d != nil {
		fields = append(fields,
			field{"decision's tenant", d.Tenant, res.Tenant, ledger},
			field{"decision's tier", d.Tier, res.Tier, ledger},
			field{"decision's runtime", d.Runtime, sb.Runtime, record})
		if !d.Allow {
			return fmt.Errorf("sandbox %s: record: [%s] its decision refused the pod, yet the ledger holds its reservation", sb.ID, RuleRecordLedger)
		}
	}
	if in := sb.Input; in != nil {
		fields = append(fields,
			field{"input's kind", in.Kind, policy.KindSandbox, "a sandbox's input"},
			field{"input's namespace", in.Namespace, res.Namespace, ledger},
			field{"input's pod", in.Pod.Name, res.Pod, ledger},
			field{"input's pod uid", in.Pod.UID, sb.UID, record},
			field{"input's runtime handler", in.Pod.RuntimeHandler, sb.Handler, record})
		if !maps.Equal(in.Pod.Annotations, sb.Annotations) {
			return fmt.Errorf("sandbox %s: record: [%s] the input's pod annotations %v are not the record's %v", sb.ID, RuleRecordLedger, in.Pod.Annotations, sb.Annotations)
		}
	}
	for _, f := range fields {
		if f.record != f.want {
			return fmt.Errorf("sandbox %s: record: [%s] its %s is %q, %s says %q", sb.ID, RuleRecordLedger, f.name, f.record, f.from, f.want)
		}
	}
	return nil
}

// ContainerLimits is what a pod's record keeps of one container's resources.
type ContainerLimits struct {
	// Name is the container's name in its pod (its id outside the CRI).
	Name string `json:"name"`
	// MemoryBytes is its memory limit; 0 when it has none.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// Sandbox phases.
const (
	PhaseCreating = "creating"
	PhaseCreated  = "created"
)

// StateDir keeps one directory per sandbox under <root>/sandboxes. Each
// directory is owned by the shim serving that pod; only GC touches others.
// Every record is sealed with the node's record key when it is saved and
// authenticated when it is loaded.
type StateDir struct {
	root string
	// keyFile is the node key the record key is derived from.
	keyFile string

	// mu guards key, read on first use and kept; a failed read is tried
	// again on the next.
	mu  sync.Mutex
	key []byte
}

// NewStateDir returns the state directory of cfg (cfg.StateDir), whose
// records are sealed under the node key cfg.PlanCacheKeyPath names.
func NewStateDir(cfg config.Config) *StateDir {
	return &StateDir{root: cfg.StateDir, keyFile: cfg.PlanCacheKeyPath()}
}

// Root returns the state directory's root.
func (s *StateDir) Root() string { return s.root }

// recordKey returns the key records are sealed with.
func (s *StateDir) recordKey() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key == nil {
		key, err := loadRecordKey(s.keyFile)
		if err != nil {
			return nil, err
		}
		s.key = key
	}
	return s.key, nil
}

// validID matches containerd ids (and so keeps ids from escaping the directory).
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Dir returns the directory of sandbox id.
func (s *StateDir) Dir(id string) (string, error) {
	if !validID.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q: must match %s", id, validID)
	}
	return filepath.Join(s.root, "sandboxes", id), nil
}

// Save seals the record and writes it atomically (write to a temporary
// file, then rename). Without the node key nothing is written: a record
// that could not be authenticated later would strand its pod.
func (s *StateDir) Save(sb *Sandbox) error {
	dir, err := s.Dir(sb.ID)
	if err != nil {
		return err
	}
	key, err := s.recordKey()
	if err != nil {
		return fmt.Errorf("sandbox %s: seal record: %w", sb.ID, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	body, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	data, err := seal(key, body)
	if err != nil {
		return fmt.Errorf("sandbox %s: seal record: %w", sb.ID, err)
	}
	return atomicfile.Write(filepath.Join(dir, "sandbox.json"), data, 0o600)
}

// Load reads the record of sandbox id and authenticates it: a record this
// node did not seal, or sealed for another sandbox, is refused with an
// error that names the sandbox and RuleRecordAuthentic and wraps
// ErrRecordNotAuthentic or ErrRecordUnsealed. It never returns a record
// it could not authenticate.
func (s *StateDir) Load(id string) (*Sandbox, error) {
	path, raw, err := s.read(id)
	if err != nil {
		return nil, err
	}
	key, err := s.recordKey()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: authenticate record: %w", id, err)
	}
	body, err := unseal(key, raw)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: record %s: [%s] %w", id, path, RuleRecordAuthentic, err)
	}
	sb, err := decodeRecord(id, body)
	if err != nil {
		return nil, err
	}
	if sb.ID != id {
		// Another sandbox's record, copied here: its MAC is its own.
		return nil, fmt.Errorf("sandbox %s: record %s: [%s] %w: it is sandbox %q's", id, path, RuleRecordAuthentic, ErrRecordNotAuthentic, sb.ID)
	}
	return sb, nil
}

// LoadUnauthenticated reads the record of sandbox id without
// authenticating it, sealed or not. Whoever may write state_dir may have
// written any of it: it is only for what a record merely hints (GC's
// liveness of a shim) and for a record of an earlier release that the
// caller checks against the ledger (runtime.ResumePod).
func (s *StateDir) LoadUnauthenticated(id string) (*Sandbox, error) {
	_, raw, err := s.read(id)
	if err != nil {
		return nil, err
	}
	return decodeRecord(id, raw)
}

// read returns the path and the bytes of sandbox id's record.
func (s *StateDir) read(id string) (string, []byte, error) {
	dir, err := s.Dir(id)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(dir, "sandbox.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return path, raw, nil
}

// decodeRecord decodes the record of sandbox id from its JSON.
func decodeRecord(id string, data []byte) (*Sandbox, error) {
	var sb Sandbox
	if err := json.Unmarshal(data, &sb); err != nil {
		return nil, fmt.Errorf("sandbox %s: decode record: %w", id, err)
	}
	return &sb, nil
}

// List returns every sandbox id with a directory, sorted.
func (s *StateDir) List() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.root, "sandboxes"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// Remove deletes everything Bulkhead kept for sandbox id. Removing a
// sandbox that has no directory is not an error.
func (s *StateDir) Remove(id string) error {
	dir, err := s.Dir(id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	return nil
}
