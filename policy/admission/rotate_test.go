package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const (
	rotNamespace = "bulkhead-system"
	rotSecret    = "bulkhead-webhook-cert"
	rotConfig    = "bulkhead"
)

var rotDNSNames = ServiceDNSNames(rotNamespace, DefaultCertService)

// casSecrets keeps Secrets for the fake clientset with the API server's
// resourceVersion compare-and-swap on update (the fake's tracker does not
// check it), so that replicas race as they do in a cluster. It lists and
// watches them with field selectors, as the API server does.
type casSecrets struct {
	mu        sync.Mutex
	objs      map[string]*corev1.Secret
	rv        int
	updates   int
	conflicts int
	// beforeUpdate, when set, runs once before the next update is applied,
	// outside the lock: another replica's write landing in between.
	beforeUpdate func()
	watchers     []secretWatcher
	// listWatches are the lists and watches of every client on this store,
	// Secrets and webhook configurations: what RBAC has to allow.
	listWatches []listWatch
}

type secretWatcher struct {
	w         *watch.RaceFreeFakeWatcher
	namespace string
	fields    fields.Selector
}

// listWatch is one list or watch request, as RBAC sees it.
type listWatch struct{ verb, resource, namespace, fieldSelector string }

// note records a list or watch; s.mu is held.
func (s *casSecrets) note(action k8stesting.Action) {
	lw := listWatch{verb: action.GetVerb(), resource: action.GetResource().Resource, namespace: action.GetNamespace()}
	switch a := action.(type) {
	case k8stesting.ListAction:
		lw.fieldSelector = a.GetListRestrictions().Fields.String()
	case k8stesting.WatchAction:
		lw.fieldSelector = a.GetWatchRestrictions().Fields.String()
	}
	s.listWatches = append(s.listWatches, lw)
}

func (s *casSecrets) requests() []listWatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.listWatches)
}

func secretMatches(sec *corev1.Secret, namespace string, sel fields.Selector) bool {
	return (namespace == "" || sec.Namespace == namespace) &&
		sel.Matches(fields.Set{"metadata.name": sec.Name, "metadata.namespace": sec.Namespace})
}

// notify sends an event to the watchers the Secret matches; s.mu is held.
func (s *casSecrets) notify(t watch.EventType, sec *corev1.Secret) {
	s.watchers = slices.DeleteFunc(s.watchers, func(w secretWatcher) bool { return w.w.IsStopped() })
	for _, w := range s.watchers {
		if secretMatches(sec, w.namespace, w.fields) {
			w.w.Action(t, sec.DeepCopy())
		}
	}
}

func (s *casSecrets) watch(action k8stesting.Action) (bool, watch.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.note(action)
	w := watch.NewRaceFreeFake()
	s.watchers = append(s.watchers, secretWatcher{w: w, namespace: action.GetNamespace(), fields: action.(k8stesting.WatchAction).GetWatchRestrictions().Fields})
	return true, w, nil
}

var secretsResource = schema.GroupResource{Resource: "secrets"}

func (s *casSecrets) react(action k8stesting.Action) (bool, runtime.Object, error) {
	if action.GetVerb() == "update" {
		s.mu.Lock()
		hook := s.beforeUpdate
		s.beforeUpdate = nil
		s.mu.Unlock()
		if hook != nil {
			hook()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objs == nil {
		s.objs = map[string]*corev1.Secret{}
	}
	switch action.GetVerb() {
	case "get":
		name := action.(k8stesting.GetAction).GetName()
		sec, ok := s.objs[name]
		if !ok {
			return true, nil, apierrors.NewNotFound(secretsResource, name)
		}
		return true, sec.DeepCopy(), nil
	case "create":
		sec := action.(k8stesting.CreateAction).GetObject().(*corev1.Secret).DeepCopy()
		if _, ok := s.objs[sec.Name]; ok {
			return true, nil, apierrors.NewAlreadyExists(secretsResource, sec.Name)
		}
		s.rv++
		sec.ResourceVersion = strconv.Itoa(s.rv)
		s.objs[sec.Name] = sec
		s.notify(watch.Added, sec)
		return true, sec.DeepCopy(), nil
	case "list":
		s.note(action)
		sel := action.(k8stesting.ListAction).GetListRestrictions().Fields
		list := &corev1.SecretList{ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(s.rv)}}
		for _, sec := range s.objs {
			if secretMatches(sec, action.GetNamespace(), sel) {
				list.Items = append(list.Items, *sec.DeepCopy())
			}
		}
		return true, list, nil
	case "update":
		sec := action.(k8stesting.UpdateAction).GetObject().(*corev1.Secret).DeepCopy()
		cur, ok := s.objs[sec.Name]
		if !ok {
			return true, nil, apierrors.NewNotFound(secretsResource, sec.Name)
		}
		if sec.ResourceVersion != cur.ResourceVersion {
			s.conflicts++
			return true, nil, apierrors.NewConflict(secretsResource, sec.Name, fmt.Errorf("resourceVersion %s is not %s", sec.ResourceVersion, cur.ResourceVersion))
		}
		s.updates++
		s.rv++
		sec.ResourceVersion = strconv.Itoa(s.rv)
		s.objs[sec.Name] = sec
		s.notify(watch.Modified, sec)
		return true, sec.DeepCopy(), nil
	}
	return false, nil, nil
}

func (s *casSecrets) get(name string) *corev1.Secret {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.objs[name].DeepCopy()
}

func (s *casSecrets) counts() (updates, conflicts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates, s.conflicts
}

// rotationCluster is a fake clientset holding the webhook's configuration
// (two webhooks, both to be kept) and CAS Secrets.
func rotationCluster(t testing.TB) (*fake.Clientset, *casSecrets) {
	t.Helper()
	secrets := &casSecrets{}
	return clientWithSecrets(secrets), secrets
}

// clientWithSecrets is a fake clientset with its own configuration and the
// Secrets of store. The fake serialises its calls under one lock, reactors
// included: a replica that must write while another is inside a call needs
// a clientset of its own.
func clientWithSecrets(store *casSecrets) *fake.Clientset {
	svc := &admissionregistrationv1.ServiceReference{Namespace: rotNamespace, Name: DefaultCertService}
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: rotConfig},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "validate.bulkhead.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc, CABundle: []byte("\n")}},
			{Name: "claims.bulkhead.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}},
		},
	}
	client := fake.NewClientset(vwc)
	client.PrependReactor("*", "secrets", store.react)
	client.PrependWatchReactor("secrets", store.watch)
	// Lists and watches of the configuration are the tracker's, noted;
	// a watch is noted once the tracker holds it, so that a change made
	// after the note reaches it.
	vwcs := admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations")
	client.PrependReactor("list", "validatingwebhookconfigurations", func(action k8stesting.Action) (bool, runtime.Object, error) {
		store.mu.Lock()
		defer store.mu.Unlock()
		store.note(action)
		return false, nil, nil
	})
	client.PrependWatchReactor("validatingwebhookconfigurations", func(action k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(vwcs, action.GetNamespace())
		store.mu.Lock()
		defer store.mu.Unlock()
		store.note(action)
		return true, w, err
	})
	return client
}

// caBundles reads every webhook's caBundle, as the API server does.
func caBundles(t testing.TB, client *fake.Clientset) [][]byte {
	t.Helper()
	vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), rotConfig, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, w := range vwc.Webhooks {
		out = append(out, w.ClientConfig.CABundle)
	}
	return out
}

func newTestRotator(t testing.TB, client *fake.Clientset, certLifetime, caLifetime time.Duration) *Rotator {
	t.Helper()
	r, err := NewRotator(RotatorOptions{
		Client: client, Namespace: rotNamespace, Secret: rotSecret, WebhookConfig: rotConfig,
		DNSNames: rotDNSNames, CertLifetime: certLifetime, CALifetime: caLifetime,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rotationStats is what the clients saw.
type rotationStats struct {
	mu        sync.Mutex
	ok        int
	failures  []string
	serials   map[string]bool // serving certificates, by serial
	issuers   map[string]bool // CAs that signed them, by authority key id
	maxBundle int             // most CAs in one caBundle read
}

func (s *rotationStats) fail(msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failures) < 1000 {
		s.failures = append(s.failures, msg)
	}
}

func (s *rotationStats) seen() (ok, failures, serials, issuers, maxBundle int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ok, len(s.failures), len(s.serials), len(s.issuers), s.maxBundle
}

// reviewThroughBundle sends one AdmissionReview to addr the way the API
// server does: trusting only the caBundle the configuration holds now,
// dialling the Service's name, a new connection each time.
func reviewThroughBundle(t testing.TB, client *fake.Clientset, addr string, body []byte, stats *rotationStats) {
	bundles := caBundles(t, client)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundles[0]) {
		stats.fail("caBundle holds no certificate")
		return
	}
	for i, b := range bundles[1:] {
		if !bytes.Equal(b, bundles[0]) {
			stats.fail(fmt.Sprintf("webhook %d has another caBundle than webhook 0", i+1))
			return
		}
	}
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: rotDNSNames[0], MinVersion: tls.VersionTLS12},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Post("https://"+addr+PathValidate, "application/json", bytes.NewReader(body))
	if err != nil {
		stats.fail(err.Error())
		return
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		stats.fail(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b))
		return
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil || !out.Response.Allowed {
		stats.fail(fmt.Sprintf("review not allowed: %v %+v", err, out.Response))
		return
	}
	leaf := resp.TLS.PeerCertificates[0]
	stats.mu.Lock()
	defer stats.mu.Unlock()
	stats.ok++
	stats.serials[leaf.SerialNumber.String()] = true
	stats.issuers[hex.EncodeToString(leaf.AuthorityKeyId)] = true
	stats.maxBundle = max(stats.maxBundle, len(parseCerts(bundles[0])))
}

// TestRotationUnderLoad runs replicas of the real HTTPS server, each with
// its rotator, against one (fake) API server while clients review pods
// without pause through the caBundle of the moment: serving certificates
// (and, in one case, the CA) rotate several times and no review fails.
func TestRotationUnderLoad(t *testing.T) {
	tests := []struct {
		name                   string
		certLifetime, caLifete time.Duration
		replicas, clients      int
		wantCerts, wantCAs     int // distinct ones served to the clients
	}{
		{name: "serving certificate", certLifetime: 3 * time.Second, caLifete: time.Hour, replicas: 2, clients: 4, wantCerts: 3, wantCAs: 1},
		{name: "CA", certLifetime: 2 * time.Second, caLifete: 6 * time.Second, replicas: 2, clients: 4, wantCerts: 3, wantCAs: 2},
	}
	engine := openEngine(t)
	body, _ := readReview(t, "pod-allowed.json")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, secrets := rotationCluster(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var serving sync.WaitGroup
			var rotators []*Rotator
			var addrs []string
			for range tt.replicas {
				r := newTestRotator(t, client, tt.certLifetime, tt.caLifete)
				if err := r.Sync(ctx); err != nil {
					t.Fatalf("first Sync: %v", err)
				}
				rev, err := NewReviewer(Options{Decider: engine})
				if err != nil {
					t.Fatal(err)
				}
				h, err := Handler(HandlerOptions{Reviewer: rev})
				if err != nil {
					t.Fatal(err)
				}
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				serving.Add(2)
				go func() {
					defer serving.Done()
					if err := Serve(ctx, ServeOptions{Listener: ln, Certs: r.Certs(), Handler: h}); err != nil {
						t.Errorf("Serve: %v", err)
					}
				}()
				go func() {
					defer serving.Done()
					_ = r.Run(ctx)
				}()
				rotators = append(rotators, r)
				addrs = append(addrs, ln.Addr().String())
			}

			stats := &rotationStats{serials: map[string]bool{}, issuers: map[string]bool{}}
			var stop atomic.Bool
			var load sync.WaitGroup
			for i := range tt.clients {
				load.Go(func() {
					for n := i; !stop.Load(); n++ {
						reviewThroughBundle(t, client, addrs[n%len(addrs)], body, stats)
					}
				})
			}
			// Wait for the rotations, bounded: the certificates' own
			// lifetimes set the pace.
			wait, done := context.WithTimeout(ctx, 90*time.Second)
			defer done()
			poll := time.NewTicker(20 * time.Millisecond)
			defer poll.Stop()
			for {
				_, failures, serials, issuers, _ := stats.seen()
				if (serials >= tt.wantCerts && issuers >= tt.wantCAs) || failures > 0 {
					break
				}
				select {
				case <-wait.Done():
				case <-poll.C:
					continue
				}
				break
			}
			stop.Store(true)
			load.Wait()
			ok, failures, serials, issuers, maxBundle := stats.seen()
			updates, conflicts := secrets.counts()
			t.Logf("%d reviews, %d failed; %d serving certificates from %d CAs; at most %d CAs in caBundle; %d secret writes, %d lost races",
				ok, failures, serials, issuers, maxBundle, updates, conflicts)
			if failures > 0 {
				t.Errorf("%d reviews failed during rotation; first: %s", failures, stats.failures[0])
			}
			if serials < tt.wantCerts || issuers < tt.wantCAs {
				t.Errorf("clients saw %d serving certificates from %d CAs, want at least %d from %d", serials, issuers, tt.wantCerts, tt.wantCAs)
			}
			if tt.wantCAs > 1 && maxBundle < 2 {
				t.Errorf("caBundle never held the old and the new CA together (at most %d)", maxBundle)
			}
			cancel()
			serving.Wait()

			// The replicas converge on the Secret's pair.
			for i, r := range rotators {
				if err := r.Sync(context.Background()); err != nil {
					t.Fatalf("replica %d: Sync: %v", i, err)
				}
			}
			want := parseState(secrets.get(rotSecret).Data).leaf()
			for i, r := range rotators {
				if got := r.Certs().served(); got == nil || !got.Equal(want) {
					t.Errorf("replica %d serves another certificate than the Secret's", i)
				}
			}
		})
	}
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestRotatorCALifecycle walks a CA rotation step by step on a hand-moved
// clock: the new CA is published beside the old one before it signs the
// served certificate, and the old one leaves caBundle once expired.
func TestRotatorCALifecycle(t *testing.T) {
	ctx := context.Background()
	client, secrets := rotationCluster(t)
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := newTestRotator(t, client, time.Hour, 3*time.Hour)
	r.now = clock.Now
	state := func() certState { return parseState(secrets.get(rotSecret).Data) }
	bundleCAs := func() []*x509.Certificate {
		bundles := caBundles(t, client)
		for _, b := range bundles[1:] {
			if !bytes.Equal(b, bundles[0]) {
				t.Fatal("the webhooks' caBundles differ")
			}
		}
		return parseCerts(bundles[0])
	}
	step := func() certState {
		t.Helper()
		if err := r.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		s := state()
		if got := r.Certs().served(); !got.Equal(s.leaf()) {
			t.Fatal("the rotator serves another certificate than the Secret's")
		}
		return s
	}

	s0 := step()
	if n := len(bundleCAs()); n != 1 || !bundleCAs()[0].Equal(s0.ca) {
		t.Fatalf("first caBundle: %d CAs, want the Secret's CA", n)
	}
	if s0.leaf().CheckSignatureFrom(s0.ca) != nil {
		t.Fatal("the first serving certificate is not signed by the CA")
	}

	// Just before two thirds of the CA's life: the serving certificate
	// was renewed by the old CA. Just after: a new CA is made and published
	// beside the old one, and the served certificate is still the old CA's.
	clock.now = renewAt(s0.ca).Add(-time.Minute)
	if !step().ca.Equal(s0.ca) {
		t.Fatal("the CA was renewed early")
	}
	clock.now = renewAt(s0.ca).Add(time.Second)
	s1 := step()
	if s1.ca.Equal(s0.ca) {
		t.Fatal("the CA was not renewed")
	}
	if cas := bundleCAs(); len(cas) != 2 || !cas[0].Equal(s1.ca) || !cas[1].Equal(s0.ca) {
		t.Fatalf("caBundle after CA renewal: %d CAs, want the new then the old", len(cas))
	}
	if s1.leaf().CheckSignatureFrom(s0.ca) != nil {
		t.Fatal("a certificate of the new CA is served before the CA was published")
	}

	// Published, but not yet for PropagationDelay: still the old CA's.
	s2 := step()
	if !s2.leaf().Equal(s1.leaf()) {
		t.Fatal("the certificate moved to the new CA before PropagationDelay")
	}
	// Someone (a replica that read the Secret before the new CA) puts the
	// old bundle back: the delay starts over when the new CA returns.
	vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, rotConfig, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vwc.Webhooks[1].ClientConfig.CABundle = pemCert(s0.ca.Raw)
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	clock.advance(r.opts.PropagationDelay)
	if !step().leaf().Equal(s1.leaf()) {
		t.Fatal("the certificate moved to a CA that one webhook's caBundle lacked")
	}
	if n := len(bundleCAs()); n != 2 {
		t.Fatalf("caBundle not published again: %d CAs", n)
	}
	clock.advance(r.opts.PropagationDelay)
	s3 := step()
	if s3.leaf().CheckSignatureFrom(s1.ca) != nil {
		t.Fatal("the certificate did not move to the new CA after PropagationDelay")
	}

	// The old CA expires: it leaves the bundle.
	clock.now = s0.ca.NotAfter.Add(time.Second)
	step()
	if cas := bundleCAs(); len(cas) != 1 || !cas[0].Equal(s1.ca) {
		t.Fatalf("caBundle after the old CA expired: %d CAs, want the new one alone", len(cas))
	}
}

// TestRotatorReplicaLosesRace: two replicas decide to renew at once; the
// one whose write comes second gets a conflict, reads the winner's Secret
// and serves its certificate instead of writing its own.
func TestRotatorReplicaLosesRace(t *testing.T) {
	ctx := context.Background()
	client, secrets := rotationCluster(t)
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := newTestRotator(t, clientWithSecrets(secrets), time.Hour, 24*time.Hour)
	b := newTestRotator(t, client, time.Hour, 24*time.Hour)
	a.now, b.now = clock.Now, clock.Now
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	first := a.Certs().served()
	if !b.Certs().served().Equal(first) {
		t.Fatal("the second replica does not serve the first one's certificate")
	}
	clock.now = renewAt(first).Add(time.Second)
	// A's write lands between B's read and B's write.
	secrets.mu.Lock()
	secrets.beforeUpdate = func() {
		if err := a.Sync(ctx); err != nil {
			t.Error(err)
		}
	}
	secrets.mu.Unlock()
	_, conflictsBefore := secrets.counts()
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	updates, conflicts := secrets.counts()
	if conflicts != conflictsBefore+1 {
		t.Fatalf("%d lost races, want 1", conflicts-conflictsBefore)
	}
	won := a.Certs().served()
	if won.Equal(first) {
		t.Fatal("replica A did not renew")
	}
	if !b.Certs().served().Equal(won) {
		t.Error("replica B serves its own certificate, not the winner's")
	}
	if got := parseState(secrets.get(rotSecret).Data).leaf(); !got.Equal(won) {
		t.Error("the Secret does not hold the winner's certificate")
	}
	t.Logf("%d secret writes, %d lost races", updates, conflicts)
}

// TestRotatorRepairsSecretAndBundle: a Secret with a broken CA or serving
// pair is repaired, and a caBundle reset by someone (kubectl apply of a
// placeholder) is published again.
func TestRotatorRepairsSecretAndBundle(t *testing.T) {
	ctx := context.Background()
	client, secrets := rotationCluster(t)
	r := newTestRotator(t, client, time.Hour, 24*time.Hour)
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	s0 := parseState(secrets.get(rotSecret).Data)

	// Someone resets caBundle.
	vwc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, rotConfig, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vwc.Webhooks[1].ClientConfig.CABundle = []byte("Cg==")
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for i, b := range caBundles(t, client) {
		if !bytes.Equal(b, s0.bundlePEM()) {
			t.Errorf("webhook %d: caBundle not published again", i)
		}
	}
	if n := r.repairs.Load(); n != 1 {
		t.Errorf("%d caBundle repairs counted, want 1", n)
	}

	tests := []struct {
		name          string
		key, value    string
		wantNewCA     bool
		wantNewLeaf   bool
		wantOldBundle bool // the previous CA stays trusted
	}{
		{name: "serving key garbled", key: corev1.TLSPrivateKeyKey, value: "garbage", wantNewLeaf: true},
		{name: "serving certificate removed", key: corev1.TLSCertKey, value: "", wantNewLeaf: true},
		// The served certificate's CA stays trusted in the bundle: it is
		// kept until the new CA has been published for PropagationDelay.
		{name: "CA key garbled", key: SecretCAKey, value: "garbage", wantNewCA: true, wantOldBundle: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := parseState(secrets.get(rotSecret).Data)
			secrets.mu.Lock()
			secrets.objs[rotSecret].Data[tt.key] = []byte(tt.value)
			secrets.mu.Unlock()
			if err := r.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			after := parseState(secrets.get(rotSecret).Data)
			if after.ca == nil || after.leaf() == nil {
				t.Fatal("the Secret was not repaired")
			}
			if got := !after.ca.Equal(before.ca); got != tt.wantNewCA {
				t.Errorf("new CA: %v, want %v", got, tt.wantNewCA)
			}
			if got := !after.leaf().Equal(before.leaf()); got != tt.wantNewLeaf {
				t.Errorf("new serving certificate: %v, want %v", got, tt.wantNewLeaf)
			}
			if got := len(after.bundle) == 2 && after.bundle[1].Equal(before.ca); got != tt.wantOldBundle {
				t.Errorf("previous CA still in the bundle: %v, want %v", got, tt.wantOldBundle)
			}
			if !r.Certs().served().Equal(after.leaf()) {
				t.Error("the repaired certificate is not served")
			}
		})
	}
}

// TestRotatorRenewalDecision is the table of when a CA and a serving
// certificate are renewed, on the certificates' own times.
func TestRotatorRenewalDecision(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mustCA := func() (*x509.Certificate, *ecdsa.PrivateKey) {
		ca, key, err := newCA(t0, 30*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return ca, key
	}
	ca, caKey := mustCA()
	oldCA, oldKey := mustCA()
	stranger, strangerKey := mustCA()
	issue := func(signer *x509.Certificate, key *ecdsa.PrivateKey, names []string) *x509.Certificate {
		pair, err := issueCert(signer, key, names, t0, 9*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return pair.Leaf
	}
	leaf := issue(ca, caKey, rotDNSNames)
	oldLeaf := issue(oldCA, oldKey, rotDNSNames)
	strangerLeaf := issue(stranger, strangerKey, rotDNSNames)
	misnamed := issue(ca, caKey, []string{"other.bulkhead-system.svc"})
	const delay, interval = time.Minute, time.Minute

	t.Run("CA", func(t *testing.T) {
		tests := []struct {
			name string
			ca   *x509.Certificate
			now  time.Time
			want bool
		}{
			{name: "none", ca: nil, now: t0, want: true},
			{name: "new", ca: ca, now: t0},
			{name: "just before two thirds", ca: ca, now: renewAt(ca).Add(-time.Second)},
			{name: "at two thirds", ca: ca, now: renewAt(ca), want: true},
			{name: "expired", ca: ca, now: ca.NotAfter.Add(time.Hour), want: true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got, why := needsNewCA(tt.ca, tt.now); got != tt.want {
					t.Errorf("needsNewCA = %v (%s), want %v", got, why, tt.want)
				}
			})
		}
	})

	t.Run("serving certificate", func(t *testing.T) {
		both := []*x509.Certificate{ca, oldCA}
		tests := []struct {
			name       string
			leaf       *x509.Certificate
			now        time.Time
			trustedFor time.Duration
			want       bool
		}{
			{name: "none", leaf: nil, now: t0, want: true},
			{name: "new", leaf: leaf, now: t0},
			{name: "just before two thirds", leaf: leaf, now: renewAt(leaf).Add(-time.Second)},
			{name: "at two thirds", leaf: leaf, now: renewAt(leaf), want: true},
			{name: "expired", leaf: leaf, now: leaf.NotAfter.Add(time.Second), want: true},
			{name: "other names", leaf: misnamed, now: t0, want: true},
			{name: "old CA, new CA not yet in caBundle", leaf: oldLeaf, now: t0, trustedFor: -1},
			{name: "old CA, new CA in caBundle under the delay", leaf: oldLeaf, now: t0, trustedFor: delay - time.Second},
			{name: "old CA, new CA in caBundle for the delay", leaf: oldLeaf, now: t0, trustedFor: delay, want: true},
			{name: "old CA due, new CA not yet trusted", leaf: oldLeaf, now: renewAt(oldLeaf), trustedFor: -1},
			{name: "old CA about to expire, new CA not yet trusted", leaf: oldLeaf, now: oldLeaf.NotAfter.Add(-2 * interval), trustedFor: -1, want: true},
			{name: "signed by no CA of the bundle", leaf: strangerLeaf, now: t0, trustedFor: -1, want: true},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, why := needsNewCert(certCheck{
					leaf: tt.leaf, ca: ca, bundle: both, dnsNames: rotDNSNames, now: tt.now,
					caTrustedFor: tt.trustedFor, delay: delay, interval: interval,
				})
				if got != tt.want {
					t.Errorf("needsNewCert = %v (%s), want %v", got, why, tt.want)
				}
			})
		}
	})
}

// TestParseFlagsCertRotation: the rotator's flags, and files or rotator,
// never both; each refusal names the flag and the rule.
func TestParseFlagsCertRotation(t *testing.T) {
	base := []string{"--bundle=b", "--insecure-skip-verification"}
	files := []string{"--tls-cert=c", "--tls-key=k"}
	rotate := []string{"--cert-secret=bulkhead-system/bulkhead-webhook-cert", "--webhook-config=bulkhead"}
	tests := []struct {
		name string
		args []string
		want string // error substring; empty: accepted
	}{
		{name: "files", args: files},
		{name: "rotator", args: rotate},
		{name: "rotator with lifetimes", args: append(rotate[:2:2], "--cert-lifetime=3s", "--ca-lifetime=9s", "--cert-service=hook")},
		{name: "neither", args: nil, want: "--tls-cert and --tls-key are required"},
		{name: "both", args: append(files[:2:2], rotate...), want: "--cert-secret and --tls-cert/--tls-key: choose one"},
		{name: "no webhook config", args: []string{"--cert-secret=ns/name"}, want: "--webhook-config is required with --cert-secret"},
		{name: "webhook config alone", args: append(files[:2:2], "--webhook-config=bulkhead"), want: "--webhook-config needs --cert-secret"},
		{name: "lifetime alone", args: append(files[:2:2], "--cert-lifetime=1h"), want: "--cert-lifetime needs --cert-secret"},
		{name: "secret without namespace", args: []string{"--cert-secret=name", "--webhook-config=bulkhead"}, want: `--cert-secret "name": must be NAMESPACE/NAME`},
		{name: "secret with empty name", args: []string{"--cert-secret=ns/", "--webhook-config=bulkhead"}, want: "must be NAMESPACE/NAME"},
		{name: "bad namespace", args: []string{"--cert-secret=Bad_NS/name", "--webhook-config=bulkhead"}, want: `namespace "Bad_NS"`},
		{name: "bad secret name", args: []string{"--cert-secret=ns/Name!", "--webhook-config=bulkhead"}, want: `name "Name!"`},
		{name: "bad webhook config", args: []string{"--cert-secret=ns/n", "--webhook-config=Bad!"}, want: `--webhook-config "Bad!"`},
		{name: "bad service", args: append(rotate[:2:2], "--cert-service=9svc"), want: `--cert-service "9svc"`},
		{name: "lifetime too short", args: append(rotate[:2:2], "--cert-lifetime=500ms"), want: "--cert-lifetime 500ms: must be at least 1s"},
		{name: "CA too short", args: append(rotate[:2:2], "--cert-lifetime=1h", "--ca-lifetime=2h"), want: "--ca-lifetime 2h0m0s: must be at least 3 × --cert-lifetime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFlags(append(append([]string{}, base...), tt.args...), io.Discard)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestNewRotatorOptions: options are checked up front, each error naming
// the field and the rule.
func TestNewRotatorOptions(t *testing.T) {
	client, _ := rotationCluster(t)
	good := func() RotatorOptions {
		return RotatorOptions{Client: client, Namespace: rotNamespace, Secret: rotSecret, WebhookConfig: rotConfig, DNSNames: rotDNSNames}
	}
	tests := []struct {
		name   string
		modify func(*RotatorOptions)
		want   string
	}{
		{name: "defaults", modify: func(*RotatorOptions) {}},
		{name: "no client", modify: func(o *RotatorOptions) { o.Client = nil }, want: "Client is required"},
		{name: "no secret", modify: func(o *RotatorOptions) { o.Secret = "" }, want: "Namespace and Secret are required"},
		{name: "no webhook config", modify: func(o *RotatorOptions) { o.WebhookConfig = "" }, want: "WebhookConfig is required"},
		{name: "no names", modify: func(o *RotatorOptions) { o.DNSNames = nil }, want: "DNSNames: at least one"},
		{name: "bad name", modify: func(o *RotatorOptions) { o.DNSNames = []string{"a_b"} }, want: `DNSNames "a_b"`},
		{name: "short lifetime", modify: func(o *RotatorOptions) { o.CertLifetime = time.Millisecond }, want: "CertLifetime 1ms: must be at least 1s"},
		{name: "short CA", modify: func(o *RotatorOptions) { o.CertLifetime, o.CALifetime = time.Hour, 2*time.Hour }, want: "CALifetime 2h0m0s: must be at least 3 × CertLifetime"},
		{name: "negative interval", modify: func(o *RotatorOptions) { o.Interval = -time.Second }, want: "must not be negative"},
		{name: "negative resync", modify: func(o *RotatorOptions) { o.Resync = -time.Second }, want: "Resync -1s must not be negative"},
		{name: "slow checks", modify: func(o *RotatorOptions) { o.CertLifetime, o.Interval = time.Hour, 20*time.Minute }, want: "must stay under CertLifetime/3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good()
			tt.modify(&o)
			_, err := NewRotator(o)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestRotatorCertsBeforeFirstSync: nothing is served before the first
// Sync (a handshake fails rather than presenting no certificate), and the
// expiry metric reads the rotated certificate.
func TestRotatorCertsBeforeFirstSync(t *testing.T) {
	client, _ := rotationCluster(t)
	r := newTestRotator(t, client, time.Hour, 24*time.Hour)
	if _, err := r.Certs().GetCertificate(nil); err == nil {
		t.Fatal("a certificate was served before the first Sync")
	}
	if err := r.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	got, err := r.Certs().GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Certs().NotAfter().Equal(got.Leaf.NotAfter) || got.Leaf.NotAfter.IsZero() {
		t.Errorf("NotAfter %v, want the served certificate's %v", r.Certs().NotAfter(), got.Leaf.NotAfter)
	}
}

// counterValue reads a counter of m's registry by name and label set.
func counterValue(t testing.TB, m *Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return metric.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// timeUntil polls done until it holds and says how long that took, or
// fails the test after limit: a bound against hanging, far below the
// Interval and Resync that could also have made done hold.
func timeUntil(t *testing.T, limit time.Duration, what string, done func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !done() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not after %v", what, limit)
		}
		time.Sleep(100 * time.Microsecond)
	}
	return time.Since(start)
}

// TestRotatorWatchWritesBack: with Run watching, a caBundle someone removed
// or changed is written back, and another replica's new certificate is
// served, as soon as the watch reports it. Interval and Resync are a day,
// so only the watches can have acted. Every list and watch names its one
// object (a field selector on metadata.name), which is what lets RBAC's
// resourceNames allow them.
func TestRotatorWatchWritesBack(t *testing.T) {
	client, secrets := rotationCluster(t)
	r, err := NewRotator(RotatorOptions{
		Client: client, Namespace: rotNamespace, Secret: rotSecret, WebhookConfig: rotConfig,
		DNSNames: rotDNSNames, Interval: 24 * time.Hour, Resync: 24 * time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	m.WatchRotator(r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var running sync.WaitGroup
	running.Go(func() {
		if err := r.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	defer running.Wait()
	defer cancel()
	watching := func(resource string) bool {
		return slices.ContainsFunc(secrets.requests(), func(lw listWatch) bool { return lw.verb == "watch" && lw.resource == resource })
	}
	timeUntil(t, 10*time.Second, "the rotator watches", func() bool {
		return watching("secrets") && watching("validatingwebhookconfigurations")
	})

	state := parseState(secrets.get(rotSecret).Data)
	bundle := state.bundlePEM()
	oldCA, _, err := newCA(time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	configs := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	tests := []struct {
		name  string
		reset func(webhooks []admissionregistrationv1.ValidatingWebhook)
	}{
		{name: "removed from every webhook (kubectl apply over a pre-rotator install)", reset: func(w []admissionregistrationv1.ValidatingWebhook) {
			for i := range w {
				w[i].ClientConfig.CABundle = nil
			}
		}},
		{name: "one webhook's set to a placeholder", reset: func(w []admissionregistrationv1.ValidatingWebhook) {
			w[1].ClientConfig.CABundle = []byte("\n")
		}},
		{name: "replaced by another CA", reset: func(w []admissionregistrationv1.ValidatingWebhook) {
			for i := range w {
				w[i].ClientConfig.CABundle = pemCert(oldCA.Raw)
			}
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vwc, err := configs.Get(ctx, rotConfig, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tt.reset(vwc.Webhooks)
			if _, err := configs.Update(ctx, vwc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			took := timeUntil(t, 10*time.Second, "caBundle written back", func() bool {
				return !slices.ContainsFunc(caBundles(t, client), func(b []byte) bool { return !bytes.Equal(b, bundle) })
			})
			t.Logf("written back %v after the reset", took)
			if got := counterValue(t, m, "bulkhead_webhook_cabundle_repairs_total", nil); got != float64(i+1) {
				t.Errorf("bulkhead_webhook_cabundle_repairs_total = %v, want %d", got, i+1)
			}
		})
	}

	t.Run("another replica renews the serving certificate", func(t *testing.T) {
		pair, err := issueCert(state.ca, state.caKey, rotDNSNames, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		renewed := state
		renewed.pair = pair
		sec := secrets.get(rotSecret)
		sec.Data = renewed.data()
		if _, err := client.CoreV1().Secrets(rotNamespace).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		took := timeUntil(t, 10*time.Second, "the other replica's certificate served", func() bool {
			return r.Certs().served().Equal(pair.Leaf)
		})
		t.Logf("served %v after the other replica's write", took)
	})

	// This replica issued the Secret's first CA and certificate, and
	// nothing since (the renewal above was another replica's).
	for kind, want := range map[string]float64{RotationCA: 1, RotationServing: 1} {
		if got := counterValue(t, m, "bulkhead_webhook_certificate_rotations_total", map[string]string{"kind": kind}); got != want {
			t.Errorf("bulkhead_webhook_certificate_rotations_total{kind=%q} = %v, want %v", kind, got, want)
		}
	}
	for _, lw := range secrets.requests() {
		want := listWatch{verb: lw.verb, resource: "secrets", namespace: rotNamespace, fieldSelector: "metadata.name=" + rotSecret}
		if lw.resource == "validatingwebhookconfigurations" {
			want = listWatch{verb: lw.verb, resource: lw.resource, fieldSelector: "metadata.name=" + rotConfig}
		}
		if lw != want {
			t.Errorf("%+v: want %+v, the one object RBAC allows by name", lw, want)
		}
	}
}

// TestRotatorKeepsCAsOfASeededBundle: a Secret that holds only a bundle
// (seeded by hand before the first start, with the CA of the certificates
// that serve until then) keeps that bundle's CAs beside the new one until
// they expire, so that replicas of the previous release stay trusted.
func TestRotatorKeepsCAsOfASeededBundle(t *testing.T) {
	now := time.Now()
	mustCA := func(notBefore time.Time, lifetime time.Duration) *x509.Certificate {
		ca, _, err := newCA(notBefore, lifetime)
		if err != nil {
			t.Fatal(err)
		}
		return ca
	}
	previous, other := mustCA(now, 24*time.Hour), mustCA(now, 48*time.Hour)
	leaf := func() *x509.Certificate {
		signer, key, err := newCA(now, 24*time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := issueCert(signer, key, rotDNSNames, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return pair.Leaf
	}()
	tests := []struct {
		name string
		seed *x509.Certificate
		kept bool
	}{
		{name: "the previous release's CA", seed: previous, kept: true},
		{name: "a CA that outlives the new one", seed: other, kept: true},
		{name: "an expired CA", seed: mustCA(now.Add(-48*time.Hour), 24*time.Hour)},
		{name: "not a CA", seed: leaf},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, secrets := rotationCluster(t)
			seeded := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: rotSecret, Namespace: rotNamespace},
				Data:       map[string][]byte{SecretCABundle: pemCert(tt.seed.Raw)},
			}
			if _, err := client.CoreV1().Secrets(rotNamespace).Create(context.Background(), seeded, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			r := newTestRotator(t, client, time.Hour, 24*time.Hour)
			if err := r.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			s := parseState(secrets.get(rotSecret).Data)
			if s.ca == nil || s.ca.Equal(tt.seed) || s.leaf().CheckSignatureFrom(s.ca) != nil {
				t.Fatal("no new CA signs the served certificate")
			}
			published := parseCerts(caBundles(t, client)[0])
			if got := slices.ContainsFunc(published, tt.seed.Equal); got != tt.kept {
				t.Errorf("seeded certificate in caBundle: %v, want %v", got, tt.kept)
			}
			if !published[0].Equal(s.ca) {
				t.Error("the new CA is not first in caBundle")
			}
		})
	}
}
