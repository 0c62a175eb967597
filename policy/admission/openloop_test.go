package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// The open-loop load test: reviews arrive as a Poisson process at a fixed
// rate, whatever the server's answers take, so a slow server meets a
// growing queue rather than slowing its clients down (a closed loop hides
// that). Latency counts from each request's planned arrival time. Run:
//
//	BULKHEAD_OPENLOOP=1 go test -run TestOpenLoop -v -timeout 20m ./policy/admission/
//
// with BULKHEAD_OPENLOOP_RATES (default "1000,4000" reviews/s),
// BULKHEAD_OPENLOOP_SECONDS (default 30), BULKHEAD_WEBHOOK (the
// bulkhead-webhook binary; default: built here) and BULKHEAD_OPA (the opa
// binary; default $TOOLS_DIR/bin/opa). Both servers run as processes of
// their own on loopback with TLS: bulkhead-webhook on the default bundle,
// and `opa run --server` on the same modules and data, asked the same
// decision through its REST API (POST /v1/data/bulkhead/decision) with the
// input the webhook builds, as in the classic OPA admission set-up.

// openLoopTarget is one server under load.
type openLoopTarget struct {
	name   string
	url    string
	bodies [][]byte // sent in turn
}

type openLoopResult struct {
	target             string
	rate               int
	sent, ok, failures int
	p50, p99, p999     time.Duration
	max                time.Duration
	firstErr           string
}

func TestOpenLoop(t *testing.T) {
	if os.Getenv("BULKHEAD_OPENLOOP") == "" {
		t.Skip("set BULKHEAD_OPENLOOP=1 to run the open-loop load test (loopback, bounded by BULKHEAD_OPENLOOP_SECONDS per rate and target)")
	}
	rates := []int{1000, 4000}
	if v := os.Getenv("BULKHEAD_OPENLOOP_RATES"); v != "" {
		rates = nil
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(f)
			if err != nil || r <= 0 || r > 20000 {
				t.Fatalf("BULKHEAD_OPENLOOP_RATES: %q is not a rate from 1 to 20000", f)
			}
			rates = append(rates, r)
		}
	}
	seconds := 30
	if v := os.Getenv("BULKHEAD_OPENLOOP_SECONDS"); v != "" {
		var err error
		if seconds, err = strconv.Atoi(v); err != nil || seconds <= 0 || seconds > 120 {
			t.Fatalf("BULKHEAD_OPENLOOP_SECONDS: %q is not from 1 to 120", v)
		}
	}

	dir := t.TempDir()
	ca := newTestCA(t)
	ca.issue(t, dir, 1)
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 4096,
	}}

	// The reviews, and the policy inputs the webhook builds from them.
	var reviews [][]byte
	var inputs [][]byte
	var wantAllowed []bool
	rec := &recordingDecider{Decider: openEngine(t)}
	rev, err := NewReviewer(Options{Decider: rec})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range benchReviews {
		body, review := readReview(t, f)
		reviews = append(reviews, body)
		resp := rev.Review(context.Background(), review.Request)
		wantAllowed = append(wantAllowed, resp.Allowed)
		in, err := json.Marshal(map[string]any{"input": rec.last})
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, in)
	}

	webhook := os.Getenv("BULKHEAD_WEBHOOK")
	if webhook == "" {
		webhook = filepath.Join(dir, "bulkhead-webhook")
		if out, err := exec.Command("go", "build", "-o", webhook, "github.com/bulkhead-runtime/bulkhead/cmd/bulkhead-webhook").CombinedOutput(); err != nil {
			t.Fatalf("building bulkhead-webhook: %v\n%s", err, out)
		}
	}
	opa := os.Getenv("BULKHEAD_OPA")
	if opa == "" {
		opa = filepath.Join(os.Getenv("TOOLS_DIR"), "bin", "opa")
		if os.Getenv("TOOLS_DIR") == "" {
			opa = filepath.Join(os.Getenv("HOME"), ".cache", "bulkhead", "tools", "bin", "opa")
		}
	}

	// The webhook gets testBundle and the data file, as deployed; OPA gets
	// the same modules and data with every test tenant in data.json, as
	// policy.Options.DataPath merges them.
	var signed, unsigned map[string]map[string]map[string]any
	if err := json.Unmarshal([]byte(signedTenants), &signed); err != nil {
		t.Fatal(err)
	}
	readJSON(t, filepath.Join("testdata", "tenants.json"), &unsigned)
	maps.Copy(unsigned["bulkhead"]["tenants"], signed["bulkhead"]["tenants"])
	all, _ := json.Marshal(unsigned)
	opaDir := policytest.BundleWithTenants(t, string(all))

	whAddr, opaAddr := freePort(t), freePort(t)
	startProcess(t, webhook, "--listen="+whAddr, "--tls-cert="+crt, "--tls-key="+key,
		"--bundle="+testBundle(t), "--data="+filepath.Join("testdata", "tenants.json"),
		"--insecure-skip-verification", "--no-usage")
	startProcess(t, opa, "run", "--server", "--addr="+opaAddr, "--tls-cert-file="+crt, "--tls-private-key-file="+key,
		"--log-level=error", "--disable-telemetry", opaDir)
	waitHTTP(t, client, "https://"+whAddr+PathHealthz)
	waitHTTP(t, client, "https://"+opaAddr+"/health")

	targets := []openLoopTarget{
		{name: "bulkhead-webhook", url: "https://" + whAddr + PathValidate, bodies: reviews},
		{name: "opa run --server", url: "https://" + opaAddr + "/v1/data/bulkhead/decision", bodies: inputs},
	}
	// Same decisions: the webhook's answers and OPA's.
	for i := range reviews {
		var out admissionv1.AdmissionReview
		postJSON(t, client, targets[0].url, reviews[i], &out)
		var opaOut struct {
			Result policy.Decision `json:"result"`
		}
		postJSON(t, client, targets[1].url, inputs[i], &opaOut)
		if out.Response == nil || out.Response.Allowed != wantAllowed[i] || admits(opaOut.Result) != wantAllowed[i] {
			t.Fatalf("%s: webhook allowed=%v, OPA allow=%v, want %v", benchReviews[i], out.Response != nil && out.Response.Allowed, admits(opaOut.Result), wantAllowed[i])
		}
	}

	var results []openLoopResult
	for _, rate := range rates {
		for _, target := range targets {
			// Warm up: connections, caches.
			openLoop(client, target, rate, 2*time.Second)
			results = append(results, openLoop(client, target, rate, time.Duration(seconds)*time.Second))
			r := results[len(results)-1]
			t.Logf("%-18s %5d/s  sent %6d  ok %6d  errors %5d  p50 %8v  p99 %8v  p99.9 %8v  max %8v %s",
				r.target, r.rate, r.sent, r.ok, r.failures, r.p50, r.p99, r.p999, r.max, r.firstErr)
		}
	}
	if out := os.Getenv("BULKHEAD_OPENLOOP_OUT"); out != "" {
		var b bytes.Buffer
		fmt.Fprintf(&b, "| server | rate (reviews/s) | sent | errors | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|---|\n")
		for _, r := range results {
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %v | %v | %v | %v |\n", r.target, r.rate, r.sent, r.failures,
				r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), r.p999.Round(10*time.Microsecond), r.max.Round(time.Millisecond))
		}
		writeFile(t, out, b.Bytes())
	}
}

// openLoop sends requests to target at Poisson arrivals of the given rate
// for d, each in a goroutine of its own, and measures each from its
// planned arrival.
func openLoop(client *http.Client, target openLoopTarget, rate int, d time.Duration) openLoopResult {
	res := openLoopResult{target: target.name, rate: rate}
	var (
		mu        sync.Mutex
		latencies []time.Duration
		failures  atomic.Int64
		firstErr  atomic.Pointer[string]
		wg        sync.WaitGroup
		inFlight  atomic.Int64
	)
	fail := func(msg string) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, &msg)
	}
	start := time.Now()
	next := start
	for i := 0; ; i++ {
		next = next.Add(time.Duration(rand.ExpFloat64() / float64(rate) * float64(time.Second)))
		if next.Sub(start) >= d {
			break
		}
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		res.sent++
		if inFlight.Load() >= 20000 {
			fail("dropped: 20,000 requests in flight")
			continue
		}
		inFlight.Add(1)
		wg.Add(1)
		go func(planned time.Time, body []byte) {
			defer wg.Done()
			defer inFlight.Add(-1)
			resp, err := client.Post(target.url, "application/json", bytes.NewReader(body))
			if err != nil {
				fail(err.Error())
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				fail("HTTP " + resp.Status)
				return
			}
			lat := time.Since(planned)
			mu.Lock()
			latencies = append(latencies, lat)
			mu.Unlock()
		}(next, target.bodies[i%len(target.bodies)])
	}
	wg.Wait()
	slices.Sort(latencies)
	res.ok, res.failures = len(latencies), int(failures.Load())
	if p := firstErr.Load(); p != nil {
		res.firstErr = "first error: " + *p
	}
	if len(latencies) > 0 {
		res.p50, res.p99, res.p999 = percentile(latencies, 0.50), percentile(latencies, 0.99), percentile(latencies, 0.999)
		res.max = latencies[len(latencies)-1]
	}
	return res
}

// recordingDecider remembers the last input it was asked about.
type recordingDecider struct {
	policy.Decider
	last policy.Input
}

func (r *recordingDecider) Decide(ctx context.Context, in policy.Input) (policy.Decision, error) {
	if in.Pod.Name != "bulkhead-tenant-probe" {
		r.last = in
	}
	return r.Decider.Decide(ctx, in)
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s stderr:\n%s", filepath.Base(bin), stderr.String())
		}
	})
}

func waitHTTP(t *testing.T, client *http.Client, url string) {
	t.Helper()
	waitFor(t, url, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func postJSON(t *testing.T, client *http.Client, url string, body []byte, out any) {
	t.Helper()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v: %s", url, err, b)
	}
}
