package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics (the registry, in any format Prometheus asks
// for) and /healthz (Options.Health). A source that fails to read drops
// its own series from the scrape, logged, and leaves the others served.
// Unlike the recording methods, it needs a *Metrics from NewMetrics.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		ErrorLog:          log.Default(),
		Registry:          m.Registry, // promhttp_metric_handler_errors_total
		EnableOpenMetrics: true,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if m.health != nil {
			if err := m.health(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Serve listens on addr and serves Handler until ctx ends; then it shuts
// the server down and returns nil. It returns the error that stopped it
// otherwise.
func (m *Metrics) Serve(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("telemetry: listen %s: %w", addr, err)
	}
	return m.ServeListener(ctx, ln)
}

// ServeListener is Serve on a listener the caller opened; it closes ln.
func (m *Metrics) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           m.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("telemetry: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("telemetry: shutdown %s: %w", ln.Addr(), err)
	}
	return nil
}
