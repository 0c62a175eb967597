package admission

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// repoPath returns a path relative to the repository root.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", rel)
}

// signedTenants are the test tenants signed into the bundle: platform
// (trusted). The trusted tier keeps to signed tenants (it sets no
// unsigned_tenants), so platform cannot come from testdata/tenants.json,
// the unsigned data file; it is signed in, as deploy/policy/build.sh signs
// a cluster's tenants.
const signedTenants = `{"bulkhead": {"tenants": {"platform": {"tier": "trusted", "namespaces": ["platform"]}}}}`

// testBundle is the default bundle (rego/) with signedTenants signed into
// its data and edits applied, as a security team builds it.
func testBundle(t testing.TB, edits ...policytest.Edit) string {
	t.Helper()
	return policytest.BundleWithTenants(t, signedTenants, edits...)
}

// openEngine opens testBundle, unsigned, with the data file's test tenants:
// agents (untrusted, namespaces agents and agents-batch, 3 sandboxes, 6 GPU
// slices, 64Gi), research (standard); and the bundle's platform (trusted).
func openEngine(t testing.TB) *policy.Engine {
	t.Helper()
	return openEngineOn(t, testBundle(t))
}

// openEngineOn opens bundle, unsigned, with testdata/tenants.json as the
// data file, as the webhook opens its bundle and --data.
func openEngineOn(t testing.TB, bundle string) *policy.Engine {
	t.Helper()
	e, err := policy.Open(context.Background(), policy.Options{
		BundlePath:               bundle,
		DataPath:                 filepath.Join("testdata", "tenants.json"),
		InsecureSkipVerification: true,
		Logger:                   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatalf("policy.Open on the default bundle: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// readReview reads testdata/name, an AdmissionReview as the API server sends it.
func readReview(t testing.TB, name string) ([]byte, *admissionv1.AdmissionReview) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return b, &r
}

// staticDecider answers every input with the same decision. It stands in
// for the engine only in transport tests, where the policy is irrelevant.
type staticDecider struct {
	decision policy.Decision
	err      error
}

func (s staticDecider) Decide(context.Context, policy.Input) (policy.Decision, error) {
	return s.decision, s.err
}
