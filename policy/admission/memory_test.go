package admission

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestMemoryAtTheBodyCap measures the webhook's peak memory under bodies at
// the cap (4 MiB, a multi-megabyte annotation each) from 64 concurrent
// clients, 4 rounds. It is a measurement, not a check of a figure: run it
// with the deployed collector settings and read the log:
//
//	BULKHEAD_MEASURE_RSS=1 GOGC=400 GOMEMLIMIT=483183820 go test -run TestMemoryAtTheBodyCap -v ./policy/admission/
//
// It requires only that every request is answered (200, or 503 when the
// buffered bodies are at their bound) and that the bound is given back.
func TestMemoryAtTheBodyCap(t *testing.T) {
	if os.Getenv("BULKHEAD_MEASURE_RSS") == "" {
		t.Skip("a measurement: set BULKHEAD_MEASURE_RSS=1 (see the doc comment for the deployed settings)")
	}
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev})
	if err != nil {
		t.Fatal(err)
	}
	var v *validator
	if err := findValidator(h, &v); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	_, review := readReview(t, "pod-allowed.json")
	var pod map[string]any
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil {
		t.Fatal(err)
	}
	pod["metadata"].(map[string]any)["annotations"] = map[string]string{"padding": strings.Repeat("x", DefaultMaxBodyBytes-64<<10)}
	raw, _ := json.Marshal(pod)
	review.Request.Object.Raw = raw
	body, _ := json.Marshal(review)
	if len(body) > DefaultMaxBodyBytes {
		t.Fatalf("body of %d bytes is past the cap", len(body))
	}
	before := vmHWM(t)
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				resp, err := http.Post(srv.URL+PathValidate, "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	after := vmHWM(t)
	t.Logf("64 clients x 4 bodies of %d bytes: answers %v; peak RSS (VmHWM) %d MiB before, %d MiB after (deployed limit 512 MiB)", len(body), codes, before>>10, after>>10)
	for code := range codes {
		if code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Errorf("answered %d", code)
		}
	}
	// A handler gives its bytes back as it returns, just after the
	// client has read its answer.
	if n := waitBuffered(v, 0); n != 0 {
		t.Errorf("%d buffered bytes still counted", n)
	}
}

// waitBuffered waits (within liveness) for v's buffered bytes to reach want
// and returns the last count.
func waitBuffered(v *validator, want int64) int64 {
	deadline := time.Now().Add(liveness)
	for {
		n := v.buffered.Load()
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}

// vmHWM is the process's peak resident set in KiB.
func vmHWM(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			for _, f := range strings.Fields(v) {
				for _, c := range f {
					if c < '0' || c > '9' {
						break
					}
					kb = kb*10 + int64(c-'0')
				}
				break
			}
			return kb
		}
	}
	return 0
}
