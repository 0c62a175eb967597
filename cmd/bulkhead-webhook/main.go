// Command bulkhead-webhook is Bulkhead's validating admission webhook: it
// answers admission.k8s.io/v1 AdmissionReviews for pods and pod templates
// with the same policy bundle the nodes enforce. The logic lives in
// policy/admission; deploy/webhook runs it.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/bulkhead-runtime/bulkhead/internal/version"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the binary: 0 after --help or --version (on stdout) or a clean
// stop, 1 when serving fails, 2 for bad flags.
func run(args []string, stdout, stderr io.Writer) int {
	// The flag package writes its usage to one writer: collect it, and send
	// it to stdout when asked for (--help), to stderr after a bad flag.
	var flagOut bytes.Buffer
	cfg, err := admission.ParseFlags(args, &flagOut)
	if errors.Is(err, flag.ErrHelp) {
		stdout.Write(flagOut.Bytes())
		return 0
	}
	stderr.Write(flagOut.Bytes())
	logger := slog.New(slog.NewJSONHandler(stderr, nil))
	if err != nil {
		logger.Error("bulkhead-webhook: bad flags", "err", err)
		return 2
	}
	if cfg.Version {
		fmt.Fprintln(stdout, "bulkhead-webhook", version.String())
		return 0
	}
	gc, err := admission.ConfigureGC(cfg.GCPercent, cfg.MemoryLimit)
	if err != nil {
		logger.Error("bulkhead-webhook: garbage collector settings", "err", err)
		return 2
	}
	logger.Info("garbage collector", "gc_percent", gc.GCPercent, "memory_limit_bytes", gc.MemoryLimit, "source", gc.Source)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger.Info("bulkhead-webhook starting", "version", version.String())
	if err := admission.Run(ctx, cfg, logger); err != nil {
		logger.Error("bulkhead-webhook", "err", err)
		return 1
	}
	return 0
}
