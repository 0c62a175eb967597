package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	admissionregistrationinformers "k8s.io/client-go/informers/admissionregistration/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// Certificate rotation. With a Rotator, the webhook keeps its own CA and
// serving certificate in a Secret and publishes the CA in the caBundle of
// its ValidatingWebhookConfiguration, as Gatekeeper's cert-controller does,
// so that an expired certificate never stops pod creation (failurePolicy
// is Fail). The rules, in the order Sync applies them:
//
//  1. The Secret is the one state every replica shares. It is written with
//     the resourceVersion it was read at; a replica that loses the race
//     reads what the winner wrote and decides again (usually: nothing left
//     to do) and serves that.
//  2. The CA is renewed when a third of its lifetime is left. The new CA
//     joins the bundle beside the older ones that have not expired, and
//     the bundle goes into caBundle before anything is signed with it.
//  3. The serving certificate is renewed when a third of its lifetime is
//     left, and at once when it is missing, names other hosts or was signed
//     by no CA of the bundle. It moves to a new CA only once this replica
//     has seen that CA in every webhook's caBundle for PropagationDelay (the
//     API server then trusts it), unless it would expire first.
//  4. A CA leaves the bundle when it expires; until then a replica still
//     serving a certificate it signed is trusted.
//  5. The pair is served from memory as soon as it is decided; the Secret
//     carries it to the other replicas and across restarts.
//
// Run watches the Secret and the configuration, each by name, and checks
// them in its caches at every change and every Interval: a caBundle someone
// removed is written back as soon as the watch reports it, and another
// replica's renewal is served at once. The caches only ever confirm that
// nothing is to be done; whatever is written, and any change of the pair
// served, is decided by Sync on what it reads from the API server, so a
// cache that lags can delay a decision but never make one.

// Defaults of RotatorOptions.
const (
	// DefaultCertLifetime is the serving certificate's lifetime: 45 days,
	// renewed with 15 left. The alert BulkheadWebhookCertificateExpiring
	// warns at 14 days left (deploy/monitoring), so it fires only once the
	// rotator has failed to renew for a day.
	DefaultCertLifetime = 45 * 24 * time.Hour
	// DefaultCALifetime is the CA's lifetime: a year, renewed after about
	// eight months, so the CA path runs in every long-lived cluster.
	DefaultCALifetime = 365 * 24 * time.Hour
	// maxRotatorInterval caps the default Interval and PropagationDelay.
	maxRotatorInterval = time.Minute
	// maxBackdate caps how far before its issue a certificate starts: the
	// clock skew between the webhook and the API server it tolerates.
	maxBackdate = 5 * time.Minute
	// minCertLifetime is the shortest serving certificate (tests use
	// seconds; anything shorter leaves no room to renew).
	minCertLifetime = time.Second
	// DefaultRotatorResync is RotatorOptions.Resync's default.
	DefaultRotatorResync = 10 * time.Minute
)

// Keys of the rotator's Secret. tls.crt and tls.key are the serving pair,
// as in a kubernetes.io/tls Secret.
const (
	SecretCACert   = "ca.crt"
	SecretCAKey    = "ca.key"
	SecretCABundle = "ca-bundle.crt"
)

// RotatorOptions configure NewRotator.
type RotatorOptions struct {
	// Client reads and writes the Secret and the
	// ValidatingWebhookConfiguration; required.
	Client kubernetes.Interface
	// Namespace and Secret name the Secret that holds the CA, its key, the
	// CA bundle and the serving pair; required. It is created if missing.
	Namespace, Secret string
	// WebhookConfig is the ValidatingWebhookConfiguration whose every
	// webhook's caBundle is kept equal to the Secret's bundle; required.
	WebhookConfig string
	// DNSNames are the names the serving certificate carries, such as
	// ServiceDNSNames of the webhook's Service; at least one.
	DNSNames []string
	// CertLifetime is the serving certificate's lifetime; 0 means
	// DefaultCertLifetime, and it must be at least a second.
	CertLifetime time.Duration
	// CALifetime is the CA's lifetime; 0 means DefaultCALifetime. It must
	// be at least 3 × CertLifetime, so that a new CA is published for a
	// whole serving certificate's life before the old one expires.
	CALifetime time.Duration
	// Interval is how often Run checks, in its watches' caches, whether a
	// certificate is due: renewals follow the clock, not events. 0 means
	// CertLifetime/12, at most a minute. Before the watches have synced
	// (RBAC without list and watch) each check reads the API server.
	Interval time.Duration
	// Resync is how often Run reads the Secret and the configuration from
	// the API server rather than from its watches; 0 means
	// DefaultRotatorResync. It is the safety net for a watch that stops
	// delivering without failing (a connection a proxy dropped silently, a
	// bug on either side): without it a caBundle reset then would stay
	// unseen until the watch is next re-established.
	Resync time.Duration
	// PropagationDelay is how long a new CA must have been seen in every
	// caBundle before a certificate it signed is served: the time the API
	// server takes to load the new bundle. 0 means the default Interval.
	// Interval + PropagationDelay must stay under CertLifetime/3.
	PropagationDelay time.Duration
	// Logger receives renewals and errors; nil discards.
	Logger *slog.Logger
}

// ServiceDNSNames are the names a client in the cluster reaches Service
// name in namespace by; the API server dials the first.
func ServiceDNSNames(namespace, name string) []string {
	return []string{
		name + "." + namespace + ".svc",
		name + "." + namespace + ".svc.cluster.local",
		name + "." + namespace,
		name,
	}
}

// Rotator keeps the webhook's CA and serving certificate (the rules above).
type Rotator struct {
	opts  RotatorOptions
	certs *CertReloader
	now   func() time.Time

	// kick wakes Run when a watch reports a change; changes that arrive
	// while it checks coalesce into one more check.
	kick chan struct{}

	// mu serialises Sync and guards the fields below it.
	mu sync.Mutex
	// trustedSince is when this replica first saw each CA (by
	// fingerprint) in every webhook's caBundle.
	trustedSince map[[32]byte]time.Time
	// inPlace is the bundle this replica last saw in every webhook's
	// caBundle: writing it again is a repair, not a publication.
	inPlace []byte
	// secrets and configs are Run's watch caches, nil outside Run; synced
	// says whether both have listed.
	secrets, configs cache.Store
	synced           func() bool

	// Counts for Metrics.WatchRotator: certificates this replica issued
	// and stored, and caBundles it wrote back.
	caIssued, servingIssued, repairs atomic.Uint64
}

// NewRotator checks opts. Nothing is served until the first Sync.
func NewRotator(opts RotatorOptions) (*Rotator, error) {
	if opts.CertLifetime == 0 {
		opts.CertLifetime = DefaultCertLifetime
	}
	if opts.CALifetime == 0 {
		opts.CALifetime = DefaultCALifetime
	}
	def := min(opts.CertLifetime/12, maxRotatorInterval)
	if opts.Interval == 0 {
		opts.Interval = def
	}
	if opts.PropagationDelay == 0 {
		opts.PropagationDelay = def
	}
	if opts.Resync == 0 {
		opts.Resync = DefaultRotatorResync
	}
	switch {
	case opts.Client == nil:
		return nil, errors.New("admission: RotatorOptions.Client is required")
	case opts.Namespace == "" || opts.Secret == "":
		return nil, errors.New("admission: RotatorOptions.Namespace and Secret are required")
	case opts.WebhookConfig == "":
		return nil, errors.New("admission: RotatorOptions.WebhookConfig is required")
	case len(opts.DNSNames) == 0:
		return nil, errors.New("admission: RotatorOptions.DNSNames: at least one name is required")
	case opts.CertLifetime < minCertLifetime:
		return nil, fmt.Errorf("admission: RotatorOptions.CertLifetime %v: must be at least %v", opts.CertLifetime, minCertLifetime)
	case opts.CALifetime < 3*opts.CertLifetime:
		return nil, fmt.Errorf("admission: RotatorOptions.CALifetime %v: must be at least 3 × CertLifetime (%v)", opts.CALifetime, 3*opts.CertLifetime)
	case opts.Interval < 0 || opts.PropagationDelay < 0 || opts.Resync < 0:
		return nil, fmt.Errorf("admission: RotatorOptions.Interval %v, PropagationDelay %v and Resync %v must not be negative", opts.Interval, opts.PropagationDelay, opts.Resync)
	case opts.Interval+opts.PropagationDelay >= opts.CertLifetime/3:
		return nil, fmt.Errorf("admission: RotatorOptions.Interval %v + PropagationDelay %v: must stay under CertLifetime/3 (%v), the time left to renew", opts.Interval, opts.PropagationDelay, opts.CertLifetime/3)
	}
	for _, n := range opts.DNSNames {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			return nil, fmt.Errorf("admission: RotatorOptions.DNSNames %q: %s", n, strings.Join(errs, "; "))
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Rotator{
		opts: opts, certs: newMemoryCerts(opts.Logger), now: time.Now,
		kick: make(chan struct{}, 1), trustedSince: map[[32]byte]time.Time{},
	}, nil
}

// Certs serves the pair the rotator decided last (ServeOptions.Certs,
// Metrics.WatchCertificate).
func (r *Rotator) Certs() *CertReloader { return r.certs }

// Run watches the Secret and the configuration until ctx ends, each
// restricted to its one name (a field selector on metadata.name, which RBAC
// matches against resourceNames for list and watch), and checks them at
// every change they report, every Interval and, reading the API server,
// every Resync. A failed check is logged and retried at the next; the pair
// in service stays. Call it once, after a first Sync.
func (r *Rotator) Run(ctx context.Context) error {
	secrets := coreinformers.NewFilteredSecretInformer(r.opts.Client, r.opts.Namespace, 0, cache.Indexers{}, byName(r.opts.Secret))
	configs := admissionregistrationinformers.NewFilteredValidatingWebhookConfigurationInformer(r.opts.Client, 0, cache.Indexers{}, byName(r.opts.WebhookConfig))
	wake := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.wake() },
		UpdateFunc: func(any, any) { r.wake() },
		DeleteFunc: func(any) { r.wake() },
	}
	for _, inf := range []cache.SharedIndexInformer{secrets, configs} {
		if _, err := inf.AddEventHandler(wake); err != nil {
			return fmt.Errorf("certificate rotator: watch: %w", err)
		}
	}
	r.mu.Lock()
	r.secrets, r.configs = secrets.GetStore(), configs.GetStore()
	r.synced = func() bool { return secrets.HasSynced() && configs.HasSynced() }
	r.mu.Unlock()
	var watching sync.WaitGroup
	watching.Go(func() { secrets.RunWithContext(ctx) })
	watching.Go(func() { configs.RunWithContext(ctx) })
	defer func() {
		watching.Wait()
		r.mu.Lock()
		r.secrets, r.configs, r.synced = nil, nil, nil
		r.mu.Unlock()
	}()

	tick := time.NewTicker(r.opts.Interval)
	defer tick.Stop()
	resync := time.NewTicker(r.opts.Resync)
	defer resync.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
			err = r.check(ctx)
		case <-tick.C:
			err = r.check(ctx)
		case <-resync.C:
			err = r.Sync(ctx)
		}
		if err != nil && ctx.Err() == nil {
			r.opts.Logger.Warn("certificate rotator", "err", err)
		}
	}
}

// byName restricts a list or watch to the object called name.
func byName(name string) func(*metav1.ListOptions) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return func(o *metav1.ListOptions) { o.FieldSelector = sel }
}

// wake asks Run for a check; it never blocks a watch's delivery.
func (r *Rotator) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// check is Run's answer to a change or a tick: Sync, unless the caches show
// that there is nothing to do.
func (r *Rotator) check(ctx context.Context) error {
	r.mu.Lock()
	idle := r.settledInCache()
	r.mu.Unlock()
	if idle {
		return nil
	}
	return r.Sync(ctx)
}

// settledInCache says whether the watches' caches show nothing for Sync to
// do: every webhook's caBundle holds the Secret's bundle, the Secret's
// pair is the one served, and it needs no renewal. Only then does it note,
// as Sync does, which CAs every caBundle holds: a cache behind the API
// server must not restart a new CA's PropagationDelay that Sync has seen
// running. False whenever the caches cannot tell.
func (r *Rotator) settledInCache() bool {
	if r.synced == nil || !r.synced() {
		return false
	}
	obj, ok, err := r.configs.GetByKey(r.opts.WebhookConfig)
	if err != nil || !ok {
		return false
	}
	vwc := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
	obj, ok, err = r.secrets.GetByKey(r.opts.Namespace + "/" + r.opts.Secret)
	if err != nil || !ok {
		return false
	}
	s := parseState(obj.(*corev1.Secret).Data)
	if s.ca == nil || s.pair == nil {
		return false
	}
	if served := r.certs.served(); served == nil || !served.Equal(s.pair.Leaf) {
		return false
	}
	bundle := s.bundlePEM()
	if len(vwc.Webhooks) == 0 || slices.ContainsFunc(vwc.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
		return !bytes.Equal(w.ClientConfig.CABundle, bundle)
	}) {
		return false
	}
	r.observeTrust(vwc)
	if !r.upToDate(s, r.now()) {
		return false
	}
	r.inPlace = bundle
	return true
}

// Sync brings the Secret up to the rules, serves its pair and publishes its
// bundle in caBundle, reading and writing the API server. The pair is
// served even when publishing fails.
func (r *Rotator) Sync(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	vwc, err := r.opts.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, r.opts.WebhookConfig, metav1.GetOptions{})
	if err == nil {
		r.observeTrust(vwc)
	} // else publish reports why
	s, err := r.syncSecret(ctx)
	if err != nil {
		return err
	}
	r.serve(s.pair)
	return r.publish(ctx, s.bundlePEM())
}

// secretAttempts bounds the read-decide-write rounds of one Sync: each lost
// race means another replica wrote, and its Secret rarely needs more.
const secretAttempts = 5

func (r *Rotator) syncSecret(ctx context.Context) (certState, error) {
	secrets := r.opts.Client.CoreV1().Secrets(r.opts.Namespace)
	ref := r.opts.Namespace + "/" + r.opts.Secret
	for range secretAttempts {
		cur, err := secrets.Get(ctx, r.opts.Secret, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s, issued, err := r.renew(certState{})
			if err != nil {
				return certState{}, err
			}
			obj := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: r.opts.Secret, Namespace: r.opts.Namespace,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "bulkhead-webhook"}},
				Type: corev1.SecretTypeTLS,
				Data: s.data(),
			}
			_, err = secrets.Create(ctx, obj, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // another replica created it: read and use that one
			}
			if err != nil {
				return certState{}, fmt.Errorf("secret %s: create: %w", ref, err)
			}
			r.count(issued)
			r.opts.Logger.Info("certificate rotator: created the secret", "secret", ref)
			return s, nil
		}
		if err != nil {
			return certState{}, fmt.Errorf("secret %s: get: %w", ref, err)
		}
		s, issued, err := r.renew(parseState(cur.Data))
		if err != nil {
			return certState{}, err
		}
		if !issued.changed {
			return s, nil
		}
		upd := cur.DeepCopy()
		if upd.Data == nil {
			upd.Data = map[string][]byte{}
		}
		for k, v := range s.data() {
			upd.Data[k] = v
		}
		_, err = secrets.Update(ctx, upd, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			r.opts.Logger.Debug("certificate rotator: another replica wrote the secret first; reading it", "secret", ref)
			continue
		}
		if err != nil {
			return certState{}, fmt.Errorf("secret %s: update: %w", ref, err)
		}
		r.count(issued)
		return s, nil
	}
	return certState{}, fmt.Errorf("secret %s: %d conflicting writes in a row; retrying at the next interval", ref, secretAttempts)
}

// renewal is what renew changed.
type renewal struct {
	changed     bool // anything: the Secret must be written
	ca, serving bool // a new CA, a new serving certificate was issued
}

// renew applies rules 2 to 4 to s: it returns the state to keep and what
// differs from s.
func (r *Rotator) renew(s certState) (certState, renewal, error) {
	now := r.now()
	var out renewal
	if ok, why := needsNewCA(s.ca, now); ok {
		ca, key, err := newCA(now, r.opts.CALifetime)
		if err != nil {
			return s, renewal{}, err
		}
		r.opts.Logger.Info("certificate rotator: new CA", "why", why, "serial", ca.SerialNumber, "not_after", ca.NotAfter)
		s.ca, s.caKey, out.ca = ca, key, true
	}
	if b := bundleOf(s.ca, s.bundle, now); !sameCerts(b, s.bundle) {
		s.bundle, out.changed = b, true
	}
	if ok, why := needsNewCert(r.certCheck(s, now)); ok {
		pair, err := issueCert(s.ca, s.caKey, r.opts.DNSNames, now, r.opts.CertLifetime)
		if err != nil {
			return s, renewal{}, err
		}
		r.opts.Logger.Info("certificate rotator: new serving certificate", "why", why,
			"serial", pair.Leaf.SerialNumber, "not_after", pair.Leaf.NotAfter, "ca_serial", s.ca.SerialNumber)
		s.pair, out.serving = pair, true
	}
	out.changed = out.changed || out.ca || out.serving
	return s, out, nil
}

// upToDate says whether renew would leave a complete s as it is.
func (r *Rotator) upToDate(s certState, now time.Time) bool {
	if ok, _ := needsNewCA(s.ca, now); ok {
		return false
	}
	if !sameCerts(bundleOf(s.ca, s.bundle, now), s.bundle) {
		return false
	}
	ok, _ := needsNewCert(r.certCheck(s, now))
	return !ok
}

// certCheck is what needsNewCert decides on for s at now.
func (r *Rotator) certCheck(s certState, now time.Time) certCheck {
	trustedFor := time.Duration(-1)
	if since, ok := r.trustedSince[fingerprint(s.ca)]; ok {
		trustedFor = now.Sub(since)
	}
	return certCheck{
		leaf: s.leaf(), ca: s.ca, bundle: s.bundle, dnsNames: r.opts.DNSNames, now: now,
		caTrustedFor: trustedFor, delay: r.opts.PropagationDelay, interval: r.opts.Interval,
	}
}

// count adds what a stored renewal issued to the rotation counts.
func (r *Rotator) count(issued renewal) {
	if issued.ca {
		r.caIssued.Add(1)
	}
	if issued.serving {
		r.servingIssued.Add(1)
	}
}

// serve puts pair in service if it is not already.
func (r *Rotator) serve(pair *tls.Certificate) {
	if cur := r.certs.served(); cur != nil && bytes.Equal(cur.Raw, pair.Leaf.Raw) {
		return
	}
	r.certs.set(pair)
	r.opts.Logger.Info("certificate rotator: serving", "serial", pair.Leaf.SerialNumber, "not_after", pair.Leaf.NotAfter)
}

// publish sets every webhook's caBundle in the configuration to bundle and
// notes when each CA of it was first seen there. Writing the bundle this
// replica last saw in place is a repair: someone removed or changed it.
func (r *Rotator) publish(ctx context.Context, bundle []byte) error {
	configs := r.opts.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	var written []string // the webhooks whose caBundle this call wrote
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		written = nil
		vwc, err := configs.Get(ctx, r.opts.WebhookConfig, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(vwc.Webhooks) == 0 {
			return errors.New("it has no webhooks")
		}
		var changed []string
		for i := range vwc.Webhooks {
			if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, bundle) {
				vwc.Webhooks[i].ClientConfig.CABundle = bundle
				changed = append(changed, vwc.Webhooks[i].Name)
			}
		}
		if len(changed) == 0 {
			return nil
		}
		if _, err := configs.Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
			return err
		}
		written = changed
		return nil
	})
	if err != nil {
		return fmt.Errorf("validatingwebhookconfiguration %s: caBundle: %w", r.opts.WebhookConfig, err)
	}
	switch {
	case len(written) == 0:
	case bytes.Equal(r.inPlace, bundle):
		r.repairs.Add(1)
		r.opts.Logger.Warn("certificate rotator: wrote back the CA bundle someone removed or changed",
			"validatingwebhookconfiguration", r.opts.WebhookConfig, "webhooks", written)
	default:
		r.opts.Logger.Info("certificate rotator: published the CA bundle", "validatingwebhookconfiguration", r.opts.WebhookConfig)
	}
	r.inPlace = bundle
	now := r.now()
	seen := map[[32]byte]bool{}
	for _, c := range parseCerts(bundle) {
		fp := fingerprint(c)
		seen[fp] = true
		if _, ok := r.trustedSince[fp]; !ok {
			r.trustedSince[fp] = now
		}
	}
	for fp := range r.trustedSince {
		if !seen[fp] {
			delete(r.trustedSince, fp)
		}
	}
	return nil
}

// observeTrust keeps trustedSince to the CAs that every webhook's caBundle
// in vwc holds: a CA someone (or a replica that read an older Secret) took
// out starts its PropagationDelay over.
func (r *Rotator) observeTrust(vwc *admissionregistrationv1.ValidatingWebhookConfiguration) {
	if len(vwc.Webhooks) == 0 {
		return
	}
	inAll := map[[32]byte]bool{}
	for _, c := range parseCerts(vwc.Webhooks[0].ClientConfig.CABundle) {
		inAll[fingerprint(c)] = true
	}
	for _, w := range vwc.Webhooks[1:] {
		here := map[[32]byte]bool{}
		for _, c := range parseCerts(w.ClientConfig.CABundle) {
			here[fingerprint(c)] = true
		}
		for fp := range inAll {
			if !here[fp] {
				delete(inAll, fp)
			}
		}
	}
	now := r.now()
	for fp := range r.trustedSince {
		if !inAll[fp] {
			delete(r.trustedSince, fp)
		}
	}
	for fp := range inAll {
		if _, ok := r.trustedSince[fp]; !ok {
			r.trustedSince[fp] = now
		}
	}
}

// certState is the Secret's content, parsed. A part that is missing or does
// not parse is nil, and renew replaces it.
type certState struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	bundle []*x509.Certificate // the signing CA first
	pair   *tls.Certificate    // Leaf parsed
}

func parseState(data map[string][]byte) certState {
	var s certState
	if cas := parseCerts(data[SecretCACert]); len(cas) == 1 && cas[0].IsCA {
		if key, err := parseECKey(data[SecretCAKey]); err == nil && key.PublicKey.Equal(cas[0].PublicKey) {
			s.ca, s.caKey = cas[0], key
		}
	}
	s.bundle = parseCerts(data[SecretCABundle])
	if pair, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey]); err == nil && pair.Leaf != nil {
		s.pair = &pair
	}
	return s
}

func (s certState) leaf() *x509.Certificate {
	if s.pair == nil {
		return nil
	}
	return s.pair.Leaf
}

func (s certState) bundlePEM() []byte {
	var b []byte
	for _, c := range s.bundle {
		b = append(b, pemCert(c.Raw)...)
	}
	return b
}

// data encodes s as the Secret's values; s must be complete.
func (s certState) data() map[string][]byte {
	caKey, _ := x509.MarshalPKCS8PrivateKey(s.caKey) // an ECDSA key always marshals
	key, _ := x509.MarshalPKCS8PrivateKey(s.pair.PrivateKey)
	return map[string][]byte{
		SecretCACert:            pemCert(s.ca.Raw),
		SecretCAKey:             pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: caKey}),
		SecretCABundle:          s.bundlePEM(),
		corev1.TLSCertKey:       pemCert(s.pair.Leaf.Raw),
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}),
	}
}

// renewAt is when c is renewed: when a third of its lifetime is left.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotAfter.Add(-c.NotAfter.Sub(c.NotBefore) / 3)
}

// needsNewCA says whether the CA is replaced, and why.
func needsNewCA(ca *x509.Certificate, now time.Time) (bool, string) {
	switch {
	case ca == nil:
		return true, "no CA (or its key) in the secret"
	case !now.Before(renewAt(ca)):
		return true, "a third of the CA's lifetime is left"
	}
	return false, ""
}

// certCheck is what needsNewCert decides on.
type certCheck struct {
	leaf, ca *x509.Certificate   // served certificate, signing CA (non-nil)
	bundle   []*x509.Certificate // the CAs published in caBundle
	dnsNames []string
	now      time.Time
	// caTrustedFor is how long this replica has seen ca in every webhook's
	// caBundle; negative when it has not.
	caTrustedFor    time.Duration
	delay, interval time.Duration
}

// needsNewCert says whether the serving certificate is replaced, and why.
func needsNewCert(c certCheck) (bool, string) {
	if c.leaf == nil {
		return true, "no serving certificate (or key) in the secret"
	}
	if !slices.Equal(c.leaf.DNSNames, c.dnsNames) {
		return true, fmt.Sprintf("the certificate names %v, not %v", c.leaf.DNSNames, c.dnsNames)
	}
	if c.leaf.CheckSignatureFrom(c.ca) != nil {
		if !slices.ContainsFunc(c.bundle, func(ca *x509.Certificate) bool { return c.leaf.CheckSignatureFrom(ca) == nil }) {
			return true, "the certificate was signed by no CA of the bundle"
		}
		if c.caTrustedFor >= c.delay {
			return true, "the new CA is in caBundle: moving to it"
		}
		// Signed by an older CA the API server still trusts: wait for the
		// new one to be published, unless this certificate would expire
		// before the next two checks.
		if !c.now.Before(c.leaf.NotAfter.Add(-2 * c.interval)) {
			return true, "the certificate expires before the new CA is known to be trusted"
		}
		return false, ""
	}
	if !c.now.Before(renewAt(c.leaf)) {
		return true, "a third of the certificate's lifetime is left"
	}
	return false, ""
}

// bundleOf is ca followed by the other CAs of old that have not expired,
// latest expiry first.
func bundleOf(ca *x509.Certificate, old []*x509.Certificate, now time.Time) []*x509.Certificate {
	out := []*x509.Certificate{ca}
	var rest []*x509.Certificate
	for _, c := range old {
		if c.IsCA && now.Before(c.NotAfter) && !c.Equal(ca) && !slices.ContainsFunc(rest, c.Equal) {
			rest = append(rest, c)
		}
	}
	sort.SliceStable(rest, func(i, j int) bool { return rest[i].NotAfter.After(rest[j].NotAfter) })
	return append(out, rest...)
}

func sameCerts(a, b []*x509.Certificate) bool {
	return slices.EqualFunc(a, b, func(x, y *x509.Certificate) bool { return x.Equal(y) })
}

func fingerprint(c *x509.Certificate) [32]byte { return sha256.Sum256(c.Raw) }

// backdate is how long before its issue a certificate of the given lifetime
// starts, for clocks behind the webhook's.
func backdate(lifetime time.Duration) time.Duration { return min(lifetime/10, maxBackdate) }

func newCA(now time.Time, lifetime time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate rotator: CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "bulkhead-webhook-ca"},
		NotBefore:             now.Add(-backdate(lifetime)),
		NotAfter:              now.Add(lifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate rotator: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate rotator: CA: %w", err)
	}
	return ca, key, nil
}

// issueCert signs a serving certificate for dnsNames that ends with its
// lifetime or with the CA, whichever comes first.
func issueCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsNames []string, now time.Time, lifetime time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certificate rotator: serving key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(lifetime)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-backdate(lifetime)),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("certificate rotator: serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certificate rotator: serving certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certificate rotator: serial number: %w", err)
	}
	return serial, nil
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// parseCerts reads the certificates of a PEM bundle, skipping any block
// that is not one.
func parseCerts(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

func parseECKey(b []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	ec, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T key, not ECDSA", k)
	}
	return ec, nil
}
