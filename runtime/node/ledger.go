package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Reservation states. A reservation is written as StateReserved before
// anything is created for the sandbox, becomes StateActive once the sandbox
// runs and its fence is in place, and is deleted when released.
const (
	StateReserved = "reserved"
	StateActive   = "active"
)

// Reservation is everything the node holds for one sandbox.
type Reservation struct {
	SandboxID string `json:"sandbox_id"`
	State     string `json:"state"`
	Tenant    string `json:"tenant"`
	Tier      string `json:"tier"`
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// MemoryBytes is charged against the tenant's memory quota.
	MemoryBytes int64 `json:"memory_bytes"`
	// GPU is the MIG slice (or whole GPU) reserved for the sandbox.
	GPU *mig.Placement `json:"gpu,omitempty"`
	// Instance is the MIG instance once created on the GPU.
	Instance *mig.Instance `json:"instance,omitempty"`
	// Endpoint is the host-side interface registered in the eBPF fence.
	Endpoint *FenceRecord `json:"endpoint,omitempty"`
	// Claim is set when the reservation holds a DRA ResourceClaim's device
	// rather than a sandbox's: SandboxID is then the claim's UID. A claim
	// lives until the kubelet unprepares it, not while a shim runs, and it
	// is no sandbox of its tenant (the pods that use it have their own).
	Claim *ClaimRecord `json:"claim,omitempty"`
	// SealedRecord says the sandbox's record is sealed (StateDir.Save):
	// set by every release that seals records, when it reserves or when
	// it seals a record of an earlier release. A record without a MAC is
	// refused for a reservation that says so: stripping the MAC does not
	// make a record pass for an earlier release's.
	SealedRecord bool `json:"sealed_record,omitempty"`
	// ShimPID is the shim that made the reservation.
	ShimPID   int       `json:"shim_pid"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// FenceRecord is the eBPF fence registration of a sandbox.
type FenceRecord struct {
	Ifindex int      `json:"ifindex"`
	Ifname  string   `json:"ifname"`
	IPs     []string `json:"ips"`
}

// ClaimRecord names the ResourceClaim a reservation holds a device for.
type ClaimRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Device is the allocated device's name in the node's pool.
	Device string `json:"device"`
	// CDIDevice is the CDI device id returned to the kubelet, once written.
	CDIDevice string `json:"cdi_device,omitempty"`
}

// GPUSlices is what the reservation charges against the GPU quota: compute
// slices of a MIG placement, 7 for a whole GPU.
func (r *Reservation) GPUSlices() int {
	if r.GPU == nil {
		return 0
	}
	return r.GPU.Compute
}

var bucketSandboxes = []byte("sandboxes")

// The ledger's format: its buckets and what their records mean. A release
// that changes the meaning of a record (not just adds a field, which older
// readers ignore) raises it and migrates older ledgers when it opens them;
// a release that finds a newer format refuses it rather than misread it.
// Format 1 is the first to be recorded; a ledger without one is format 1.
const ledgerFormat = 1

var (
	bucketMeta = []byte("meta")
	keyFormat  = []byte("format")
)

// ErrLedgerNewer is returned for a ledger written by a newer release than
// this one: downgrading a node across a ledger format is not supported.
var ErrLedgerNewer = errors.New("the ledger has a newer format than this build")

// checkFormat refuses a ledger of a newer format and, in a writable
// transaction, records this build's format in one that has none.
func checkFormat(path string, btx *bolt.Tx) error {
	meta := btx.Bucket(bucketMeta)
	if meta == nil {
		if !btx.Writable() {
			return nil
		}
		var err error
		if meta, err = btx.CreateBucket(bucketMeta); err != nil {
			return err
		}
	}
	v := meta.Get(keyFormat)
	if v == nil {
		if !btx.Writable() {
			return nil
		}
		return meta.Put(keyFormat, []byte(strconv.Itoa(ledgerFormat)))
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return fmt.Errorf("ledger %s: format %q: %w", path, v, err)
	}
	if n > ledgerFormat {
		return fmt.Errorf("%w: %s holds format %d, this build knows formats up to %d; run the release that wrote it (roll the node forward again)",
			ErrLedgerNewer, path, n, ledgerFormat)
	}
	return nil
}

// ErrLedgerBusy means another shim held the ledger longer than the timeout.
var ErrLedgerBusy = errors.New("ledger busy")

// Ledger is the node-wide record of reservations, shared by every shim
// process on the node. Each transaction opens the database, which takes
// bbolt's exclusive file lock, so transactions are serialised across
// processes; a crashed process releases the lock with its file descriptor.
type Ledger struct {
	path    string
	timeout time.Duration
}

// OpenLedger returns the ledger at path, creating the file and its bucket.
func OpenLedger(path string) (*Ledger, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("ledger %s: %w", path, err)
	}
	l := &Ledger{path: path, timeout: 30 * time.Second}
	return l, l.Update(func(*LedgerTx) error { return nil })
}

// Path returns the database file.
func (l *Ledger) Path() string { return l.path }

// Update runs fn in one read-write transaction, exclusive node-wide.
func (l *Ledger) Update(fn func(tx *LedgerTx) error) error {
	db, err := bolt.Open(l.path, 0o600, &bolt.Options{Timeout: l.timeout})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return fmt.Errorf("ledger %s: %w after %v", l.path, ErrLedgerBusy, l.timeout)
		}
		return fmt.Errorf("ledger %s: %w", l.path, err)
	}
	defer db.Close()
	return db.Update(func(btx *bolt.Tx) error {
		if err := checkFormat(l.path, btx); err != nil {
			return err
		}
		b, err := btx.CreateBucketIfNotExists(bucketSandboxes)
		if err != nil {
			return err
		}
		return fn(&LedgerTx{b: b, writable: true})
	})
}

// View runs fn in a read-only transaction.
func (l *Ledger) View(fn func(tx *LedgerTx) error) error {
	db, err := bolt.Open(l.path, 0o600, &bolt.Options{Timeout: l.timeout, ReadOnly: true})
	if err != nil {
		return fmt.Errorf("ledger %s: %w", l.path, err)
	}
	defer db.Close()
	return db.View(func(btx *bolt.Tx) error {
		if err := checkFormat(l.path, btx); err != nil {
			return err
		}
		b := btx.Bucket(bucketSandboxes)
		return fn(&LedgerTx{b: b})
	})
}

// LedgerTx is one ledger transaction.
type LedgerTx struct {
	b        *bolt.Bucket
	writable bool
}

// Get returns the reservation of sandbox id, or nil.
func (tx *LedgerTx) Get(id string) (*Reservation, error) {
	if tx.b == nil {
		return nil, nil
	}
	data := tx.b.Get([]byte(id))
	if data == nil {
		return nil, nil
	}
	var r Reservation
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("ledger: sandbox %s: %w", id, err)
	}
	return &r, nil
}

// Put writes a reservation.
func (tx *LedgerTx) Put(r *Reservation) error {
	if r.SandboxID == "" {
		return errors.New("ledger: reservation without sandbox id")
	}
	r.UpdatedAt = time.Now().UTC()
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.b.Put([]byte(r.SandboxID), data)
}

// Delete drops the reservation of sandbox id; a missing one is not an error.
func (tx *LedgerTx) Delete(id string) error {
	return tx.b.Delete([]byte(id))
}

// List returns every reservation ordered by sandbox id.
func (tx *LedgerTx) List() ([]*Reservation, error) {
	var out []*Reservation
	if tx.b == nil {
		return nil, nil
	}
	err := tx.b.ForEach(func(k, v []byte) error {
		var r Reservation
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("ledger: sandbox %s: %w", k, err)
		}
		out = append(out, &r)
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].SandboxID < out[j].SandboxID })
	return out, err
}

// Usage sums a tenant's reservations (every state counts: a reserved
// sandbox is about to exist). A claim's reservation charges its GPU slices
// and no sandbox: the pods that use the claim are charged their own.
func (tx *LedgerTx) Usage(tenant string) (policy.Usage, error) {
	all, err := tx.List()
	if err != nil {
		return policy.Usage{}, err
	}
	var u policy.Usage
	for _, r := range all {
		if r.Tenant != tenant {
			continue
		}
		if r.Claim == nil {
			u.Sandboxes++
		}
		u.GPUSlices += r.GPUSlices()
		u.MemoryBytes += r.MemoryBytes
	}
	return u, nil
}

// Placements returns every GPU placement held on the node.
func (tx *LedgerTx) Placements() ([]mig.Placement, error) {
	all, err := tx.List()
	if err != nil {
		return nil, err
	}
	var out []mig.Placement
	for _, r := range all {
		if r.GPU != nil {
			out = append(out, *r.GPU)
		}
	}
	return out, nil
}
