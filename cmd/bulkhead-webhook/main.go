// Command bulkhead-webhook is Bulkhead's validating admission webhook: it
// answers admission.k8s.io/v1 AdmissionReviews for pods and pod templates
// with the same policy bundle the nodes enforce. The logic lives in
// policy/admission; deploy/webhook runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

func main() {
	cfg, err := admission.ParseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err != nil {
		logger.Error("bulkhead-webhook: bad flags", "err", err)
		os.Exit(2)
	}
	gc, err := admission.ConfigureGC(cfg.GCPercent, cfg.MemoryLimit)
	if err != nil {
		logger.Error("bulkhead-webhook: garbage collector settings", "err", err)
		os.Exit(2)
	}
	logger.Info("garbage collector", "gc_percent", gc.GCPercent, "memory_limit_bytes", gc.MemoryLimit, "source", gc.Source)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := admission.Run(ctx, cfg, logger); err != nil {
		logger.Error("bulkhead-webhook", "err", err)
		os.Exit(1)
	}
}
