package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// testCA issues serving certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "bulkhead-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// pem is the CA's certificate, PEM-encoded.
func (ca *testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// issue writes a serving certificate with the given serial, valid for a
// day, to dir as tls.crt and tls.key, replacing old files by rename as a
// Secret volume does.
func (ca *testCA) issue(t testing.TB, dir string, serial int64) {
	t.Helper()
	ca.issueUntil(t, dir, serial, time.Now().Add(24*time.Hour))
}

// issueUntil is issue with the certificate's notAfter.
func (ca *testCA) issueUntil(t testing.TB, dir string, serial int64, notAfter time.Time) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "bulkhead-webhook.bulkhead-system.svc"},
		DNSNames:     []string{"bulkhead-webhook.bulkhead-system.svc"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, block *pem.Block) {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.key", &pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	write("tls.crt", &pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// tlsServer runs Serve with h on a loopback port and returns its base URL.
func tlsServer(t testing.TB, h http.Handler, certs *CertReloader) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ServeOptions{Listener: ln, Certs: certs, Handler: h}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}

func newClient(ca *testCA, keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12},
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: 128,
	}}
}

// startWebhook serves a Handler around decider over TLS.
func startWebhook(t testing.TB, decider policy.Decider, maxBody int64) (string, *testCA, string, *Metrics) {
	t.Helper()
	ca := newTestCA(t)
	dir := t.TempDir()
	ca.issue(t, dir, 100)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	rev, err := NewReviewer(Options{Decider: decider, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m, MaxBodyBytes: maxBody})
	if err != nil {
		t.Fatal(err)
	}
	return tlsServer(t, h, certs), ca, dir, m
}

// TestServerAdmissionReviews posts real AdmissionReview JSON over TLS to a
// webhook backed by the real engine on the default bundle.
func TestServerAdmissionReviews(t *testing.T) {
	srv, ca, _, _ := startWebhook(t, openEngine(t), 0)
	client := newClient(ca, true)
	tests := []struct {
		file    string
		allowed bool
		code    int32
		rule    string
	}{
		{file: "pod-allowed.json", allowed: true},
		{file: "pod-runc.json", code: 403, rule: "[runtime.runc_forbidden]"},
		{file: "pod-no-runtimeclass.json", code: 403, rule: "[runtime.handler_required]"},
		{file: "deployment-violates.json", code: 403, rule: "[workload.privileged]"},
		{file: "configmap-unknown-kind.json", code: 400, rule: "unsupported kind"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body, in := readReview(t, tt.file)
			resp, err := client.Post(srv+PathValidate, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("HTTP %d", resp.StatusCode)
			}
			var out admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
				t.Errorf("answer is %s/%s", out.APIVersion, out.Kind)
			}
			if out.Response == nil || out.Response.UID != in.Request.UID {
				t.Fatalf("response %+v does not echo uid %q", out.Response, in.Request.UID)
			}
			if out.Response.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v: %+v", out.Response.Allowed, tt.allowed, out.Response.Result)
			}
			if !tt.allowed && (out.Response.Result.Code != tt.code || !strings.Contains(out.Response.Result.Message, tt.rule)) {
				t.Errorf("result = %d %q, want %d naming %q", out.Response.Result.Code, out.Response.Result.Message, tt.code, tt.rule)
			}
		})
	}
}

// TestServerBadInput: transport errors are answered with a status and a
// message that names the problem; the server keeps serving.
func TestServerBadInput(t *testing.T) {
	const limit = 64 << 10
	srv, ca, _, _ := startWebhook(t, staticDecider{decision: policy.Decision{Allow: true}}, limit)
	client := newClient(ca, true)
	valid, _ := readReview(t, "pod-allowed.json")
	huge := append([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","object":{"pad":"`),
		bytes.Repeat([]byte("a"), limit)...)
	huge = append(huge, []byte(`"}}}`)...)
	tests := []struct {
		name        string
		method      string
		contentType string
		body        []byte
		chunked     bool
		code        int
		want        string
	}{
		{name: "malformed json", contentType: "application/json", body: []byte(`{"apiVersion": "admission.k8s.io/v1", "kind": `), code: 400, want: "not an AdmissionReview"},
		{name: "empty body", contentType: "application/json", body: nil, code: 400, want: "body: empty"},
		{name: "not an object", contentType: "application/json", body: []byte(`[1,2,3]`), code: 400, want: "not an AdmissionReview"},
		{name: "wrong content type", contentType: "text/plain", body: valid, code: 415, want: `Content-Type "text/plain": must be application/json`},
		{name: "yaml content type", contentType: "application/yaml", body: valid, code: 415, want: "must be application/json"},
		{name: "oversized body", contentType: "application/json", body: huge, code: 413, want: "exceeds the limit of 65536 bytes"},
		{name: "oversized chunked body", contentType: "application/json", body: huge, chunked: true, code: 413, want: "exceeds the limit"},
		{name: "v1beta1 review", contentType: "application/json", body: bytes.Replace(valid, []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1), code: 400, want: `must be "admission.k8s.io/v1"`},
		{name: "no request", contentType: "application/json", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), code: 400, want: "request: missing"},
		{name: "no uid", contentType: "application/json", body: bytes.Replace(valid, []byte(`"uid": "705ab4f5-6393-11e8-b7cc-42010a800002"`), []byte(`"uid": ""`), 1), code: 400, want: "request.uid: empty"},
		{name: "GET", method: http.MethodGet, code: 405, want: "only POST"},
		{name: "valid after all that", contentType: "application/json; charset=utf-8", body: valid, code: 200, want: `"allowed":true`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := tt.method
			if method == "" {
				method = http.MethodPost
			}
			var body io.Reader = bytes.NewReader(tt.body)
			if tt.chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			req, err := http.NewRequest(method, srv+PathValidate, body)
			if err != nil {
				t.Fatal(err)
			}
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code || !strings.Contains(string(got), tt.want) {
				t.Errorf("HTTP %d %q, want %d containing %q", resp.StatusCode, got, tt.code, tt.want)
			}
		})
	}
	metrics := scrape(t, client, srv)
	for _, want := range []string{
		`bulkhead_webhook_bad_requests_total{reason="malformed"} 6`,
		`bulkhead_webhook_bad_requests_total{reason="content_type"} 2`,
		`bulkhead_webhook_bad_requests_total{reason="too_large"} 2`,
		`bulkhead_webhook_decisions_total{kind="Pod",result="allowed"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func scrape(t testing.TB, client *http.Client, base string) string {
	t.Helper()
	resp, err := client.Get(base + PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestServerCertificateRotation replaces the certificate files while the
// server is serving; new connections get the new certificate without a
// restart, and a broken pair keeps the previous one in service.
func TestServerCertificateRotation(t *testing.T) {
	srv, ca, dir, _ := startWebhook(t, staticDecider{decision: policy.Decision{Allow: true}}, 0)
	valid, _ := readReview(t, "pod-allowed.json")
	// A long-lived connection opened before the rotation keeps working.
	kept := newClient(ca, true)
	serial := func(client *http.Client) int64 {
		t.Helper()
		resp, err := client.Post(srv+PathValidate, "application/json", bytes.NewReader(valid))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(kept); got != 100 {
		t.Fatalf("serial before rotation = %d, want 100", got)
	}
	steps := []struct {
		name   string
		rotate func()
		want   int64
	}{
		{name: "rotated", rotate: func() { ca.issue(t, dir, 101) }, want: 101},
		{name: "rotated again", rotate: func() { ca.issue(t, dir, 102) }, want: 102},
		{name: "broken key keeps the previous pair", rotate: func() {
			if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: 102},
		{name: "repaired", rotate: func() { ca.issue(t, dir, 103) }, want: 103},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.rotate()
			if got := serial(newClient(ca, false)); got != st.want {
				t.Errorf("new connection got serial %d, want %d", got, st.want)
			}
			if got := serial(kept); got != 100 {
				t.Errorf("kept-alive connection now has serial %d; it should keep its session", got)
			}
		})
	}
}

// TestHealthAndReadiness covers /healthz, /readyz and /metrics.
func TestHealthAndReadiness(t *testing.T) {
	ready := false
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m, Ready: func() error {
		if !ready {
			return ErrNotSynced
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	m.observeRevision("rev-1")
	m.observeRevision("rev-2")
	tests := []struct {
		name  string
		path  string
		ready bool
		code  int
		want  string
	}{
		{name: "healthz", path: PathHealthz, code: 200, want: "ok"},
		{name: "readyz before sync", path: PathReadyz, code: 503, want: "not ready: pod informer has not synced"},
		{name: "readyz after sync", path: PathReadyz, ready: true, code: 200, want: "ok"},
		{name: "metrics has the latest revision only", path: PathMetrics, code: 200, want: `bulkhead_webhook_bundle_revision_info{revision="rev-2"} 1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready = tt.ready
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.want) {
				t.Errorf("%s: %d %q, want %d containing %q", tt.path, rec.Code, rec.Body.String(), tt.code, tt.want)
			}
			if strings.Contains(rec.Body.String(), `revision="rev-1"`) {
				t.Errorf("stale revision still exported")
			}
		})
	}
}

func TestHandlerOptionsValidated(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: staticDecider{}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts HandlerOptions
		want string
	}{
		{name: "no reviewer", opts: HandlerOptions{}, want: "HandlerOptions.Reviewer"},
		{name: "negative body limit", opts: HandlerOptions{Reviewer: rev, MaxBodyBytes: -1}, want: "HandlerOptions.MaxBodyBytes -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Handler(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one naming %q", err, tt.want)
			}
		})
	}
	if _, err := NewCertReloader("", "", nil); err == nil {
		t.Error("NewCertReloader accepted empty paths")
	}
	if _, err := NewCertReloader("/nonexistent/tls.crt", "/nonexistent/tls.key", nil); err == nil || !strings.Contains(err.Error(), "tls certificate") {
		t.Errorf("NewCertReloader on missing files: %v", err)
	}
}

// TestReviewsWaitForACPU: while every review slot is busy a request waits;
// one whose client gives up while waiting is answered 503 and never
// reviewed, and a slot that frees up serves the next request.
func TestReviewsWaitForACPU(t *testing.T) {
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
	for range cap(v.slots) {
		v.slots <- struct{}{}
	}
	body, _ := readReview(t, "pod-allowed.json")
	post := func(ctx context.Context) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, PathValidate, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if w := post(ctx); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "cancelled while waiting") {
		t.Fatalf("busy and cancelled: got %d %q", w.Code, w.Body.String())
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(context.Background()) }()
	select {
	case w := <-done:
		t.Fatalf("reviewed while every slot was busy: %d", w.Code)
	case <-time.After(20 * time.Millisecond):
	}
	<-v.slots // one review finishes
	if w := <-done; w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"allowed":true`) {
		t.Fatalf("after a slot freed: got %d %q", w.Code, w.Body.String())
	}
}

// findValidator digs the validator out of Handler's mux.
func findValidator(h http.Handler, v **validator) error {
	mux, ok := h.(*http.ServeMux)
	if !ok {
		return fmt.Errorf("Handler returned %T, not a ServeMux", h)
	}
	r := httptest.NewRequest(http.MethodPost, PathValidate, nil)
	got, _ := mux.Handler(r)
	if *v, ok = got.(*validator); !ok {
		return fmt.Errorf("%s is served by %T", PathValidate, got)
	}
	return nil
}
