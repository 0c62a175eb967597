package admission

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
)

// casConfigMaps stands in for the API server's storage of ConfigMaps in a
// fake clientset: resourceVersions, and an update whose resourceVersion is
// not the stored one fails with a conflict, as etcd's compare and swap
// does. (The fake clientset's own tracker ignores resourceVersions.) Every
// injectEvery-th update fails with a conflict even when it would succeed.
type casConfigMaps struct {
	injectEvery int

	// mu guards everything below.
	mu        sync.Mutex
	rv        int
	objs      map[string]*corev1.ConfigMap
	updates   int
	creates   int // creates refused because the ledger exists
	conflicts int // updates refused on a stale resourceVersion
	injected  int // updates refused by injection
}

var configMapsResource = schema.GroupResource{Resource: "configmaps"}

func (s *casConfigMaps) react(action k8stesting.Action) (bool, runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objs == nil {
		s.objs = map[string]*corev1.ConfigMap{}
	}
	switch action.GetVerb() {
	case "get":
		name := action.(k8stesting.GetAction).GetName()
		cm, ok := s.objs[name]
		if !ok {
			return true, nil, apierrors.NewNotFound(configMapsResource, name)
		}
		return true, cm.DeepCopy(), nil
	case "list":
		list := &corev1.ConfigMapList{}
		for _, cm := range s.objs {
			list.Items = append(list.Items, *cm.DeepCopy())
		}
		return true, list, nil
	case "create":
		cm := action.(k8stesting.CreateAction).GetObject().(*corev1.ConfigMap).DeepCopy()
		if _, ok := s.objs[cm.Name]; ok {
			s.creates++
			return true, nil, apierrors.NewAlreadyExists(configMapsResource, cm.Name)
		}
		s.rv++
		cm.ResourceVersion = strconv.Itoa(s.rv)
		s.objs[cm.Name] = cm
		return true, cm.DeepCopy(), nil
	case "update":
		cm := action.(k8stesting.UpdateAction).GetObject().(*corev1.ConfigMap).DeepCopy()
		cur, ok := s.objs[cm.Name]
		if !ok {
			return true, nil, apierrors.NewNotFound(configMapsResource, cm.Name)
		}
		s.updates++
		if s.injectEvery > 0 && s.updates%s.injectEvery == 0 {
			s.injected++
			return true, nil, apierrors.NewConflict(configMapsResource, cm.Name, fmt.Errorf("injected conflict"))
		}
		if cm.ResourceVersion != cur.ResourceVersion {
			s.conflicts++
			return true, nil, apierrors.NewConflict(configMapsResource, cm.Name, fmt.Errorf("resourceVersion %s is not %s", cm.ResourceVersion, cur.ResourceVersion))
		}
		s.rv++
		cm.ResourceVersion = strconv.Itoa(s.rv)
		s.objs[cm.Name] = cm
		return true, cm.DeepCopy(), nil
	}
	return false, nil, nil
}

// entries returns the reservations of ledger name by UID.
func (s *casConfigMaps) entries(name string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cm, ok := s.objs[name]; ok {
		out := map[string]string{}
		for k, v := range cm.Data {
			out[k] = v
		}
		return out
	}
	return nil
}

func (s *casConfigMaps) counts() (updates, creates, conflicts, injected int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates, s.creates, s.conflicts, s.injected
}

// slowReads answers ConfigMap gets a little late, outside the fake
// clientset's lock (which serialises every call), so that concurrent
// reviews overlap between their read and their write as they do against
// a real API server.
type slowReads struct {
	*fake.Clientset
	delay time.Duration
}

func (c slowReads) CoreV1() corev1client.CoreV1Interface {
	return slowCoreV1{c.Clientset.CoreV1(), c.delay}
}

type slowCoreV1 struct {
	corev1client.CoreV1Interface
	delay time.Duration
}

func (c slowCoreV1) ConfigMaps(ns string) corev1client.ConfigMapInterface {
	return slowConfigMaps{c.CoreV1Interface.ConfigMaps(ns), c.delay}
}

type slowConfigMaps struct {
	corev1client.ConfigMapInterface
	delay time.Duration
}

func (c slowConfigMaps) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error) {
	cm, err := c.ConfigMapInterface.Get(ctx, name, opts)
	time.Sleep(c.delay)
	return cm, err
}

// quotaReviewer is a Reviewer deciding on a quota ledger kept in client's
// ConfigMaps, without informers: the ledger alone counts the pods.
func quotaReviewer(t *testing.T, client *fake.Clientset) *Reviewer {
	t.Helper()
	ledger, err := NewQuotaLedger(QuotaLedgerOptions{Client: client, Namespace: "bulkhead-system"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Quota: ledger})
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// replica is one webhook instance: its own informers, ledger and Reviewer.
type replica struct {
	cluster *Cluster
	ledger  *QuotaLedger
	rev     *Reviewer
}

func newReplica(t *testing.T, ctx context.Context, client *fake.Clientset, now func() time.Time) replica {
	t.Helper()
	cluster, err := NewCluster(client)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := NewQuotaLedger(QuotaLedgerOptions{
		Client: slowReads{client, time.Millisecond}, Namespace: "bulkhead-system", Pods: cluster.Usage, PodInformer: cluster.Pods, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Handlers: cluster.Handlers, Quota: ledger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ledger.Start(ctx, rev) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ledger.Start: %v", err)
		}
	})
	return replica{cluster: cluster, ledger: ledger, rev: rev}
}

// TestQuotaLedgerHoldsUnderBursts: two webhook replicas answer 20 pods of
// the agents tenant (quota: 3 sandboxes) at once, while the API server
// refuses some of their writes with conflicts. Exactly 3 are admitted.
// Deleting one admits one more; a pod admitted but never created stops
// counting after the grace period.
func TestQuotaLedgerHoldsUnderBursts(t *testing.T) {
	client := fake.NewClientset()
	store := &casConfigMaps{injectEvery: 3}
	client.PrependReactor("*", "configmaps", store.react)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC).Unix())
	now := func() time.Time { return time.Unix(clock.Load(), 0) }
	replicas := []replica{newReplica(t, ctx, client, now), newReplica(t, ctx, client, now)}
	const ledgerOfAgents = "bulkhead-quota-t-agents"

	review := func(rep replica, p *corev1.Pod) *admissionv1.AdmissionResponse {
		return rep.rev.Review(ctx, podRequest(t, admissionv1.Create, p))
	}
	burstPod := func(i int) *corev1.Pod {
		ns := []string{"agents", "agents-batch"}[i%2] // both namespaces are tenant agents
		return testPod(ns, fmt.Sprintf("burst-%d", i), fmt.Sprintf("uid-burst-%d", i), "", "1Gi", "")
	}

	// The burst.
	const n = 20
	resps := make([]*admissionv1.AdmissionResponse, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resps[i] = review(replicas[i%2], burstPod(i))
		}()
	}
	close(start)
	wg.Wait()
	var admitted []*corev1.Pod
	for i, resp := range resps {
		switch {
		case resp.Allowed:
			admitted = append(admitted, burstPod(i))
		case !strings.Contains(resp.Result.Message, `[quota.sandboxes] tenant "agents" runs 3 sandboxes`):
			t.Errorf("pod %d refused for another reason than the quota: %s", i, resp.Result.Message)
		}
	}
	if len(admitted) != 3 {
		t.Fatalf("%d of %d pods admitted against a quota of 3", len(admitted), n)
	}
	if got := store.entries(ledgerOfAgents); len(got) != 3 {
		t.Fatalf("ledger holds %d reservations, want 3: %v", len(got), got)
	}
	updates, creates, conflicts, injected := store.counts()
	t.Logf("ledger writes: %d updates, %d creates lost, %d stale-version conflicts, %d injected conflicts", updates, creates, conflicts, injected)
	if injected == 0 || conflicts == 0 {
		t.Error("no write conflicted: the test did not exercise the compare and swap")
	}

	// The API server stores the admitted pods; the informers see them.
	for _, p := range admitted {
		p.Status.Phase = corev1.PodRunning
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, rep := range replicas {
		waitFor(t, "the informer to see the admitted pods", func() bool {
			live, err := rep.cluster.Usage.live()
			return err == nil && len(live) == 3
		})
	}

	steps := []struct {
		name    string
		before  func()
		replica int
		pod     *corev1.Pod
		dryRun  bool
		allowed bool
		ledger  int // reservations after the step
	}{
		{name: "full: a fourth pod is refused", replica: 0, pod: burstPod(100), ledger: 3},
		{name: "a retried review of an admitted pod is admitted again and reserves nothing more", replica: 1, pod: admitted[0], allowed: true, ledger: 3},
		{name: "deleting one admits one more", before: func() {
			if err := client.CoreV1().Pods(admitted[0].Namespace).Delete(ctx, admitted[0].Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the deleted pod's reservation to be released", func() bool { return len(store.entries(ledgerOfAgents)) == 2 })
		}, replica: 1, pod: burstPod(101), allowed: true, ledger: 3},
		{name: "and only one", replica: 0, pod: burstPod(102), ledger: 3},
		{name: "within the grace period, a pod never created still counts", before: func() {
			clock.Add(int64(DefaultQuotaGrace/time.Second) - 1)
			if err := replicas[0].ledger.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
		}, replica: 0, pod: burstPod(103), ledger: 3},
		{name: "after it, it is released; live pods are kept", before: func() {
			clock.Add(2)
			if err := replicas[1].ledger.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			if got := store.entries(ledgerOfAgents); len(got) != 2 || got["uid-burst-101"] != "" {
				t.Fatalf("after reconciliation: %v, want the two live pods only", got)
			}
		}, replica: 0, pod: burstPod(104), dryRun: true, allowed: true, ledger: 2},
		{name: "a dry run reserved nothing: the next pod is admitted", replica: 1, pod: burstPod(105), allowed: true, ledger: 3},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.before != nil {
				st.before()
			}
			req := podRequest(t, admissionv1.Create, st.pod)
			if st.dryRun {
				req.DryRun = new(true)
			}
			resp := replicas[st.replica].rev.Review(ctx, req)
			if resp.Allowed != st.allowed {
				t.Fatalf("allowed = %v, want %v: %+v", resp.Allowed, st.allowed, resp.Result)
			}
			if !st.allowed && !strings.Contains(resp.Result.Message, "[quota.sandboxes]") {
				t.Errorf("refused for another reason: %s", resp.Result.Message)
			}
			if got := store.entries(ledgerOfAgents); len(got) != st.ledger {
				t.Errorf("ledger holds %d reservations, want %d: %v", len(got), st.ledger, got)
			}
		})
	}
}

// TestQuotaLedgerFailsClosed: a ledger the webhook cannot read or write,
// or one it cannot parse, refuses the pod; a pod without a UID is refused.
func TestQuotaLedgerFailsClosed(t *testing.T) {
	tests := []struct {
		name    string
		reactor k8stesting.ReactionFunc
		pod     *corev1.Pod
		want    string
	}{
		{name: "ledger unreadable", reactor: func(a k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(configMapsResource, "x", fmt.Errorf("RBAC"))
		}, pod: testPod("agents", "a", "uid-a", "", "1Gi", ""), want: "reading quota ledger bulkhead-system/bulkhead-quota-t-agents"},
		{name: "ledger unwritable", reactor: func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() == "create" {
				return true, nil, apierrors.NewServiceUnavailable("etcd down")
			}
			return false, nil, nil
		}, pod: testPod("agents", "a", "uid-a", "", "1Gi", ""), want: "writing quota ledger"},
		{name: "ledger malformed", reactor: func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() == "get" {
				return true, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-quota-t-agents", ResourceVersion: "7"},
					Data: map[string]string{"uid-x": "agents/x lots"}}, nil
			}
			return false, nil, nil
		}, pod: testPod("agents", "a", "uid-a", "", "1Gi", ""), want: `key uid-x: reservation "agents/x lots": want 5 fields`},
		{name: "pod without uid", pod: testPod("agents", "a", "", "", "1Gi", ""), want: "the pod has no uid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tt.reactor != nil {
				client.PrependReactor("*", "configmaps", tt.reactor)
			}
			resp := quotaReviewer(t, client).Review(context.Background(), podRequest(t, admissionv1.Create, tt.pod))
			if resp.Allowed || resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("response %+v, want a 500 refusal naming %q", resp.Result, tt.want)
			}
		})
	}
}

// TestQuotaLedgerOptionsValidated and the ledger's names and encoding.
func TestQuotaLedgerOptionsValidated(t *testing.T) {
	tests := []struct {
		name string
		opts QuotaLedgerOptions
		want string
	}{
		{name: "no client", opts: QuotaLedgerOptions{Namespace: "x"}, want: "Client is required"},
		{name: "no namespace", opts: QuotaLedgerOptions{Client: fake.NewClientset()}, want: "Namespace is required"},
		{name: "negative grace", opts: QuotaLedgerOptions{Client: fake.NewClientset(), Namespace: "x", Grace: -time.Second}, want: "Grace -1s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewQuotaLedger(tt.opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
	for owner, want := range map[string]string{
		"t-agents":        "bulkhead-quota-t-agents",
		"ns-default":      "bulkhead-quota-ns-default",
		"t-Team Research": "bulkhead-quota-" + ledgerName("t-Team Research")[len("bulkhead-quota-"):],
	} {
		if got := ledgerName(owner); got != want || len(got) > 253 {
			t.Errorf("ledgerName(%q) = %q, want %q", owner, got, want)
		}
	}
	if got := ledgerName("t-Team Research"); strings.Contains(got, " ") {
		t.Errorf("ledgerName of an invalid name kept it: %q", got)
	}
	r := reservation{namespace: "agents", name: "p", at: time.Unix(1700000000, 0)}
	r.usage.Sandboxes, r.usage.GPUSlices, r.usage.MemoryBytes = 1, 3, 1<<30
	back, err := parseReservation(r.String())
	if err != nil || back != r {
		t.Errorf("round trip of %v: %v, %v", r, back, err)
	}
}
