package agent

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/containerd/log"

	"github.com/bulkhead-runtime/bulkhead/internal/version"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// Main runs bulkhead-agent with args (without the program name) and
// returns its exit status: 0 after SIGTERM or SIGINT, 1 when the node
// cannot be served, 2 for bad usage.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bulkhead-agent", flag.ContinueOnError)
	// The flag package prints nothing itself: help goes to stdout, a usage
	// error and the usage to stderr.
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", config.Path(), "the node's configuration file (default $"+config.PathEnv+" or "+config.DefaultPath+")")
	showVersion := fs.Bool("version", false, "print the version and exit")
	logFormat := fs.String("log-format", "text", "log format: text, or json (one object per line, every call's sandbox, container, shim pid and op as fields)")
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "usage: bulkhead-agent [--config PATH] [--log-format text|json]\n\nServes the node's Bulkhead shims on the socket of the file's [agent] section.\n\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			usage(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "bulkhead-agent: %v\n", err)
		usage(stderr)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bulkhead-agent: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := log.SetFormat(log.OutputFormat(*logFormat)); err != nil {
		fmt.Fprintf(stderr, "bulkhead-agent: --log-format %q: not text or json\n", *logFormat)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "bulkhead-agent", version.String())
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "bulkhead-agent: must run as root (the ledger, the fence's eBPF maps, the shims' socket)")
		return 1
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead-agent:", err)
		return 1
	}
	if cfg.Debug {
		log.SetLevel("debug")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	a, err := Open(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead-agent:", err)
		return 1
	}
	defer a.Close()
	l, err := Listen(cfg.Agent.Socket)
	if err != nil {
		fmt.Fprintln(stderr, "bulkhead-agent:", err)
		return 1
	}
	log.G(ctx).Infof("bulkhead-agent %s: serving %s", version.String(), cfg.Agent.Socket)
	if err := a.Serve(ctx, l); err != nil {
		fmt.Fprintln(stderr, "bulkhead-agent:", err)
		return 1
	}
	log.G(ctx).Info("bulkhead-agent: stopped; running pods keep their fence and reservations")
	return 0
}
