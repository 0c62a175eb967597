package agreement

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

// repoRego is the repository's default bundle.
func repoRego(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "rego")
}

// writeBundle writes the table's bundle into a new directory: the default
// bundle's modules and manifest, and its data.json with the table's tenants
// and enforcement merged in. The webhook loads this directory; the node
// signs it (test/node.SignBundle) and verifies what it signed.
func writeBundle(t testing.TB) string {
	t.Helper()
	src, dir := repoRego(t), t.TempDir()
	mods, err := filepath.Glob(filepath.Join(src, "*.rego"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range append(mods, filepath.Join(src, ".manifest")) {
		if strings.HasSuffix(m, "_test.rego") {
			continue
		}
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(m)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var data, tenants map[string]map[string]any
	raw, err := os.ReadFile(filepath.Join(src, "data.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &data); err != nil {
		t.Fatalf("rego/data.json: %v", err)
	}
	if err := json.Unmarshal([]byte(tenantsJSON), &tenants); err != nil {
		t.Fatalf("tenantsJSON: %v", err)
	}
	data["bulkhead"]["tenants"] = tenants["bulkhead"]["tenants"]
	enf, _ := data["bulkhead"]["enforcement"].(map[string]any)
	if enf == nil {
		enf = map[string]any{}
	}
	for rule, mode := range enforcement {
		enf[rule] = mode
	}
	data["bulkhead"]["enforcement"] = enf
	merged, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data.json"), merged, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// claimReader answers for the table's DRA claims in every namespace: a
// claim named in claimClasses asks for one device of its class; any other
// claim, and every template, does not exist.
type claimReader struct{}

func (claimReader) ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error) {
	class, ok := claimClasses[name]
	if template || !ok {
		return nil, fmt.Errorf("%s/%s: not found", namespace, name)
	}
	return &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name:    "device",
		Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
	}}}}, nil
}

// webhook is the admission webhook's HTTP handler on a local test server,
// deciding with the table's bundle. It keeps no usage: each review sees the
// pod alone, as the node's ledger does for a tenant with nothing running.
type webhook struct {
	url    string
	client *http.Client
}

func startWebhook(t testing.TB, bundle string) *webhook {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := policy.Open(context.Background(), policy.Options{BundlePath: bundle, InsecureSkipVerification: true, Logger: quiet})
	if err != nil {
		t.Fatalf("policy.Open on the table's bundle: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	r, err := admission.NewReviewer(admission.Options{Decider: e, Claims: claimReader{}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := admission.Handler(admission.HandlerOptions{Reviewer: r, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &webhook{url: srv.URL + admission.PathValidate, client: srv.Client()}
}

// ruleID finds "[rule.id] " in a refusal, the format both sides share.
var ruleID = regexp.MustCompile(`\[([a-z0-9_]+(?:\.[a-z0-9_]+)+)\] `)

// rulesIn lists the rule ids a refusal message names.
func rulesIn(msg string) []string {
	var out []string
	for _, m := range ruleID.FindAllStringSubmatch(msg, -1) {
		out = append(out, m[1])
	}
	return out
}

// decide sends one AdmissionReview for pod (with old, an UPDATE of
// subresource) and reads the verdict. A refusal that is not the policy's
// (a status other than 403) is an error: the table only holds pods the
// API server would send.
func (w *webhook) decide(ctx context.Context, pod, old *corev1.Pod, subresource string) (verdict, string, error) {
	obj, err := json.Marshal(pod)
	if err != nil {
		return verdict{}, "", err
	}
	req := &admissionv1.AdmissionRequest{
		UID:         types.UID("review-" + string(pod.UID)),
		Kind:        metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:    metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		SubResource: subresource,
		Name:        pod.Name,
		Namespace:   pod.Namespace,
		Operation:   admissionv1.Create,
	}
	req.Object.Raw = obj
	if old != nil {
		req.Operation = admissionv1.Update
		if req.OldObject.Raw, err = json.Marshal(old); err != nil {
			return verdict{}, "", err
		}
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		return verdict{}, "", err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return verdict{}, "", err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(hreq)
	if err != nil {
		return verdict{}, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return verdict{}, "", err
	}
	if resp.StatusCode != http.StatusOK {
		return verdict{}, "", fmt.Errorf("webhook answered %s: %s", resp.Status, b)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil || out.Response == nil {
		return verdict{}, "", fmt.Errorf("webhook answer is no AdmissionReview with a response (%v): %s", err, b)
	}
	if out.Response.Allowed {
		return verdict{Allow: true}, "", nil
	}
	st := out.Response.Result
	if st == nil {
		return verdict{}, "", errors.New("webhook refused without a status")
	}
	if st.Code != http.StatusForbidden {
		return verdict{}, st.Message, fmt.Errorf("webhook refused before the policy (%d): %s", st.Code, st.Message)
	}
	v := verdictOf(rulesIn(st.Message))
	if v.Allow {
		return verdict{}, st.Message, fmt.Errorf("webhook refused naming no rule: %s", st.Message)
	}
	return v, st.Message, nil
}

// subresourceOf is the pods subresource an operation's UPDATE goes to.
var subresourceOf = map[string]string{opEphemeral: admission.SubresourceEphemeralContainers, opAnnotate: "", opResize: "resize"}

// webhookVerdict is the webhook's verdict on a case: on its pod, or, for a
// change to a running pod, on the change (after checking that the pod as
// first created is admitted).
func (w *webhook) verdict(ctx context.Context, c agreeCase) (verdict, string, error) {
	if c.Op == opCreate {
		return w.decide(ctx, c.Pod, nil, "")
	}
	first, msg, err := w.decide(ctx, c.Pod, nil, "")
	if err != nil || !first.Allow {
		return first, msg, fmt.Errorf("the pod to change is not admitted itself: %v %v %s", first, err, msg)
	}
	return w.decide(ctx, c.Later, c.Pod, subresourceOf[c.Op])
}

// checkTable holds the table to its own rules: enough rows, unique names,
// and a reason exactly where the sides are expected to differ.
func checkTable(t *testing.T, cases []agreeCase) {
	t.Helper()
	if len(cases) < 150 {
		t.Errorf("the table has %d cases; issue 24 asks for at least 150", len(cases))
	}
	for name, n := range caseNames(cases) {
		if n > 1 {
			t.Errorf("case %s appears %d times", name, n)
		}
	}
	for _, c := range cases {
		differ := !c.Webhook.equal(c.Node)
		if differ && c.Invisible == "" {
			t.Errorf("case %s: webhook %v and node %v differ without a reason", c.Name, c.Webhook, c.Node)
		}
		if !differ && c.Invisible != "" && c.Pending == "" {
			t.Errorf("case %s: marked invisible (%s) but both sides expect %v", c.Name, c.Invisible, c.Webhook)
		}
		if c.Op != opCreate && c.Later == nil {
			t.Errorf("case %s: operation %s without the changed pod", c.Name, c.Op)
		}
	}
}

// only keeps the cases whose name matches $BULKHEAD_AGREEMENT_CASES (a
// regular expression), to rerun a few rows while debugging; all by default.
func only(t *testing.T, cases []agreeCase) []agreeCase {
	t.Helper()
	expr := os.Getenv("BULKHEAD_AGREEMENT_CASES")
	if expr == "" {
		return cases
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		t.Fatalf("BULKHEAD_AGREEMENT_CASES %q: %v", expr, err)
	}
	var out []agreeCase
	for _, c := range cases {
		if re.MatchString(c.Name) {
			out = append(out, c)
		}
	}
	t.Logf("BULKHEAD_AGREEMENT_CASES=%s: %d of %d cases", expr, len(out), len(cases))
	return out
}

// TestWebhookVerdicts runs every case of the table through the webhook's
// HTTP handler and holds each verdict to the table. It needs no node, so
// it runs everywhere; TestAgreement adds the node.
func TestWebhookVerdicts(t *testing.T) {
	cases := table()
	checkTable(t, cases)
	cases = only(t, cases)
	w := startWebhook(t, writeBundle(t))
	ctx := context.Background()
	counts := map[string]int{}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			got, msg, err := w.verdict(ctx, c)
			switch {
			case c.Pending != "":
				counts["pending"]++
				state := fmt.Sprintf("webhook %v, want %v", got, c.Webhook)
				if err != nil {
					state = "webhook error: " + err.Error()
				} else if got.equal(c.Webhook) {
					state = "webhook now answers as expected"
				}
				t.Skipf("pending (%s): %s", c.Pending, state)
			case err != nil:
				counts["error"]++
				t.Fatal(err)
			case !got.equal(c.Webhook):
				counts["wrong"]++
				t.Errorf("webhook: %v, want %v\n%s", got, c.Webhook, msg)
			default:
				counts["as expected"]++
			}
		})
	}
	t.Logf("webhook half: %d cases: %v", len(cases), fmtCounts(counts))
}

func fmtCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
