package telemetry

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestServe scrapes a real listener: /metrics has the node's series even
// when a source fails, /healthz follows Options.Health, and the server
// stops when its context ends.
func TestServe(t *testing.T) {
	var unhealthy atomic.Bool
	m := NewMetrics(Options{
		Fence: &fakeFence{err: errors.New("fence maps gone")},
		Node:  &fakeNode{use: map[string]policy.Usage{"acme": {Sandboxes: 1}}, mig: map[int]int{}},
		Health: func() error {
			if unhealthy.Load() {
				return errors.New("ledger closed")
			}
			return nil
		},
	})
	m.Decided(KindSandbox, policy.Decision{Reasons: []policy.Reason{deny("tenant.unknown")}}, nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- m.ServeListener(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}

	code, body := get("/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	for _, want := range []string{
		`bulkhead_node_decisions_total{kind="sandbox",result="deny",rule="tenant.unknown"} 1`,
		`bulkhead_node_quota_used{resource="sandboxes",tenant="acme"} 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "bulkhead_node_fence_drops_total{") {
		t.Error("/metrics has fence series from a fence that failed to read")
	}

	if code, body := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s, want 200", code, body)
	}
	unhealthy.Store(true)
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "ledger closed") {
		t.Errorf("/healthz when unhealthy: %d %q, want 503 naming the error", code, body)
	}

	cancel()
	if err := <-served; err != nil {
		t.Errorf("ServeListener after its context ended: %v, want nil", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the server still answers after its context ended")
	}
}

func TestServeBadAddress(t *testing.T) {
	m := NewMetrics(Options{})
	err := m.Serve(context.Background(), "127.0.0.1:notaport")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:notaport") {
		t.Errorf("Serve on a bad address: %v, want an error naming it", err)
	}
}
