package node

import (
	"context"
	"errors"
	"path/filepath"
	"time"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
)

// Node is what one node holds for all its pods: the ledger of what each
// pod holds, the records of its sandboxes, its GPUs and their backend, and
// the fence. One process opens it (the node agent; `bulkhead node gc` on
// demand) and places, releases and repairs every pod through it.
type Node struct {
	cfg   config.Config
	state *StateDir
	// ledger is the node's reservations; never nil.
	ledger *Ledger
	// gpus are the node's GPUs as the backend sees them; nil without GPUs.
	gpus []mig.GPU
	// backend makes and destroys the GPUs' MIG instances; nil without GPUs.
	backend mig.Backend
	// fence is the eBPF fence; nil when netpol.enabled is false.
	fence *netpol.Manager
}

// Parts are what a Node holds besides its configuration and records, as
// Open would open them; tests pass their own to New.
type Parts struct {
	// Ledger is the node's ledger; required.
	Ledger *Ledger
	// GPUs are the node's GPUs as Backend lists them; nil without GPUs.
	GPUs []mig.GPU
	// Backend is the GPUs' MIG backend; nil without GPUs.
	Backend mig.Backend
	// Fence is the eBPF fence; nil when netpol.enabled is false.
	Fence *netpol.Manager
}

// New assembles the node of cfg from parts already open; its records are
// in cfg.StateDir.
func New(cfg config.Config, parts Parts) *Node {
	return &Node{cfg: cfg, state: NewStateDir(cfg), ledger: parts.Ledger, gpus: parts.GPUs, backend: parts.Backend, fence: parts.Fence}
}

// Open opens what cfg names for the node: the ledger, the MIG backend and
// the fence. The fence opens while the other two do: none needs another.
// Each open's time goes to the start trace in ctx, if any.
func Open(ctx context.Context, cfg config.Config) (*Node, error) {
	type opened struct {
		fence *netpol.Manager
		err   error
	}
	fenceOpened := make(chan opened, 1)
	go func() {
		t := time.Now()
		fence, err := openFence(ctx, cfg)
		if fence != nil {
			starttrace.Since(ctx, "open.fence", t)
		}
		fenceOpened <- opened{fence, err}
	}()
	var parts Parts
	err := openLedgerAndMIG(ctx, cfg, &parts)
	f := <-fenceOpened
	if err == nil {
		err = f.err
	}
	if err != nil {
		if f.fence != nil {
			f.fence.Close()
		}
		return nil, err
	}
	parts.Fence = f.fence
	return New(cfg, parts), nil
}

// openLedgerAndMIG opens the ledger and the MIG backend into parts.
func openLedgerAndMIG(ctx context.Context, cfg config.Config, parts *Parts) error {
	var err error
	t := time.Now()
	if parts.Ledger, err = OpenLedger(cfg.LedgerPath); err != nil {
		return err
	}
	t = starttrace.Since(ctx, "open.ledger", t)
	// The backend's view of the GPUs keeps those not in MIG mode out of
	// slicing; MIG mode is read, never toggled.
	if parts.Backend, parts.GPUs, err = mig.OpenBackend(cfg.MIG.Backend, backendOptions(cfg, false)); err != nil {
		return err
	}
	starttrace.Since(ctx, "open.mig", t)
	return nil
}

// openFence opens the fence cfg names; nil when netpol.enabled is false.
func openFence(ctx context.Context, cfg config.Config) (*netpol.Manager, error) {
	if !cfg.Netpol.Enabled {
		return nil, nil
	}
	// netpol's errors name it already.
	if err := netpol.MountBPFFS(filepath.Dir(cfg.Netpol.PinDir)); err != nil {
		return nil, err
	}
	nopts := netpol.Options{PinDir: cfg.Netpol.PinDir, LockPath: cfg.Netpol.LockPath}
	if len(cfg.Netpol.ClusterCIDRs) > 0 || len(cfg.Netpol.SharedServices) > 0 {
		cluster, shared, err := cfg.Netpol.ClusterPrefixes()
		if err != nil {
			return nil, err
		}
		nopts.Cluster = &netpol.ClusterConfig{ClusterCIDRs: cluster, SharedServices: shared}
	}
	return netpol.Open(ctx, nopts)
}

// Close closes the fence's handles; its pinned maps and programs stay, and
// keep enforcing for running pods. The ledger holds no handle between
// transactions.
func (n *Node) Close() error {
	var errs []error
	if n.fence != nil {
		errs = append(errs, n.fence.Close())
	}
	return errors.Join(errs...)
}

// Config is the node's configuration.
func (n *Node) Config() config.Config { return n.cfg }

// State is the node's sandbox records.
func (n *Node) State() *StateDir { return n.state }

// Ledger is the node's ledger.
func (n *Node) Ledger() *Ledger { return n.ledger }

// GPUs are the node's GPUs as the backend sees them; nil without GPUs.
func (n *Node) GPUs() []mig.GPU { return n.gpus }

// Backend is the node's GPU backend; nil without GPUs.
func (n *Node) Backend() mig.Backend { return n.backend }

// Fence is the node's fence; nil when netpol.enabled is false.
func (n *Node) Fence() *netpol.Manager { return n.fence }
