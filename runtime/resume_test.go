package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
)

// resumeFixture is a pipeline with one agents (untrusted) pod placed by an
// agent that is gone: its record and reservation are all that is left.
type resumeFixture struct {
	cfg  config.Config
	pl   *Pipeline
	opts PodOptions
	dir  string
}

func newResumeFixture(t *testing.T) *resumeFixture {
	t.Helper()
	cfg := testConfig(t)
	pl, err := OpenPipeline(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := PodOptions{Config: cfg, Runtime: policy.RuntimeGVisor, ShimPID: os.Getpid(), Pipeline: pl,
		DeleteTask: func(context.Context, string) error { return nil }}
	return &resumeFixture{cfg: cfg, pl: pl, opts: opts, dir: t.TempDir()}
}

// place places pod name of namespace ns as sandbox id, as the agent that
// admitted it did, and returns the path of its record.
func (f *resumeFixture) place(t *testing.T, ns, name, id string) string {
	t.Helper()
	first, err := NewPod(f.opts)
	if err != nil {
		t.Fatal(err)
	}
	_, spec := sandboxSpec(ns, name, nil)
	spec.Annotations[cri.AnnotationSandboxUID] = "uid-" + name
	bundle := filepath.Join(f.dir, id)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeSpecIfChanged(bundle, nil, spec); err != nil {
		t.Fatal(err)
	}
	if err := first.Create(context.Background(), id, bundle, func(string) error { return nil }); err != nil {
		t.Fatal(err)
	}
	dir, err := node.NewStateDir(f.cfg).Dir(id)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "sandbox.json")
}

// hostRoot has the resumed pod p create a container that binds the host's
// / read-write.
func (f *resumeFixture) hostRoot(t *testing.T, p *Pod, id string) error {
	t.Helper()
	spec := specinputtest.CRISpec()
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind", "rw"}})
	bundle := filepath.Join(f.dir, id)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeSpecIfChanged(bundle, nil, spec); err != nil {
		t.Fatal(err)
	}
	return p.Create(context.Background(), id, bundle, func(string) error { return nil })
}

// reservation is sandbox id's reservation in the ledger; nil if none.
func (f *resumeFixture) reservation(t *testing.T, id string) *node.Reservation {
	t.Helper()
	var res *node.Reservation
	if err := f.pl.node.Ledger().View(func(tx *node.LedgerTx) error {
		var err error
		res, err = tx.Get(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

// replace is an edit of a record's bytes that must find old.
func replace(old, new string) func(t *testing.T, raw []byte) []byte {
	return func(t *testing.T, raw []byte) []byte {
		t.Helper()
		if !bytes.Contains(raw, []byte(old)) {
			t.Fatalf("record has no %s to edit:\n%s", old, raw)
		}
		return bytes.ReplaceAll(raw, []byte(old), []byte(new))
	}
}

// unsealed is the record raw as a release that keeps no MAC writes it.
func unsealed(t *testing.T, raw []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "mac")
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestResumePodRefusesAnEditedRecord: whoever may write state_dir must not
// change what a pod was admitted as. An untrusted (agents) pod's record is
// edited on disk as an attacker would, and the next agent resumes the pod:
// the resume is refused, naming the sandbox and the rule, so no container of
// the pod can bind the host's / ; GC still releases everything the pod held
// once it is dead.
func TestResumePodRefusesAnEditedRecord(t *testing.T) {
	f := newResumeFixture(t)
	ctx := context.Background()
	// A trusted pod's record, sealed by this node.
	trusted, err := os.ReadFile(f.place(t, "platform", "trusted-0", "trusted"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(t *testing.T, raw []byte) []byte
	}{
		// The record's namespace and the input's: the policy would judge the
		// pod's containers as the trusted tenant's.
		{"namespace of the trusted tenant", replace(`"namespace": "agents"`, `"namespace": "platform"`)},
		{"tenant and namespace", func(t *testing.T, raw []byte) []byte {
			raw = replace(`"namespace": "agents"`, `"namespace": "platform"`)(t, raw)
			return replace(`"tenant": "agents"`, `"tenant": "platform"`)(t, raw)
		}},
		{"decision tier", replace(`"tier": "untrusted"`, `"tier": "trusted"`)},
		{"decision rdma", replace(`"rdma": "deny"`, `"rdma": "own-vf"`)},
		{"decision egress", replace(`"egress_cidrs": []`, `"egress_cidrs": ["0.0.0.0/0"]`)},
		// Another pod's UID makes that pod's kubelet directory "the pod's own".
		{"pod uid", replace(`"uid": "uid-victim-0"`, `"uid": "uid-someone-else"`)},
		{"request annotations", replace(`"handler": "bulkhead"`, `"handler": "bulkhead", "annotations": {"bulkhead.dev/rdma": "true"}`)},
		{"container limits", replace(`"limits": {`, `"limits": {"ghost": {"name": "ghost", "memory_bytes": -1099511627776},`)},
		// Another sandbox's record, MAC and all, copied over this one's.
		{"a trusted pod's sealed record", func(*testing.T, []byte) []byte { return trusted }},
		// A record stripped of its MAC as if the previous release wrote it.
		{"mac stripped, namespace edited", func(t *testing.T, raw []byte) []byte {
			return unsealed(t, replace(`"namespace": "agents"`, `"namespace": "platform"`)(t, raw))
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := "victim-" + string(rune('a'+i))
			path := f.place(t, "agents", "victim-0", id)
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			edited := tt.edit(t, raw)
			if bytes.Equal(edited, raw) {
				t.Fatal("the edit changed nothing")
			}
			if err := os.WriteFile(path, edited, 0o600); err != nil {
				t.Fatal(err)
			}

			p, err := ResumePod(f.opts, id)
			if err == nil {
				cerr := f.hostRoot(t, p, id+"-host")
				t.Errorf("ResumePod of an edited record: no error; a container binding the host's / then: %v", cerr)
			} else {
				t.Logf("refused: %v", err)
			}
			if err != nil && !strings.Contains(err.Error(), "sandbox "+id) || !strings.Contains(err.Error(), node.RuleRecordAuthentic) && !strings.Contains(err.Error(), node.RuleRecordLedger) {
				t.Errorf("ResumePod = %v, want a refusal naming sandbox %s and %s or %s", err, id, node.RuleRecordAuthentic, node.RuleRecordLedger)
			}

			// The pod is gone (its shim is no shim, runsc holds no state):
			// the agent's GC releases its reservation and removes the record
			// it cannot read.
			rep, err := f.pl.node.GCExcept(ctx, func(string) bool { return false })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(rep.Released, id) || !slices.Contains(rep.Records, id) {
				t.Errorf("gc after the refusal: %+v, want %s released and its record removed", rep, id)
			}
			if res := f.reservation(t, id); res != nil {
				t.Errorf("reservation after gc: %+v", res)
			}
		})
	}
}

// TestResumePodSealsARecordOfThePreviousRelease: a pod placed by the
// release before this one has a record without a MAC and a reservation
// that does not say its record is sealed. The upgraded agent resumes it
// once its identity agrees with the ledger, seals it, and judges its
// containers as before (TestUpgradeInPlace: an allowed one starts, a host
// path is refused by the policy); from then on a MAC stripped again is
// refused. An unsealed record that disagrees with the ledger is refused.
func TestResumePodSealsARecordOfThePreviousRelease(t *testing.T) {
	f := newResumeFixture(t)
	// previous rewrites sandbox id's record and reservation as the previous
	// release wrote them, with edit applied to the record.
	previous := func(t *testing.T, path, id string, edit func(*testing.T, []byte) []byte) {
		t.Helper()
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, edit(t, unsealed(t, raw)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := f.pl.node.Ledger().Update(func(tx *node.LedgerTx) error {
			r, err := tx.Get(id)
			if err != nil || r == nil {
				t.Fatalf("reservation of %s: %+v, %v", id, r, err)
			}
			r.SealedRecord = false
			return tx.Put(r)
		}); err != nil {
			t.Fatal(err)
		}
	}
	asIs := func(_ *testing.T, raw []byte) []byte { return raw }

	path := f.place(t, "agents", "old-0", "old")
	if res := f.reservation(t, "old"); res == nil || !res.SealedRecord {
		t.Fatalf("reservation of a pod this release placed: %+v, want SealedRecord", res)
	}
	previous(t, path, "old", asIs)
	if _, err := node.NewStateDir(f.cfg).Load("old"); !errors.Is(err, node.ErrRecordUnsealed) {
		t.Fatalf("Load of the previous release's record = %v, want ErrRecordUnsealed", err)
	}
	p, err := ResumePod(f.opts, "old")
	if err != nil {
		t.Fatalf("ResumePod of the previous release's pod: %v", err)
	}
	if _, err := node.NewStateDir(f.cfg).Load("old"); err != nil {
		t.Errorf("the record after the resume does not authenticate: %v", err)
	}
	if res := f.reservation(t, "old"); res == nil || !res.SealedRecord {
		t.Errorf("reservation after the resume: %+v, want SealedRecord", res)
	}
	if err := f.hostRoot(t, p, "old-host"); err == nil || !strings.Contains(err.Error(), "[workload.host_path] ") {
		t.Errorf("a container binding the host's / in the resumed pod: %v, want workload.host_path", err)
	}
	work := filepath.Join(f.dir, "old-app")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeSpecIfChanged(work, nil, containerSpec("app", 1<<28)); err != nil {
		t.Fatal(err)
	}
	if err := p.Create(context.Background(), "old-app", work, func(string) error { return nil }); err != nil {
		t.Errorf("an allowed container in the resumed pod: %v", err)
	}

	// Sealed now: its MAC stripped again, it is refused.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, unsealed(t, raw), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ResumePod(f.opts, "old"); err == nil || !strings.Contains(err.Error(), node.RuleRecordAuthentic) || !strings.Contains(err.Error(), "seals every record") {
		t.Errorf("ResumePod of a sealed record stripped of its MAC = %v, want a refusal naming %s", err, node.RuleRecordAuthentic)
	}

	// The previous release's record, edited to a trusted tenant's namespace.
	path = f.place(t, "agents", "old-1", "old-edited")
	previous(t, path, "old-edited", replace(`"namespace": "agents"`, `"namespace": "platform"`))
	if _, err := ResumePod(f.opts, "old-edited"); err == nil || !strings.Contains(err.Error(), "["+node.RuleRecordLedger+"] ") || !strings.Contains(err.Error(), "sandbox old-edited") {
		t.Errorf("ResumePod of the previous release's edited record = %v, want a refusal naming %s", err, node.RuleRecordLedger)
	}
	if _, err := node.NewStateDir(f.cfg).Load("old-edited"); !errors.Is(err, node.ErrRecordUnsealed) {
		t.Errorf("a refused record was sealed: Load = %v", err)
	}
}
