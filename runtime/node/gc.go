package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/log"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// GCReport says what a GC pass released.
type GCReport struct {
	// Released are sandboxes whose reservations were released.
	Released []string `json:"released"`
	// Records are sandbox records removed from the state directory.
	Records []string `json:"records"`
	// Endpoints are fence entries removed.
	Endpoints []string `json:"endpoints"`
	// Instances are orphaned MIG instances destroyed ("gpu/gi").
	Instances []string `json:"instances"`
	// CDISpecs are the sandboxes whose orphaned CDI specs were removed.
	CDISpecs []string `json:"cdi_specs"`
}

// Empty reports whether the pass found nothing to repair.
func (r GCReport) Empty() bool {
	return len(r.Released)+len(r.Records)+len(r.Endpoints)+len(r.Instances)+len(r.CDISpecs) == 0
}

// SandboxAlive reports whether sandbox id still exists on the node: its
// shim process runs, or runsc (gVisor) or runc (the runc tier) still has
// state for it.
func SandboxAlive(cfg config.Config, id string, shimPID int) bool {
	if shimPID > 0 && shimRunning(shimPID) {
		return true
	}
	// runsc names state files <container>_sandbox:<sandbox>.state under
	// <root>/<namespace>; the pause container's is among them.
	matches, _ := filepath.Glob(filepath.Join(cfg.RunscRoot, "*", "*_sandbox:"+id+".state"))
	if len(matches) > 0 {
		return true
	}
	// A runc-tier container outlives its shim until containerd has runc
	// delete it: runc keeps <root>/<namespace>/<id>/state.json until then.
	matches, _ = filepath.Glob(filepath.Join(cfg.RuncRoot, "*", id, "state.json"))
	return len(matches) > 0
}

// recordGrace is how long a sandbox directory without a readable record is
// presumed to be in the middle of its creation.
const recordGrace = 2 * time.Minute

func young(state *StateDir, id string) bool {
	dir, err := state.Dir(id)
	if err != nil {
		return false
	}
	st, err := os.Stat(dir)
	return err == nil && time.Since(st.ModTime()) < recordGrace
}

func shimRunning(pid int) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	return strings.Contains(string(cmdline), "containerd-shim-bulkhead")
}

// GC releases everything held for sandboxes that no longer exist: ledger
// reservations (with their MIG instances and fence entries), sandbox
// records, fence entries and MIG instances no reservation owns. It is
// idempotent; the node agent runs it when it starts, every little while
// and soon after a shim died in the middle of a call.
func (n *Node) GC(ctx context.Context) (GCReport, error) {
	return n.GCExcept(ctx, nil)
}

// GCExcept is GC run by the records' only writer (the node agent), which
// says with creating which sandboxes it is creating right now: a record
// that does not read is garbage unless its sandbox is one of them. With
// creating nil (`bulkhead node gc` beside a running agent) a directory
// without a readable record is left alone for recordGrace, since a create
// may be writing it.
func (n *Node) GCExcept(ctx context.Context, creating func(id string) bool) (GCReport, error) {
	var rep GCReport
	var reservations []*Reservation
	state := n.state
	if err := n.ledger.View(func(tx *LedgerTx) error {
		var err error
		reservations, err = tx.List()
		return err
	}); err != nil {
		return rep, err
	}
	pids := map[string]int{}
	var errs []error
	for _, r := range reservations {
		pids[r.SandboxID] = r.ShimPID
		// A claim's reservation is the kubelet's to end (unprepare), not
		// a shim's: no process of the node says whether it still lives.
		if r.Claim != nil || SandboxAlive(n.cfg, r.SandboxID, r.ShimPID) {
			continue
		}
		if err := n.Release(ctx, r.SandboxID); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Released = append(rep.Released, r.SandboxID)
	}
	ids, err := state.List()
	if err != nil {
		return rep, err
	}
	for _, id := range ids {
		// The record only hints at its shim here: what GC frees is what
		// the ledger holds, and a forged pid at worst keeps a record that
		// no agent will resume (Load refuses it). So a record that does
		// not authenticate, an earlier release's among them, is read as
		// it stands.
		sb, err := state.LoadUnauthenticated(id)
		if err != nil {
			// A create may be writing the record right now (the directory
			// exists before the record is renamed into it): leave it alone
			// while the writer says so, or, when no writer says, while the
			// directory is young.
			if creating != nil && creating(id) || creating == nil && young(state, id) {
				continue
			}
		}
		pid := 0
		if sb != nil {
			pid = sb.ShimPID
		}
		if SandboxAlive(n.cfg, id, pid) {
			continue
		}
		if err := state.Remove(id); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Records = append(rep.Records, id)
	}
	if n.fence != nil {
		gone, err := n.fence.GC(ctx, func(id string) bool {
			return SandboxAlive(n.cfg, id, pids[id])
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("fence: %w", err))
		}
		for _, e := range gone {
			rep.Endpoints = append(rep.Endpoints, e.SandboxID)
		}
	}
	if n.backend != nil {
		if err := n.destroyOrphanInstances(&rep); err != nil {
			errs = append(errs, err)
		}
	}
	if err := n.removeOrphanCDISpecs(&rep); err != nil {
		errs = append(errs, err)
	}
	if !rep.Empty() {
		log.G(ctx).Infof("gc: released %v, records %v, endpoints %v, instances %v, cdi specs %v", rep.Released, rep.Records, rep.Endpoints, rep.Instances, rep.CDISpecs)
	}
	return rep, errors.Join(errs...)
}

// destroyOrphanInstances destroys MIG instances no reservation accounts for
// (a crash between creating an instance and recording it). A reservation
// whose instance is still being created holds its slot, so a concurrent
// shim's instance is never taken for an orphan.
func (n *Node) destroyOrphanInstances(rep *GCReport) error {
	insts, err := n.backend.Instances()
	if err != nil {
		return fmt.Errorf("gpu: %w", err)
	}
	// Read the ledger after listing: an instance created meanwhile has its
	// reservation recorded before it exists.
	var placements []mig.Placement
	if err := n.ledger.View(func(tx *LedgerTx) error {
		placements, err = tx.Placements()
		return err
	}); err != nil {
		return err
	}
	orphans, _ := mig.Reconcile(insts, placements)
	var errs []error
	for _, in := range orphans {
		key := fmt.Sprintf("%d/%d", in.GPU, in.GI)
		if err := n.backend.Destroy(in.GPU, in.GI, in.CI); err != nil {
			errs = append(errs, fmt.Errorf("gpu %s: %w", key, err))
			continue
		}
		rep.Instances = append(rep.Instances, key)
	}
	return errors.Join(errs...)
}

// removeOrphanCDISpecs removes the CDI specs of sandboxes that hold no
// reservation (a crash between writing the spec and releasing it). The
// directory is listed before the ledger is read: a spec is written after
// its reservation, so a pod being placed meanwhile is never taken for an
// orphan.
func (n *Node) removeOrphanCDISpecs(rep *GCReport) error {
	if n.cfg.MIG.CDISpecDir == "" {
		return nil
	}
	owners, err := inject.CDISpecOwners(n.cfg.MIG.CDISpecDir, inject.CDIKind)
	if err != nil || len(owners) == 0 {
		return err
	}
	held := map[string]bool{}
	if err := n.ledger.View(func(tx *LedgerTx) error {
		all, err := tx.List()
		for _, r := range all {
			held[r.SandboxID] = true
		}
		return err
	}); err != nil {
		return err
	}
	var errs []error
	for _, id := range owners {
		if held[id] {
			continue
		}
		if err := n.removeCDISpec(id); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.CDISpecs = append(rep.CDISpecs, id)
	}
	return errors.Join(errs...)
}
