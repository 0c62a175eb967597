package admission

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// corpusObject is one object of testdata/corpus.
type corpusObject struct {
	file string
	gvk  schema.GroupVersionKind
	name string
	raw  []byte
}

// readCorpus reads every object of testdata/corpus/*.yaml and of the
// verbatim upstream copies in testdata/corpus/*/*.yaml.
func readCorpus(t testing.TB) []corpusObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "corpus", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	upstream, err := filepath.Glob(filepath.Join("testdata", "corpus", "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, upstream...)
	var out []corpusObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			var head struct {
				metav1.TypeMeta
				Metadata struct{ Name string } `json:"metadata"`
			}
			if err := json.Unmarshal(raw, &head); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(raw) == 0 || string(raw) == "null" {
				continue // an empty document between two ---
			}
			out = append(out, corpusObject{file: filepath.Base(f), gvk: head.GroupVersionKind(), name: head.Metadata.Name, raw: raw})
		}
	}
	return out
}

// corpusTiers are the test tenants' namespaces, one per tier.
var corpusTiers = []struct{ namespace, tier string }{
	{"agents", "untrusted"}, {"research", "standard"}, {"platform", "trusted"},
}

// sendReview sends one AdmissionReview to url and returns the HTTP status,
// the response and the time it took.
func sendReview(t testing.TB, url string, req admissionv1.AdmissionRequest) (int, *admissionv1.AdmissionResponse, time.Duration) {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &req,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, took
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("response: %v: %s", err, b)
	}
	return resp.StatusCode, out.Response, took
}

// corpusServer serves the webhook's handler over plain HTTP with slots
// review slots (what GOMAXPROCS gives the handler).
func corpusServer(t testing.TB, slots int, opts Options) string {
	t.Helper()
	rev, err := NewReviewer(opts)
	if err != nil {
		t.Fatal(err)
	}
	prev := runtime.GOMAXPROCS(slots)
	h, err := Handler(HandlerOptions{Reviewer: rev})
	runtime.GOMAXPROCS(prev)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + PathValidate
}

// TestCorpusReplay replays every manifest of testdata/corpus into every
// tier through the HTTP handler: no 5xx, the uid echoed, every denial names
// a rule, every 400 names the object. It logs counts per tier and latency.
func TestCorpusReplay(t *testing.T) {
	url := corpusServer(t, 2, Options{Decider: openEngine(t), Metrics: NewMetrics()})
	objects := readCorpus(t)
	// Decisions the corpus pins down (issue 19): a DaemonSet mounting /dev
	// is admitted where /dev/** is allowed, and a DRA GPU claim is judged.
	expect := map[string]string{
		"platform/DaemonSet/newrelic-infrastructure": "allowed",
		"platform/DaemonSet/node-exporter":           "allowed",
		"agents/Deployment/dra-gpu-example":          "[workload.claim_unread]",
		"research/DaemonSet/newrelic-infrastructure": "[workload.device_forbidden]",
		"agents/Pod/agent-sandbox":                   "allowed",
		"agents/Pod/cuda-vector-add":                 "[gpu.",
	}
	type counts struct{ allowed, denied, invalid int }
	perTier := map[string]*counts{}
	var latencies []time.Duration
	skipped := 0
	for _, o := range objects {
		if !slices.Contains(SupportedKinds(), o.gvk) {
			skipped++
			continue
		}
		for _, tier := range corpusTiers {
			c := perTier[tier.tier]
			if c == nil {
				c = &counts{}
				perTier[tier.tier] = c
			}
			id := fmt.Sprintf("%s/%s/%s", tier.namespace, o.gvk.Kind, o.name)
			req := admissionv1.AdmissionRequest{
				UID:       types.UID("corpus-" + metav1TypesUID(id)),
				Kind:      metav1.GroupVersionKind(o.gvk),
				Namespace: tier.namespace,
				Name:      o.name,
				Operation: admissionv1.Create,
			}
			req.Object.Raw = o.raw
			code, resp, took := sendReview(t, url, req)
			latencies = append(latencies, took)
			if code != http.StatusOK {
				t.Errorf("%s (%s): HTTP %d", id, o.file, code)
				continue
			}
			if resp.UID != req.UID {
				t.Errorf("%s: uid %q, want %q", id, resp.UID, req.UID)
			}
			got := "allowed"
			switch {
			case resp.Allowed:
				c.allowed++
			case resp.Result != nil && resp.Result.Code == http.StatusForbidden:
				c.denied++
				got = resp.Result.Message
				if !strings.Contains(got, "[") || !strings.Contains(got, "]") {
					t.Errorf("%s: denial names no rule: %s", id, got)
				}
			case resp.Result != nil && resp.Result.Code == http.StatusBadRequest:
				c.invalid++
				got = resp.Result.Message
				t.Logf("%s (%s): 400: %s", id, o.file, got)
				if !strings.Contains(got, fmt.Sprintf("%s %q", strings.ToLower(o.gvk.Kind), o.name)) {
					t.Errorf("%s: 400 does not name the object: %s", id, got)
				}
			default:
				t.Errorf("%s: refused with %+v", id, resp.Result)
				continue
			}
			if want, ok := expect[id]; ok && !(want == "allowed" && resp.Allowed) && (want == "allowed" || !strings.Contains(got, want)) {
				t.Errorf("%s: got %q, want %q", id, got, want)
			}
		}
	}
	slices.Sort(latencies)
	pct := func(p float64) time.Duration { return latencies[int(p*float64(len(latencies)-1))] }
	for _, tier := range corpusTiers {
		c := perTier[tier.tier]
		t.Logf("tier %-9s: %d allowed, %d denied, %d invalid", tier.tier, c.allowed, c.denied, c.invalid)
	}
	t.Logf("%d objects (%d of kinds not reviewed skipped), %d reviews: latency p50 %v, p99 %v, max %v; max RSS %d MiB",
		len(objects), skipped, len(latencies), pct(0.5), pct(0.99), latencies[len(latencies)-1], maxRSSMiB())
}

// metav1TypesUID makes a uid-safe suffix of id.
func metav1TypesUID(id string) string {
	return strings.NewReplacer("/", "-").Replace(strings.ToLower(id))
}

// maxRSSMiB is this process's peak resident set.
func maxRSSMiB() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Maxrss >> 10
}

// TestHostileQuantitiesDoNotHoldOrdinaryReviews: with the handler's two
// review slots each taken by a hostile quantity (once ~10 s of CPU and
// minutes each), an ordinary review behind them is answered. It logs how
// long that review waited (issue 19's goal: under 1 s).
func TestHostileQuantitiesDoNotHoldOrdinaryReviews(t *testing.T) {
	url := corpusServer(t, 2, Options{Decider: openEngine(t)})
	hostile := func(q string) admissionv1.AdmissionRequest {
		r := *reviewOf(t, "agents", kindPod, podWith(`"memory":"`+q+`"`))
		r.UID = types.UID("hostile-" + q[:6])
		return r
	}
	var wg sync.WaitGroup
	for _, q := range []string{"1e-30000000", "1e-1000000000"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, resp, took := sendReview(t, url, hostile(q))
			if code != http.StatusOK || resp.Allowed || resp.Result.Code != http.StatusBadRequest {
				t.Errorf("hostile %s: HTTP %d, %+v", q, code, resp)
				return
			}
			t.Logf("hostile %s refused in %v: %s", q, took, resp.Result.Message)
		}()
	}
	// Let the hostile reviews reach the slots first (a pause, not a
	// measurement): the ordinary one must queue behind them.
	time.Sleep(200 * time.Millisecond)
	_, ordinary := readReview(t, "pod-allowed.json")
	code, resp, took := sendReview(t, url, *ordinary.Request)
	wg.Wait()
	if code != http.StatusOK || !resp.Allowed {
		t.Fatalf("ordinary review: HTTP %d, %+v", code, resp)
	}
	t.Logf("an ordinary review sent with two hostile quantities took %v", took)

	// A pod of 10,000 unpinned containers (once 8 s in the untrusted tier).
	var limits []string
	for range 10000 {
		limits = append(limits, `"memory":"1Mi"`)
	}
	unpinned := strings.ReplaceAll(podWith(limits...), "registry.local/app@sha256:"+strings.Repeat("0", 64), "busybox:1.36")
	code, resp, took = sendReview(t, url, *reviewOf(t, "agents", kindPod, unpinned))
	if code != http.StatusOK || resp.UID == "" {
		t.Fatalf("10,000 containers: HTTP %d, %+v", code, resp)
	}
	switch {
	case !resp.Allowed && resp.Result != nil && resp.Result.Code == http.StatusGatewayTimeout:
		// A busy machine may take longer than the deadline: then the
		// review is refused, which is also a correct answer.
		t.Logf("10,000 containers with unpinned images (%d KiB): refused at the deadline after %v: %s", len(unpinned)>>10, took, resp.Result.Message)
	case len(resp.Warnings) != maxListed+1:
		t.Errorf("10,000 unpinned images: %d warnings, want %d (%+v)", len(resp.Warnings), maxListed+1, resp.Result)
	default:
		t.Logf("10,000 containers with unpinned images (%d KiB): allowed=%v, %d warnings (last %q), answered in %v",
			len(unpinned)>>10, resp.Allowed, len(resp.Warnings), resp.Warnings[len(resp.Warnings)-1], took)
	}
}
