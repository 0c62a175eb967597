package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// The quota ledger makes the API server the point of agreement on what a
// tenant holds, so that any number of webhook replicas, each answering a
// burst of pods at once, admit no more than the tenant's quota.
//
// Each tenant (or each namespace the bundle maps to no tenant) has one
// ConfigMap in the ledgers' namespace (DefaultQuotaNamespace, which holds
// nothing else) whose data holds one reservation
// per admitted pod, keyed by pod UID. A review of a pod reads the ledger,
// decides with the ledger's sum as input.usage, and, when the pod is
// admitted, writes its reservation with the ledger's resourceVersion as a
// precondition (compare and swap): if another review wrote first, the
// write fails with a conflict and the review starts over with the new sum.
// Two reviews can therefore never both be admitted on the same usage.
//
// A reservation is released when the pod informer sees the pod deleted or
// finished, and by a periodic reconciliation when no live pod has its UID
// after a grace period (the pod was admitted here but never created, say
// because a later admission plugin refused it).

// Labels and annotations of a ledger ConfigMap.
const (
	ledgerComponent   = "quota-ledger"
	ledgerLabel       = "app.kubernetes.io/component"
	ledgerOwnerAnnote = "bulkhead.dev/quota-ledger-of"
)

// DefaultQuotaGrace is how long a reservation is kept without its pod
// being seen live: far longer than the API server takes from admission to
// storing the pod (its request timeout is 60 s), short enough that a pod
// that was never created does not hold a tenant's quota for long.
const DefaultQuotaGrace = 2 * time.Minute

// maxLedgerAttempts bounds the compare-and-swap rounds of one review; the
// API server's webhook timeout bounds them in time.
const maxLedgerAttempts = 64

// QuotaLedgerOptions configure NewQuotaLedger.
type QuotaLedgerOptions struct {
	// Client writes the ledgers; required.
	Client kubernetes.Interface
	// Namespace holds the ledger ConfigMaps and nothing else (the webhook
	// may write every ConfigMap there); required.
	Namespace string
	// Pods is the live pods' view (Cluster.Usage). With it, a new ledger
	// starts from the tenant's live pods, and Start releases reservations
	// of pods that are gone. Nil: nothing is released but by deletion of
	// the ledger.
	Pods *PodUsage
	// PodInformer delivers pod deletions to Start; nil: reconciliation only.
	PodInformer cache.SharedIndexInformer
	// Grace is how long a reservation may go without a live pod; 0 means
	// DefaultQuotaGrace.
	Grace time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives releases and reconciliation errors; nil discards.
	Logger *slog.Logger
}

// QuotaLedger keeps the tenants' reservations in ConfigMaps.
type QuotaLedger struct {
	client    kubernetes.Interface
	namespace string
	pods      *PodUsage
	informer  cache.SharedIndexInformer
	grace     time.Duration
	now       func() time.Time
	logger    *slog.Logger

	// mu guards released: pod UIDs whose deletion was seen, waiting for
	// the release worker.
	mu       sync.Mutex
	released map[types.UID]string // UID -> namespace
	wake     chan struct{}
}

// NewQuotaLedger checks opts and returns a QuotaLedger.
func NewQuotaLedger(opts QuotaLedgerOptions) (*QuotaLedger, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("admission: QuotaLedgerOptions.Client is required")
	case opts.Namespace == "":
		return nil, errors.New("admission: QuotaLedgerOptions.Namespace is required")
	case opts.Grace < 0:
		return nil, fmt.Errorf("admission: QuotaLedgerOptions.Grace %v must not be negative", opts.Grace)
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultQuotaGrace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &QuotaLedger{
		client: opts.Client, namespace: opts.Namespace, pods: opts.Pods, informer: opts.PodInformer,
		grace: opts.Grace, now: opts.Now, logger: opts.Logger,
		released: map[types.UID]string{}, wake: make(chan struct{}, 1),
	}, nil
}

// reservation is what one admitted pod holds.
type reservation struct {
	namespace, name string
	usage           policy.Usage
	at              time.Time
}

// String is the ledger's encoding: "namespace/name sandboxes slices bytes unix".
func (r reservation) String() string {
	return fmt.Sprintf("%s/%s %d %d %d %d", r.namespace, r.name, r.usage.Sandboxes, r.usage.GPUSlices, r.usage.MemoryBytes, r.at.Unix())
}

func parseReservation(s string) (reservation, error) {
	f := strings.Fields(s)
	if len(f) != 5 {
		return reservation{}, fmt.Errorf("reservation %q: want 5 fields", s)
	}
	var r reservation
	var ok bool
	if r.namespace, r.name, ok = strings.Cut(f[0], "/"); !ok {
		return reservation{}, fmt.Errorf("reservation %q: no namespace/name", s)
	}
	n := make([]int64, 4)
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || v < 0 {
			return reservation{}, fmt.Errorf("reservation %q: field %d is not a count", s, i+2)
		}
		n[i] = v
	}
	r.usage = policy.Usage{Sandboxes: int(n[0]), GPUSlices: int(n[1]), MemoryBytes: n[2]}
	r.at = time.Unix(n[3], 0)
	return r, nil
}

// ledger is one tenant's ConfigMap as read, decoded.
type ledger struct {
	name    string
	owner   string
	cm      *corev1.ConfigMap // nil: does not exist yet
	entries map[string]reservation
}

func (l *ledger) usage(exclude string) policy.Usage {
	var sum policy.Usage
	for k, r := range l.entries {
		if k != exclude {
			sum = add(sum, r.usage)
		}
	}
	return sum
}

// ledgerName is the ConfigMap of a tenant ("t-") or of a namespace the
// bundle maps to no tenant ("ns-"): a readable name when it is a valid
// one, else a hash of the owner.
func ledgerName(owner string) string {
	name := "bulkhead-quota-" + owner
	if len(validation.IsDNS1123Subdomain(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(owner))
	return "bulkhead-quota-" + hex.EncodeToString(sum[:12])
}

func (q *QuotaLedger) ownerOf(ctx context.Context, r *Reviewer, namespace string) (string, error) {
	tenant, err := r.tenantOf(ctx, namespace)
	if err != nil {
		return "", err
	}
	if tenant == "" {
		return "ns-" + namespace, nil
	}
	return "t-" + tenant, nil
}

// read fetches a ledger from the API server (a quorum read). A ledger that
// does not exist yet starts from the tenant's live pods, as the informer
// sees them, so that installing the ledger on a running cluster does not
// forget what tenants hold.
func (q *QuotaLedger) read(ctx context.Context, r *Reviewer, owner string) (*ledger, error) {
	l := &ledger{name: ledgerName(owner), owner: owner, entries: map[string]reservation{}}
	cm, err := q.client.CoreV1().ConfigMaps(q.namespace).Get(ctx, l.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return l, q.seed(ctx, r, l)
	case err != nil:
		return nil, fmt.Errorf("reading quota ledger %s/%s: %w", q.namespace, l.name, err)
	}
	l.cm = cm
	for k, v := range cm.Data {
		res, err := parseReservation(v)
		if err != nil {
			return nil, fmt.Errorf("quota ledger %s/%s, key %s: %w", q.namespace, l.name, k, err)
		}
		l.entries[k] = res
	}
	return l, nil
}

func (q *QuotaLedger) seed(ctx context.Context, r *Reviewer, l *ledger) error {
	if q.pods == nil {
		return nil
	}
	live, err := q.pods.live()
	if err != nil {
		return fmt.Errorf("starting quota ledger %s: %w", l.name, err)
	}
	now := q.now()
	for uid, p := range live {
		owner, err := q.ownerOf(ctx, r, p.namespace)
		if err != nil {
			return err
		}
		if owner == l.owner {
			l.entries[string(uid)] = reservation{namespace: p.namespace, name: p.name, usage: p.usage, at: now}
		}
	}
	return nil
}

// write stores l with its entries as they are now, on the condition that
// nobody wrote it since it was read: a conflict or an existing ledger
// where none was comes back as an error for which retryable is true.
func (q *QuotaLedger) write(ctx context.Context, l *ledger) error {
	data := make(map[string]string, len(l.entries))
	for k, r := range l.entries {
		data[k] = r.String()
	}
	var err error
	if l.cm == nil {
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: l.name, Namespace: q.namespace,
				Labels:      map[string]string{ledgerLabel: ledgerComponent, "app.kubernetes.io/part-of": "bulkhead"},
				Annotations: map[string]string{ledgerOwnerAnnote: l.owner},
			},
			Data: data,
		}
		_, err = q.client.CoreV1().ConfigMaps(q.namespace).Create(ctx, cm, metav1.CreateOptions{})
	} else {
		cm := l.cm.DeepCopy()
		cm.Data = data // cm.ResourceVersion is the precondition
		_, err = q.client.CoreV1().ConfigMaps(q.namespace).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("writing quota ledger %s/%s: %w", q.namespace, l.name, err)
	}
	return nil
}

func retryable(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }

// backoff waits a little, more after each lost round, so that replicas
// that keep colliding spread out.
func backoff(ctx context.Context, attempt int) error {
	d := time.Duration(rand.Int64N(int64(min(attempt, 10))*int64(time.Millisecond) + 1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// admits reports whether Reviewer.respond will admit on dec.
func admits(dec policy.Decision) bool {
	if !dec.Allow {
		return false
	}
	for _, rs := range dec.Reasons {
		if rs.Enforcement != policy.EnforceWarn && rs.Enforcement != policy.EnforceAudit {
			return false
		}
	}
	return true
}

// decide evaluates a pod against its tenant's ledger and, when the pod is
// admitted, records its reservation in the same ledger revision the
// decision saw. Dry runs decide on the ledger and record nothing.
//
// On an UPDATE (old is the pod it replaces) the pod is decided on the
// ledger without its own reservation and re-charged to what it holds now,
// never less than before (update.go): a resize that grows it is refused
// past the quota, one that shrinks it keeps its reservation.
func (q *QuotaLedger) decide(ctx context.Context, r *Reviewer, req *admissionv1.AdmissionRequest, pod podObject, old *podObject, in policy.Input) (policy.Decision, error) {
	uid := string(pod.Object.UID)
	if uid == "" {
		return policy.Decision{}, errors.New("quota ledger: the pod has no uid (the API server sets it before validating admission)")
	}
	owner, err := q.ownerOf(ctx, r, req.Namespace)
	if err != nil {
		return policy.Decision{}, err
	}
	dryRun := req.DryRun != nil && *req.DryRun
	charge := chargeOf(&corev1.Pod{ObjectMeta: pod.Meta, Spec: pod.Spec})
	if old != nil {
		charge = maxUsage(charge, chargeOf(&corev1.Pod{ObjectMeta: old.Meta, Spec: old.Spec}))
	}
	for attempt := 1; ; attempt++ {
		l, err := q.read(ctx, r, owner)
		if err != nil {
			return policy.Decision{}, err
		}
		in.Usage = l.usage(uid)
		dec, err := r.decider.Decide(ctx, in)
		if err != nil || !admits(dec) || dryRun {
			return dec, err
		}
		held := charge
		prev, ok := l.entries[uid]
		if ok && old != nil {
			held = maxUsage(held, prev.usage)
		}
		if ok && prev.usage == held {
			return dec, nil // already reserved: a retry, or an update that changes nothing held
		}
		l.entries[uid] = reservation{namespace: req.Namespace, name: pod.Object.Name, usage: held, at: q.now()}
		err = q.write(ctx, l)
		if err == nil {
			return dec, nil
		}
		if !retryable(err) {
			return policy.Decision{}, err
		}
		if attempt == maxLedgerAttempts {
			return policy.Decision{}, fmt.Errorf("quota ledger %s: %d writes in a row lost to other reviews: %w", l.name, attempt, err)
		}
		if err := backoff(ctx, attempt); err != nil {
			return policy.Decision{}, fmt.Errorf("quota ledger %s: %w", l.name, err)
		}
	}
}

// decideWithLedger is Reviewer's hook: pods go through the ledger when one
// is configured, everything else straight to the decider.
func (r *Reviewer) decideWithLedger(ctx context.Context, req *admissionv1.AdmissionRequest, gvk schema.GroupVersionKind, pod podObject, old *podObject, in policy.Input) (policy.Decision, error) {
	if r.quota == nil || gvk != kindPod {
		return r.decider.Decide(ctx, in)
	}
	return r.quota.decide(ctx, r, req, pod, old, in)
}

// Start releases reservations until ctx ends: at once for pods the
// informer sees deleted or finished, and every half grace period for
// reservations whose pod no live pod matches and that are older than the
// grace period. r resolves namespaces to tenants.
func (q *QuotaLedger) Start(ctx context.Context, r *Reviewer) error {
	if q.informer != nil {
		gone := func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok || p.UID == "" {
				return
			}
			q.mu.Lock()
			q.released[p.UID] = p.Namespace
			q.mu.Unlock()
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
		_, err := q.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			UpdateFunc: func(_, obj any) {
				if p, ok := obj.(*corev1.Pod); ok && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
					gone(obj)
				}
			},
			DeleteFunc: gone,
		})
		if err != nil {
			return fmt.Errorf("admission: quota ledger: registering on the pod informer: %w", err)
		}
	}
	tick := time.NewTicker(q.grace / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-q.wake:
			q.releaseSeen(ctx, r)
		case <-tick.C:
			if err := q.Reconcile(ctx); err != nil {
				q.logger.Warn("quota ledger reconciliation", "err", err)
			}
		}
	}
}

// releaseSeen removes the reservations of the pods seen gone.
func (q *QuotaLedger) releaseSeen(ctx context.Context, r *Reviewer) {
	q.mu.Lock()
	batch := q.released
	q.released = map[types.UID]string{}
	q.mu.Unlock()
	byOwner := map[string][]string{}
	for uid, ns := range batch {
		owner, err := q.ownerOf(ctx, r, ns)
		if err != nil {
			q.logger.Warn("quota ledger: releasing a deleted pod", "uid", uid, "namespace", ns, "err", err)
			continue // the reconciliation releases it after the grace period
		}
		byOwner[owner] = append(byOwner[owner], string(uid))
	}
	for owner, uids := range byOwner {
		name := ledgerName(owner)
		if err := q.remove(ctx, name, func(uid string, _ reservation) bool { return containsString(uids, uid) }); err != nil {
			q.logger.Warn("quota ledger: releasing deleted pods", "ledger", name, "err", err)
		}
	}
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// remove deletes the entries of ledger name for which drop is true, with
// the same compare and swap as a reservation.
func (q *QuotaLedger) remove(ctx context.Context, name string, drop func(uid string, r reservation) bool) error {
	for attempt := 1; ; attempt++ {
		cm, err := q.client.CoreV1().ConfigMaps(q.namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		changed := false
		for uid, v := range cm.Data {
			res, err := parseReservation(v)
			if err == nil && !drop(uid, res) {
				continue
			}
			// A malformed entry is dropped too: it would refuse every
			// review of the tenant.
			delete(cm.Data, uid)
			changed = true
			q.logger.Info("quota reservation released", "ledger", name, "uid", uid, "pod", res.namespace+"/"+res.name)
		}
		if !changed {
			return nil
		}
		_, err = q.client.CoreV1().ConfigMaps(q.namespace).Update(ctx, cm, metav1.UpdateOptions{})
		if err == nil || !retryable(err) || attempt == maxLedgerAttempts {
			return err
		}
		if err := backoff(ctx, attempt); err != nil {
			return err
		}
	}
}

// Reconcile releases, in every ledger, the reservations that no live pod
// holds and that are older than the grace period. It does nothing until
// the pod informer has synced: before, every pod would look gone.
func (q *QuotaLedger) Reconcile(ctx context.Context) error {
	if q.pods == nil {
		return nil
	}
	live, err := q.pods.live()
	if err != nil {
		return err
	}
	list, err := q.client.CoreV1().ConfigMaps(q.namespace).List(ctx, metav1.ListOptions{LabelSelector: ledgerLabel + "=" + ledgerComponent})
	if err != nil {
		return fmt.Errorf("listing quota ledgers: %w", err)
	}
	cutoff := q.now().Add(-q.grace)
	var errs []error
	for _, cm := range list.Items {
		err := q.remove(ctx, cm.Name, func(uid string, r reservation) bool {
			_, ok := live[types.UID(uid)]
			return !ok && r.at.Before(cutoff)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("quota ledger %s: %w", cm.Name, err))
		}
	}
	return errors.Join(errs...)
}
