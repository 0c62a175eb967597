package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	admissionv1 "k8s.io/api/admission/v1"
)

// Paths served by Handler.
const (
	PathValidate = "/validate"
	PathHealthz  = "/healthz"
	PathReadyz   = "/readyz"
	PathMetrics  = "/metrics"
)

// DefaultMaxBodyBytes bounds an AdmissionReview body. The API server sends
// objects of at most ~1.5 MiB (etcd's limit), twice on UPDATE, plus the
// request around them.
const DefaultMaxBodyBytes = 4 << 20

// DefaultMaxBufferedBytes bounds the request bodies held in memory at once,
// read or being read: 16 bodies of the largest size. Bodies are read before
// a review slot is taken, so without this bound many connections sending
// large bodies would hold them all at once and could push the webhook past
// its memory limit (and, failurePolicy being Fail, stop pod creation).
const DefaultMaxBufferedBytes = 16 * DefaultMaxBodyBytes

// bodyChunk is how much of a body is read before it is counted against
// the buffered bytes: what one connection may hold uncounted.
const bodyChunk = 16 << 10

// HandlerOptions configure Handler.
type HandlerOptions struct {
	// Reviewer answers the reviews; required.
	Reviewer *Reviewer
	// MaxBodyBytes bounds a request body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxBufferedBytes bounds the bytes of all request bodies held at once;
	// a request that would pass it is refused with 503 at once rather than
	// wait (a small review needs little of it, so slow or large senders
	// cannot starve it). 0 means DefaultMaxBufferedBytes.
	MaxBufferedBytes int64
	// Ready reports whether the webhook can answer (bundle loaded, caches
	// synced); /readyz fails with its error. Nil means always ready.
	Ready func() error
	// Metrics records latency and bad requests and is served on /metrics.
	// Nil serves no /metrics.
	Metrics *Metrics
	// Logger receives one line per refused request; nil discards.
	Logger *slog.Logger
}

// Handler returns the webhook's HTTP handler: POST /validate with an
// admission.k8s.io/v1 AdmissionReview, /healthz, /readyz and /metrics.
func Handler(opts HandlerOptions) (http.Handler, error) {
	if opts.Reviewer == nil {
		return nil, errors.New("admission: HandlerOptions.Reviewer is required")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("admission: HandlerOptions.MaxBodyBytes %d must not be negative", opts.MaxBodyBytes)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.MaxBufferedBytes < 0 {
		return nil, fmt.Errorf("admission: HandlerOptions.MaxBufferedBytes %d must not be negative", opts.MaxBufferedBytes)
	}
	if opts.MaxBufferedBytes == 0 {
		opts.MaxBufferedBytes = DefaultMaxBufferedBytes
	}
	if opts.MaxBufferedBytes < opts.MaxBodyBytes {
		return nil, fmt.Errorf("admission: HandlerOptions.MaxBufferedBytes %d is below MaxBodyBytes %d: the largest body could never be read", opts.MaxBufferedBytes, opts.MaxBodyBytes)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	v := &validator{opts: opts, slots: make(chan struct{}, runtime.GOMAXPROCS(0))}
	mux := http.NewServeMux()
	mux.Handle(PathValidate, v)
	mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc(PathReadyz, func(w http.ResponseWriter, _ *http.Request) {
		if opts.Ready != nil {
			if err := opts.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	if opts.Metrics != nil {
		mux.Handle(PathMetrics, promhttp.HandlerFor(opts.Metrics.Registry, promhttp.HandlerOpts{}))
	}
	return mux, nil
}

type validator struct {
	opts HandlerOptions
	// slots bounds the reviews being decoded, decided, encoded and sent at
	// once to the number of CPUs; a request takes one only once its whole
	// body has arrived. A review is CPU-bound: running more at once
	// only interleaves them and stretches every one, while waiting here
	// is first come, first served (a channel queues its senders in order).
	slots chan struct{}
	// buffered counts the bytes of request bodies held now, read or being
	// read, against opts.MaxBufferedBytes.
	buffered atomic.Int64
}

// errBufferFull refuses a body that would take the buffered bytes past
// their bound.
var errBufferFull = errors.New("request bodies held at once would exceed --max-buffered-bytes; retry")

// readBody reads body into buf a chunk at a time and counts the memory the
// buffer holds (its capacity, which grows only as bytes arrive) against the
// buffered bytes; held says how much this request holds, and the caller
// gives it back. A slow or idle sender holds no more than it delivered
// (and the buffer's growth beyond it).
func (v *validator) readBody(buf *bytes.Buffer, body io.Reader, held *int64) (int64, error) {
	var n int64
	for {
		m, err := buf.ReadFrom(io.LimitReader(body, bodyChunk))
		n += m
		if grown := int64(buf.Cap()) - *held; grown > 0 {
			if v.buffered.Add(grown) > v.opts.MaxBufferedBytes {
				v.buffered.Add(-grown)
				return n, errBufferFull
			}
			*held += grown
		}
		if err != nil || m < bodyChunk {
			return n, err // err nil and a short chunk: the body ended
		}
	}
}

// bufPool recycles request and response buffers across reviews.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// pooledBufferMax is the largest buffer put back in bufPool: a buffer that
// held a body near the cap is left to the collector, so the pool never
// keeps many megabytes alive between bursts.
const pooledBufferMax = 256 << 10

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= pooledBufferMax {
		bufPool.Put(b)
	}
}

func (v *validator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		v.fail(w, r, http.StatusMethodNotAllowed, "method", fmt.Sprintf("method %s: only POST is accepted", r.Method))
		return
	}
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		v.fail(w, r, http.StatusUnsupportedMediaType, "content_type",
			fmt.Sprintf("Content-Type %q: must be application/json", ct))
		return
	}
	if r.ContentLength > v.opts.MaxBodyBytes {
		v.fail(w, r, http.StatusRequestEntityTooLarge, "too_large",
			fmt.Sprintf("body of %d bytes: exceeds the limit of %d bytes", r.ContentLength, v.opts.MaxBodyBytes))
		return
	}
	// Read the whole (bounded) body before taking a review slot: a client
	// that sends slowly then holds a goroutine and a small buffer, never
	// one of the few slots every other review needs. The server's read
	// deadlines (ServeOptions) bound how long it may take.
	buf := bufPool.Get().(*bytes.Buffer)
	defer putBuffer(buf)
	buf.Reset()
	var held int64
	defer func() { v.buffered.Add(-held) }()
	n, err := v.readBody(buf, io.LimitReader(r.Body, v.opts.MaxBodyBytes+1), &held)
	if errors.Is(err, errBufferFull) {
		v.fail(w, r, http.StatusServiceUnavailable, "buffer_full", err.Error())
		return
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			v.fail(w, r, http.StatusRequestTimeout, "read_timeout", "reading body: "+err.Error())
			return
		}
		v.fail(w, r, http.StatusBadRequest, "malformed", "reading body: "+err.Error())
		return
	}
	if n > v.opts.MaxBodyBytes {
		v.fail(w, r, http.StatusRequestEntityTooLarge, "too_large",
			fmt.Sprintf("body: exceeds the limit of %d bytes", v.opts.MaxBodyBytes))
		return
	}
	select {
	case v.slots <- struct{}{}:
		defer func() { <-v.slots }()
	case <-r.Context().Done():
		v.fail(w, r, http.StatusServiceUnavailable, "cancelled", "request cancelled while waiting: "+r.Context().Err().Error())
		return
	}
	start := time.Now()
	review, err := decodeReview(buf.Bytes())
	if err != nil {
		v.fail(w, r, http.StatusBadRequest, "malformed", err.Error())
		return
	}
	resp := v.opts.Reviewer.Review(r.Context(), review.Request)
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	buf.Reset()
	if err := json.NewEncoder(buf).Encode(&out); err != nil {
		v.fail(w, r, http.StatusInternalServerError, "encode", "encoding response: "+err.Error())
		return
	}
	v.opts.Metrics.observeLatency(time.Since(start))
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
	// Encrypt and send while holding the slot: that is CPU work of this
	// review too, and doing it after would let later requests overtake.
	_ = http.NewResponseController(w).Flush()
}

// decodeReview reads an admission.k8s.io/v1 AdmissionReview with a request.
func decodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("body: empty; expected an admission.k8s.io/v1 AdmissionReview")
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, fmt.Errorf("body: not an AdmissionReview: %w", err)
	}
	if review.APIVersion != admissionv1.SchemeGroupVersion.String() || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("apiVersion/kind %q/%q: must be %q/\"AdmissionReview\"",
			review.APIVersion, review.Kind, admissionv1.SchemeGroupVersion.String())
	}
	if review.Request == nil {
		return nil, errors.New("request: missing from the AdmissionReview")
	}
	if review.Request.UID == "" {
		return nil, errors.New("request.uid: empty; the API server always sets it")
	}
	return &review, nil
}

// fail answers a request that never reached review with a plain-text error.
func (v *validator) fail(w http.ResponseWriter, r *http.Request, code int, reason, msg string) {
	v.opts.Metrics.observeBadRequest(reason)
	v.opts.Logger.Warn("admission request refused", "remote", r.RemoteAddr, "code", code, "reason", msg)
	http.Error(w, "bulkhead webhook: "+msg, code)
}

// Read deadlines of the webhook's listener. The API server sends a whole
// AdmissionReview at once and gives up after the webhook's timeoutSeconds
// (5 s in deploy/webhook), so a request still arriving after that is
// answered to nobody: cut it off instead of holding a connection for it.
const (
	// DefaultReadHeaderTimeout bounds the TLS handshake and the request
	// line and headers.
	DefaultReadHeaderTimeout = 3 * time.Second
	// DefaultReadTimeout bounds the whole request, headers and body.
	DefaultReadTimeout = 5 * time.Second
)

// ServeOptions configure Serve.
type ServeOptions struct {
	// Addr is the listen address, such as ":8443"; ignored with Listener.
	Addr string
	// Listener, when set, is used instead of listening on Addr.
	Listener net.Listener
	// Certs serves the TLS certificate; required.
	Certs *CertReloader
	// Handler is the webhook's handler (see Handler); required.
	Handler http.Handler
	// ClientAuth, when set, makes every connection present a client
	// certificate that it verifies (the API server's); nil accepts any
	// client, as the TLS layer alone does.
	ClientAuth *ClientAuth
	// ReadHeaderTimeout bounds the handshake and headers of a request;
	// 0 means DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the whole request, body included; 0 means
	// DefaultReadTimeout.
	ReadTimeout time.Duration
	// HTTP2 also offers HTTP/2. Off by default, as in controller-runtime:
	// the API server speaks HTTP/1.1 to webhooks, and HTTP/2 adds the
	// stream-level denial-of-service surface of net/http's h2 server
	// (rapid reset, CONTINUATION floods) for no gain.
	HTTP2 bool
	// Logger receives server errors; nil discards.
	Logger *slog.Logger
}

// Serve runs the HTTPS server until ctx ends, then shuts it down gracefully.
func Serve(ctx context.Context, opts ServeOptions) error {
	if opts.Certs == nil || opts.Handler == nil {
		return errors.New("admission: ServeOptions.Certs and Handler are required")
	}
	if opts.ReadHeaderTimeout < 0 || opts.ReadTimeout < 0 {
		return fmt.Errorf("admission: ServeOptions.ReadHeaderTimeout %v and ReadTimeout %v must not be negative", opts.ReadHeaderTimeout, opts.ReadTimeout)
	}
	if opts.ReadHeaderTimeout == 0 {
		opts.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = DefaultReadTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	tlsConfig := opts.Certs.TLSConfig()
	opts.ClientAuth.apply(tlsConfig)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetHTTP2(opts.HTTP2)
	srv := &http.Server{
		Addr:              opts.Addr,
		Handler:           opts.Handler,
		TLSConfig:         tlsConfig,
		Protocols:         &protocols,
		ReadHeaderTimeout: opts.ReadHeaderTimeout,
		ReadTimeout:       opts.ReadTimeout,
		WriteTimeout:      2 * opts.ReadTimeout,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	ln := opts.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", opts.Addr); err != nil {
			return fmt.Errorf("admission: %w", err)
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	select {
	case err := <-errc:
		return fmt.Errorf("admission: serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("admission: shutting down: %w", err)
	}
	return nil
}
