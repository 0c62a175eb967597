package admission

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// liveness bounds how long a test waits for something that should happen
// at once; it only keeps a broken test from hanging.
const liveness = 20 * time.Second

// serveWith runs Serve with h and opts on a loopback port and returns the
// address and the CA that signed the serving certificate.
func serveWith(t *testing.T, h http.Handler, opts ServeOptions) (string, *testCA) {
	t.Helper()
	ca := newTestCA(t)
	dir := t.TempDir()
	ca.issue(t, dir, 100)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts.Listener, opts.Certs, opts.Handler = ln, certs, h
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, opts) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), ca
}

// slowRequest is a POST /validate whose body is sent in two parts, as far
// as the caller wants.
type slowRequest struct {
	conn *tls.Conn
	rest []byte
}

// startSlow sends the headers and the first half of body.
func startSlow(t *testing.T, addr string, ca *testCA, body []byte) *slowRequest {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	half := len(body) / 2
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", PathValidate, addr, len(body))
	if _, err := conn.Write(append([]byte(head), body[:half]...)); err != nil {
		t.Fatal(err)
	}
	return &slowRequest{conn: conn, rest: body[half:]}
}

// finish sends the rest of the body and reads the response.
func (s *slowRequest) finish(t *testing.T) (*http.Response, string) {
	t.Helper()
	if _, err := s.conn.Write(s.rest); err != nil {
		t.Fatalf("sending the rest of a slow body: %v", err)
	}
	return readResponse(t, s.conn)
}

func readResponse(t *testing.T, conn net.Conn) (*http.Response, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(liveness))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestSlowBodiesDoNotStarveReviews: two clients that send their bodies
// slowly hold no review slot, so with only two slots a normal review is
// answered while both are still sending; both are then answered too.
func TestSlowBodiesDoNotStarveReviews(t *testing.T) {
	m := NewMetrics()
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	var v *validator
	if err := findValidator(h, &v); err != nil {
		t.Fatal(err)
	}
	v.slots = make(chan struct{}, 2) // as on a 2-CPU node
	entered := make(chan struct{}, 16)
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == PathValidate {
			entered <- struct{}{}
		}
		h.ServeHTTP(w, r)
	})
	// A long read deadline: this test is about slots, not deadlines.
	addr, ca := serveWith(t, counted, ServeOptions{ReadTimeout: time.Minute})
	body, _ := readReview(t, "pod-allowed.json")

	slow := []*slowRequest{startSlow(t, addr, ca, body), startSlow(t, addr, ca, body)}
	for range slow {
		select {
		case <-entered:
		case <-time.After(liveness):
			t.Fatal("the slow requests never reached the handler")
		}
	}

	client := newClient(ca, false)
	client.Timeout = liveness
	resp, err := client.Post("https://"+addr+PathValidate, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("a normal review while two bodies arrive slowly: %v (starved of review slots)", err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), `"allowed":true`) {
		t.Fatalf("normal review: %d %q", resp.StatusCode, got)
	}
	if n := len(v.slots); n != 0 {
		t.Errorf("%d review slots held by requests whose bodies have not arrived", n)
	}
	for i, s := range slow {
		resp, got := s.finish(t)
		if resp.StatusCode != http.StatusOK || !strings.Contains(got, `"allowed":true`) {
			t.Errorf("slow request %d, once complete: %d %q", i, resp.StatusCode, got)
		}
	}
}

// TestSlowBodyIsCutOff: a body that has not arrived by the read deadline
// is refused and counted, and never reviewed.
func TestSlowBodyIsCutOff(t *testing.T) {
	m := NewMetrics()
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	addr, ca := serveWith(t, h, ServeOptions{ReadTimeout: 200 * time.Millisecond})
	body, _ := readReview(t, "pod-allowed.json")
	s := startSlow(t, addr, ca, body)
	// Send nothing more: the server must give up on its own.
	resp, got := readResponse(t, s.conn)
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(got, "reading body") {
		t.Errorf("stalled body: %d %q, want 408", resp.StatusCode, got)
	}
	client := newClient(ca, false)
	client.Timeout = liveness
	metrics := scrape(t, client, "https://"+addr)
	for _, want := range []string{`bulkhead_webhook_bad_requests_total{reason="read_timeout"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(metrics, "bulkhead_webhook_decisions_total{") {
		t.Error("a request whose body never arrived was reviewed")
	}
}

// TestServerProtocols: the listener speaks HTTP/1.1 only unless HTTP/2 is
// asked for.
func TestServerProtocols(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		http2 bool
		want  string
	}{
		{name: "default", want: "HTTP/1.1"},
		{name: "http2 configured", http2: true, want: "HTTP/2.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, ca := serveWith(t, h, ServeOptions{HTTP2: tt.http2})
			client := &http.Client{Timeout: liveness, Transport: &http.Transport{
				TLSClientConfig:   &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12},
				ForceAttemptHTTP2: true,
			}}
			resp, err := client.Get("https://" + addr + PathHealthz)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.Proto != tt.want {
				t.Errorf("protocol %s, want %s", resp.Proto, tt.want)
			}
		})
	}
}

// clientCert issues a client certificate with common name cn.
func (ca *testCA) clientCert(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestClientAuthentication: with a client CA only clients holding a
// certificate it signed (and, with names, one of those names) are served.
func TestClientAuthentication(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev})
	if err != nil {
		t.Fatal(err)
	}
	apiserverCA, otherCA := newTestCA(t), newTestCA(t)
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	writeFile(t, caFile, apiserverCA.pem())
	anyName, err := LoadClientAuth(caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	named, err := LoadClientAuth(caFile, []string{"kube-apiserver-webhook-client"})
	if err != nil {
		t.Fatal(err)
	}
	apiserver := apiserverCA.clientCert(t, "kube-apiserver-webhook-client")
	kubelet := apiserverCA.clientCert(t, "system:node:worker-1")
	forged := otherCA.clientCert(t, "kube-apiserver-webhook-client")
	body, _ := readReview(t, "pod-allowed.json")
	tests := []struct {
		name   string
		auth   *ClientAuth
		cert   *tls.Certificate
		served bool
	}{
		{name: "no client CA: anyone", auth: nil, served: true},
		{name: "client CA: no certificate", auth: anyName},
		{name: "client CA: certificate of another CA", auth: anyName, cert: &forged},
		{name: "client CA: the API server's certificate", auth: anyName, cert: &apiserver, served: true},
		{name: "client CA and name: another client of the same CA", auth: named, cert: &kubelet},
		{name: "client CA and name: the API server", auth: named, cert: &apiserver, served: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, ca := serveWith(t, h, ServeOptions{ClientAuth: tt.auth})
			cfg := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
			if tt.cert != nil {
				cfg.Certificates = []tls.Certificate{*tt.cert}
			}
			client := &http.Client{Timeout: liveness, Transport: &http.Transport{TLSClientConfig: cfg}}
			resp, err := client.Post("https://"+addr+PathValidate, "application/json", bytes.NewReader(body))
			if err == nil {
				resp.Body.Close()
			}
			if served := err == nil && resp.StatusCode == http.StatusOK; served != tt.served {
				t.Errorf("served = %v (err %v), want %v", served, err, tt.served)
			}
		})
	}
	if _, err := LoadClientAuth(filepath.Join(t.TempDir(), "missing.crt"), nil); err == nil {
		t.Error("LoadClientAuth accepted a missing file")
	}
	empty := filepath.Join(t.TempDir(), "empty.crt")
	writeFile(t, empty, []byte("not PEM"))
	if _, err := LoadClientAuth(empty, nil); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("LoadClientAuth on a file without certificates: %v", err)
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestParseFlagsHardening covers the listener's flags.
func TestParseFlagsHardening(t *testing.T) {
	base := []string{"--tls-cert=c", "--tls-key=k", "--bundle=b", "--insecure-skip-verification"}
	tests := []struct {
		name  string
		args  []string
		check func(Config) bool
		err   string
	}{
		{name: "defaults", check: func(c Config) bool {
			return c.ClientCA == "" && !c.HTTP2 && c.ReadTimeout == DefaultReadTimeout && c.ReadHeaderTimeout == DefaultReadHeaderTimeout
		}},
		{name: "client CA and names", args: []string{"--client-ca=/ca.crt", "--client-name=a", "--client-name=b"}, check: func(c Config) bool {
			return c.ClientCA == "/ca.crt" && strings.Join(c.ClientNames, ",") == "a,b"
		}},
		{name: "http2 and deadlines", args: []string{"--http2", "--read-timeout=9s", "--read-header-timeout=1s"}, check: func(c Config) bool {
			return c.HTTP2 && c.ReadTimeout == 9*time.Second && c.ReadHeaderTimeout == time.Second
		}},
		{name: "name without CA", args: []string{"--client-name=a"}, err: "--client-name needs --client-ca"},
		{name: "zero read timeout", args: []string{"--read-timeout=0s"}, err: "--read-timeout 0s: must be positive"},
		{name: "zero header timeout", args: []string{"--read-header-timeout=0s"}, err: "--read-header-timeout 0s: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseFlags(append(append([]string{}, base...), tt.args...), io.Discard)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(c) {
				t.Errorf("config %+v", c)
			}
		})
	}
}

// TestBufferedBodiesAreBounded: bodies are read before a review slot is
// taken, so the bytes of all bodies held at once are bounded; a request
// past the bound is refused at once (503, counted as buffer_full) instead
// of growing the webhook towards its memory limit, and every byte a
// request held is given back.
func TestBufferedBodiesAreBounded(t *testing.T) {
	m := NewMetrics()
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m, MaxBodyBytes: 256 << 10, MaxBufferedBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	var v *validator
	if err := findValidator(h, &v); err != nil {
		t.Fatal(err)
	}
	addr, ca := serveWith(t, h, ServeOptions{})
	body, _ := readReview(t, "pod-allowed.json")
	client := newClient(ca, false)
	client.Timeout = liveness
	post := func() (int, string) {
		t.Helper()
		resp, err := client.Post("https://"+addr+PathValidate, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(got)
	}
	if code, got := post(); code != http.StatusOK {
		t.Fatalf("review with the buffer free: %d %s", code, got)
	}
	if n := waitBuffered(v, 0); n != 0 {
		t.Errorf("%d bytes still counted after the review finished", n)
	}
	// Other requests hold all but a few bytes of the bound.
	v.buffered.Store(limit - int64(len(body))/2)
	if code, got := post(); code != http.StatusServiceUnavailable || !strings.Contains(got, "max-buffered-bytes") {
		t.Errorf("review past the bound: %d %s, want 503 naming --max-buffered-bytes", code, got)
	}
	if n := waitBuffered(v, limit-int64(len(body))/2); n != limit-int64(len(body))/2 {
		t.Errorf("a refused request kept %d bytes counted", n-(limit-int64(len(body))/2))
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "buffer_full" {
					counted += metric.GetCounter().GetValue()
				}
			}
		}
	}
	if counted != 1 {
		t.Errorf("bad requests with reason buffer_full = %v, want 1", counted)
	}
	// The bound is refused below one body's size.
	if _, err := Handler(HandlerOptions{Reviewer: rev, MaxBodyBytes: 2 << 20, MaxBufferedBytes: 1 << 20}); err == nil {
		t.Error("MaxBufferedBytes below MaxBodyBytes accepted")
	}
}
