package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Sandbox is Bulkhead's record of one pod sandbox. It is written to the
// state directory before the sandbox is created, so a crash at any later
// point leaves a record that GC can act on.
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
type StateDir struct {
	root string
}

// NewStateDir returns the state directory rooted at root.
func NewStateDir(root string) *StateDir { return &StateDir{root: root} }

// Root returns the state directory's root.
func (s *StateDir) Root() string { return s.root }

// validID matches containerd ids (and so keeps ids from escaping the directory).
var validID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// Dir returns the directory of sandbox id.
func (s *StateDir) Dir(id string) (string, error) {
	if !validID.MatchString(id) {
		return "", fmt.Errorf("sandbox id %q: must match %s", id, validID)
	}
	return filepath.Join(s.root, "sandboxes", id), nil
}

// Save writes the record atomically (write to a temporary file, then rename).
func (s *StateDir) Save(sb *Sandbox) error {
	dir, err := s.Dir(sb.ID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	data, err := json.MarshalIndent(sb, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, "sandbox.json"), data, 0o600)
}

// Load reads the record of sandbox id.
func (s *StateDir) Load(id string) (*Sandbox, error) {
	dir, err := s.Dir(id)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
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
