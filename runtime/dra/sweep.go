package dra

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/log"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// DefaultSweepInterval is how often the plugin looks for prepared claims
// that are gone when Options.SweepInterval is 0.
const DefaultSweepInterval = time.Minute

// ClaimGrace is how long after its reservation was last written a claim is
// never swept: the claim may be being prepared right now (the node GC gives
// a sandbox record being written the same time).
const ClaimGrace = 2 * time.Minute

// Swept is one claim the orphan sweep released.
type Swept struct {
	// UID is the claim's UID, the reservation's ledger key.
	UID string
	// Namespace and Name are the claim's.
	Namespace, Name string
	// Why says how the API server showed the claim gone.
	Why string
}

// sweep releases the claims this node holds that the API server says are
// gone, exactly as an unprepare does (runtime.Pipeline.UnprepareClaim:
// instance, CDI spec, reservation). The kubelet unprepares a claim before
// it is deleted or deallocated, unless its own state was lost; then
// nothing else ends it. A claim is gone when the API server answers that
// it does not exist, that the claim of that name has another UID (it was
// recreated), or that it is no longer allocated the device this node holds
// for it. Only such a definite answer releases anything: any other error
// (the API server unreachable, forbidden) keeps the claim and is returned.
// A reservation written less than ClaimGrace before now is left alone.
func (d *Driver) sweep(ctx context.Context, now time.Time) ([]Swept, error) {
	var claims []*node.Reservation
	if err := d.opts.Pipeline.Node().Ledger().View(func(tx *node.LedgerTx) error {
		all, err := tx.List()
		for _, r := range all {
			if r.Claim != nil {
				claims = append(claims, r)
			}
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("dra: sweep: %w", err)
	}
	var swept []Swept
	var errs []error
	for _, r := range claims {
		if young(r, now) {
			continue
		}
		why, err := d.gone(ctx, r)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if why == "" {
			continue
		}
		// Read it again: a prepare since the list (the claim deallocated
		// and allocated here again, under the same UID) wrote it anew.
		if again, err := d.reservation(r.SandboxID); err != nil {
			errs = append(errs, err)
			continue
		} else if again == nil || young(again, now) {
			continue
		}
		if err := d.opts.Pipeline.UnprepareClaim(ctx, r.SandboxID); err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s (uid %s): %w", r.Claim.Namespace, r.Claim.Name, r.SandboxID, err))
			continue
		}
		s := Swept{UID: r.SandboxID, Namespace: r.Claim.Namespace, Name: r.Claim.Name, Why: why}
		log.G(ctx).Infof("dra: released claim %s/%s (uid %s, device %s): %s", s.Namespace, s.Name, s.UID, r.Claim.Device, why)
		swept = append(swept, s)
	}
	if err := errors.Join(errs...); err != nil {
		return swept, fmt.Errorf("dra: sweep: %w", err)
	}
	return swept, nil
}

// young reports whether r was written less than ClaimGrace before now. A
// claim's reservation is rewritten at every step of its preparation, so
// its last write is the time to count from.
func young(r *node.Reservation, now time.Time) bool {
	last := r.UpdatedAt
	if r.CreatedAt.After(last) {
		last = r.CreatedAt
	}
	return now.Sub(last) < ClaimGrace
}

func (d *Driver) reservation(uid string) (*node.Reservation, error) {
	var r *node.Reservation
	err := d.opts.Pipeline.Node().Ledger().View(func(tx *node.LedgerTx) error {
		var err error
		r, err = tx.Get(uid)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("claim uid %s: %w", uid, err)
	}
	return r, nil
}

// gone says why the claim r holds a device for is gone, or "" when it is
// still allocated that device on this node.
func (d *Driver) gone(ctx context.Context, r *node.Reservation) (string, error) {
	c, err := d.opts.Client.ResourceV1().ResourceClaims(r.Claim.Namespace).Get(ctx, r.Claim.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "the claim no longer exists", nil
	}
	if err != nil {
		return "", fmt.Errorf("claim %s/%s (uid %s): %w", r.Claim.Namespace, r.Claim.Name, r.SandboxID, err)
	}
	if c.UID != types.UID(r.SandboxID) {
		return fmt.Sprintf("the claim of that name was recreated (uid %s)", c.UID), nil
	}
	return notAllocatedHere(c, d.opts.NodeName, r.Claim.Device), nil
}

// notAllocatedHere says why claim c is not allocated device of this driver
// in nodeName's pool, or "" when it is.
func notAllocatedHere(c *resourcev1.ResourceClaim, nodeName, device string) string {
	if c.Status.Allocation == nil {
		return "the claim is no longer allocated"
	}
	var elsewhere string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != migdra.DriverName {
			continue
		}
		if r.Pool == nodeName && r.Device == device {
			return ""
		}
		elsewhere = fmt.Sprintf("device %s in pool %s", r.Device, r.Pool)
	}
	if elsewhere == "" {
		return fmt.Sprintf("the claim is allocated no device of %s", migdra.DriverName)
	}
	return fmt.Sprintf("the claim is allocated %s, not the node's %s in pool %s", elsewhere, device, nodeName)
}
