package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// The comparison's burst: quotaBurst concurrent creates of tenant burst's
// pods, alternately pinned to each node, against a quota of quotaLimit
// pods, quotaRounds times per engine.
const (
	quotaBurst  = 20
	quotaLimit  = 3
	quotaRounds = 5
	// quotaRetry is how often the ledger's client retries a refused create
	// (createWhenAdmitted's period).
	quotaRetry = 200 * time.Millisecond
	burstNS    = "burst"
)

// workloadsGVR is Kueue's Workload resource.
var workloadsGVR = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}

// quotaEngine is one way of holding the tenant to its quota cluster-wide.
type quotaEngine string

const (
	// engineLedger: Bulkhead's webhook refuses a create over quota; its
	// ledger is a ConfigMap written with optimistic concurrency.
	engineLedger quotaEngine = "ledger"
	// engineKueue: every create is taken, gated; Kueue lifts the gate of
	// as many as its ClusterQueue has quota for and queues the rest.
	engineKueue quotaEngine = "kueue"
)

// BenchmarkQuotaEngines compares Bulkhead's quota ledger with Kueue as the
// cluster-wide quota engine on the same burst (issue 26): quotaBurst
// concurrent creates of tenant burst's gVisor pods spread over node-a and
// node-b against a quota of quotaLimit, quotaRounds rounds per engine on
// one cluster. It measures, per round, the time from the burst's start to
// the quotaLimit-th pod Running and to every create decided (the ledger:
// created or refused; Kueue: its Workload admitted or left pending), the
// most pods ever admitted and Running at once (watched: any overshoot of
// the quota fails the benchmark), the API server's requests and 409s
// during the burst (apiserver_request_total), and, once one Running pod is
// deleted, the time to a replacement Running (the ledger: a refused client
// retrying every quotaRetry; Kueue: the next queued pod, admitted by
// Kueue). Kueue runs with the pod integration and a ClusterQueue of
// nominal quota pods: quotaLimit in a cohort; during its rounds the
// namespace is exempt from Bulkhead's webhook (both engines on one tenant
// would charge each gated pod to the ledger as well). Every node agent
// still judges every sandbox, so a node's own ledger caps the tenant there
// under both. make bench-quota; -benchtime=1x.
func BenchmarkQuotaEngines(b *testing.B) {
	if err := Requirements(); err != nil {
		b.Skipf("cluster: %v", err)
	}
	if _, err := node.LookPath("bulkhead-webhook"); err != nil {
		b.Skip("cluster: needs bulkhead-webhook (make build)")
	}
	if err := KueueRequirements(); err != nil {
		b.Skipf("cluster: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "bh-cluster-")
	if err != nil {
		b.Fatal(err)
	}
	c, in, err := startStory(ctx, dir, repoRoot(b), func(f string, a ...any) { b.Logf(f, a...) }, 24)
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if b.Failed() {
			b.Logf("component logs (tail):\n%s", c.Logs(25))
		}
		if err := c.Stop(context.Background()); err != nil {
			b.Error(err)
		}
		if fileExists("/etc/kueue") {
			b.Error("/etc/kueue is left behind")
		}
	}()
	if err := in.Apply(ctx, c); err != nil {
		b.Fatal(err)
	}
	if out, err := c.Kubectl(ctx, "create", "namespace", burstNS); err != nil {
		b.Fatalf("namespace %s: %v: %s", burstNS, err, out)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cfg.WarningHandler = rest.NoWarnings{}
	// The burst's 20 creates leave at once, as 20 clients would.
	cfg.QPS, cfg.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	if why := eventually(ctx, func() string {
		if _, err := client.CoreV1().ServiceAccounts(burstNS).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return err.Error()
		}
		return ""
	}); why != "" {
		b.Fatal(why)
	}
	started := time.Now()
	if _, err := StartKueue(ctx, c, KueueOptions{Namespaces: []string{burstNS}}); err != nil {
		b.Fatal(err)
	}
	if out, err := c.KubectlStdin(ctx, KueueQueues(burstNS, "bulkhead", quotaLimit, burstNS), "apply", "-f", "-"); err != nil {
		b.Fatalf("kueue queues: %v: %s", err, out)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Active", "--timeout=60s", "clusterqueue/"+burstNS); err != nil {
		b.Fatalf("ClusterQueue %s not active: %v: %s", burstNS, err, out)
	}
	b.Logf("kueue %s up and its queues active in %s", KueueVersion, time.Since(started).Round(100*time.Millisecond))

	for range b.N {
		results := map[quotaEngine][]quotaRound{}
		for i := range quotaRounds {
			results[engineLedger] = append(results[engineLedger], runQuotaRound(ctx, b, c, client, dyn, engineLedger, i))
		}
		// The namespace out of Bulkhead's webhook, as subtest 9 exempts
		// it: Kueue alone holds the tenant cluster-wide.
		patch := `[{"op":"add","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/-","value":"` + burstNS + `"}]`
		if out, err := c.Kubectl(ctx, "patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p", patch); err != nil {
			b.Fatalf("exempt %s: %v: %s", burstNS, err, out)
		}
		// The API server's webhook configuration is read from a watch.
		time.Sleep(2 * time.Second)
		for i := range quotaRounds {
			results[engineKueue] = append(results[engineKueue], runQuotaRound(ctx, b, c, client, dyn, engineKueue, i))
		}
		reportQuota(b, results)
	}
}

// quotaRound is one burst's measurements.
type quotaRound struct {
	// thirdAdmitted and thirdRunning: from the burst's start to the
	// quotaLimit-th pod admitted (the ledger: created; Kueue: ungated) and
	// Running.
	thirdAdmitted, thirdRunning time.Duration
	// returned: to the last create's answer; decided: to every create
	// decided (the ledger: the same; Kueue: its Workload admitted or
	// pending).
	returned, decided time.Duration
	// created and refused: the creates' outcomes (Kueue refuses none).
	created, refused int
	// maxAdmitted and maxRunning: the most pods admitted (ungated, not
	// finished) and Running at once during the burst.
	maxAdmitted, maxRunning int
	// requests, conflicts: the API server's requests and 409s during the
	// burst; cmWrites and cmConflicts those of ConfigMaps (the ledger);
	// kueueRequests those of Kueue's objects.
	requests, conflicts, cmWrites, cmConflicts, kueueRequests float64
	// replaced: from deleting a Running pod to another Running; retries:
	// the ledger client's refused creates meanwhile.
	replaced time.Duration
	retries  int
	// maxAfterDelete: the most pods Running at once while the deleted one
	// terminates and its replacement starts (the terminating one counts).
	maxAfterDelete int
}

// podTracker follows the round's pods through a watch.
type podTracker struct {
	mu      sync.Mutex
	start   time.Time
	state   map[string][2]bool // name -> admitted, running
	running map[string]time.Time
	// admitted, nRunning: now; maxAdmitted, maxRunning: the most so far.
	admitted, nRunning, maxAdmitted, maxRunning int
	thirdAdmitted, thirdRunning                 time.Duration
}

func (t *podTracker) observe(p *corev1.Pod, gone bool) {
	finished := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	gated := slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == KueueGate })
	admitted := !gone && !finished && !gated
	running := !gone && p.Status.Phase == corev1.PodRunning
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := t.state[p.Name]
	t.state[p.Name] = [2]bool{admitted, running}
	t.admitted += b2i(admitted) - b2i(prev[0])
	t.nRunning += b2i(running) - b2i(prev[1])
	t.maxAdmitted = max(t.maxAdmitted, t.admitted)
	t.maxRunning = max(t.maxRunning, t.nRunning)
	if running {
		if _, ok := t.running[p.Name]; !ok {
			t.running[p.Name] = now
		}
	}
	if t.thirdAdmitted == 0 && t.admitted >= quotaLimit {
		t.thirdAdmitted = now.Sub(t.start)
	}
	if t.thirdRunning == 0 && t.nRunning >= quotaLimit {
		t.thirdRunning = now.Sub(t.start)
	}
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}

// resetMax restarts the maxima from the current counts.
func (t *podTracker) resetMax() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maxAdmitted, t.maxRunning = t.admitted, t.nRunning
}

// runQuotaRound runs one burst with engine: quotaBurst concurrent creates,
// then one Running pod deleted, then every pod removed.
func runQuotaRound(ctx context.Context, b *testing.B, c *Cluster, client kubernetes.Interface, dyn dynamic.Interface, engine quotaEngine, round int) quotaRound {
	var res quotaRound
	label := fmt.Sprintf("%s-%d", engine, round)
	pods := client.CoreV1().Pods(burstNS)
	waitQuiet(ctx, b, client, dyn, engine)

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	tr := &podTracker{state: map[string][2]bool{}, running: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(burstNS),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "round=" + label }))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { tr.observe(obj.(*corev1.Pod), false) },
		UpdateFunc: func(_, obj any) { tr.observe(obj.(*corev1.Pod), false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				tr.observe(p, true)
			}
		},
	}); err != nil {
		b.Fatal(err)
	}
	// Kueue's decisions: a Workload with a QuotaReserved condition, true
	// (admitted) or false (pending: queued for quota).
	var (
		wmu     sync.Mutex
		decided = map[string]bool{}
		allAt   time.Time
	)
	var wInf cache.SharedIndexInformer
	if engine == engineKueue {
		wf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, burstNS, nil)
		wInf = wf.ForResource(workloadsGVR).Informer()
		onWorkload := func(obj any) {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok || !workloadOfRound(u, label) {
				return
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, cd := range conds {
				if m, ok := cd.(map[string]any); ok && m["type"] == "QuotaReserved" {
					wmu.Lock()
					decided[u.GetName()] = true
					if len(decided) == quotaBurst && allAt.IsZero() {
						allAt = time.Now()
					}
					wmu.Unlock()
				}
			}
		}
		if _, err := wInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: onWorkload, UpdateFunc: func(_, obj any) { onWorkload(obj) },
		}); err != nil {
			b.Fatal(err)
		}
		wf.Start(wctx.Done())
	}
	factory.Start(wctx.Done())
	synced := []cache.InformerSynced{inf.HasSynced}
	if wInf != nil {
		synced = append(synced, wInf.HasSynced)
	}
	if !cache.WaitForCacheSync(wctx.Done(), synced...) {
		b.Fatal("the round's informers did not sync")
	}

	before := apiRequests(ctx, b, client)
	type outcome struct {
		err error
		at  time.Time
	}
	outcomes := make([]outcome, quotaBurst)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range quotaBurst {
		p := burstPod(b, fmt.Sprintf("%s-%02d", label, i), []string{NodeA, NodeB}[i%2], label, engine)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := pods.Create(ctx, p, metav1.CreateOptions{})
			outcomes[i] = outcome{err, time.Now()}
		}()
	}
	tr.mu.Lock()
	tr.start = time.Now()
	tr.mu.Unlock()
	t0 := tr.start
	close(start)
	wg.Wait()
	var lastCreate time.Time
	for i, o := range outcomes {
		if o.at.After(lastCreate) {
			lastCreate = o.at
		}
		switch {
		case o.err == nil:
			res.created++
		case engine == engineLedger && strings.Contains(o.err.Error(), "[quota.sandboxes]"):
			res.refused++
		default:
			b.Errorf("%s: create %d: %v", label, i, o.err)
		}
	}
	// Every create decided and quotaLimit pods Running.
	if why := eventually(wctx, func() string {
		tr.mu.Lock()
		third := tr.thirdRunning
		tr.mu.Unlock()
		wmu.Lock()
		n, at := len(decided), allAt
		wmu.Unlock()
		switch {
		case third == 0:
			return fmt.Sprintf("%s: fewer than %d pods Running", label, quotaLimit)
		case engine == engineKueue && at.IsZero():
			return fmt.Sprintf("%s: %d of %d Workloads decided", label, n, quotaBurst)
		}
		return ""
	}); why != "" {
		b.Fatal(why)
	}
	res.returned = lastCreate.Sub(t0)
	res.decided = res.returned
	if engine == engineKueue {
		wmu.Lock()
		res.decided = max(res.decided, allAt.Sub(t0))
		wmu.Unlock()
	}
	// Longer than Kueue's requeue of a pending Workload and the kubelet's
	// sandbox start: a late admission past the quota would show here.
	time.Sleep(3 * time.Second)
	after := apiRequests(ctx, b, client)
	res.requests, res.conflicts = after.total-before.total, after.conflicts-before.conflicts
	res.cmWrites, res.cmConflicts = after.cmWrites-before.cmWrites, after.cmConflicts-before.cmConflicts
	res.kueueRequests = after.kueue - before.kueue
	tr.mu.Lock()
	res.thirdAdmitted, res.thirdRunning, res.maxAdmitted, res.maxRunning = tr.thirdAdmitted, tr.thirdRunning, tr.maxAdmitted, tr.maxRunning
	var victim string
	for name, st := range tr.state {
		if st[1] {
			victim = name
			break
		}
	}
	tr.mu.Unlock()
	if res.maxAdmitted > quotaLimit || res.maxRunning > quotaLimit {
		b.Errorf("%s: %d pods admitted and %d Running at once, over the quota of %d", label, res.maxAdmitted, res.maxRunning, quotaLimit)
	}
	if engine == engineLedger && res.created != quotaLimit {
		b.Errorf("%s: %d creates admitted, want exactly %d", label, res.created, quotaLimit)
	}

	// One Running pod deleted: how long until another runs in its place.
	tr.resetMax()
	t1 := time.Now()
	if err := pods.Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		b.Fatalf("%s: delete %s: %v", label, victim, err)
	}
	if engine == engineLedger {
		retry := burstPod(b, label+"-retry", NodeA, label, engine)
		for {
			_, err := pods.Create(ctx, retry, metav1.CreateOptions{})
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "[quota.") || ctx.Err() != nil {
				b.Fatalf("%s: retried create: %v", label, err)
			}
			res.retries++
			time.Sleep(quotaRetry)
		}
	}
	if why := eventually(wctx, func() string {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for name, at := range tr.running {
			if at.After(t1) && name != victim {
				res.replaced = at.Sub(t1)
				return ""
			}
		}
		return label + ": no pod Running in the deleted one's place"
	}); why != "" {
		b.Fatal(why)
	}
	// The deleted pod gone, and nothing else starting.
	if why := eventually(wctx, func() string {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.state[victim][1] {
			return label + ": the deleted pod still Running"
		}
		return ""
	}); why != "" {
		b.Error(why)
	}
	time.Sleep(2 * time.Second)
	tr.mu.Lock()
	res.maxAfterDelete = tr.maxRunning
	if tr.nRunning != quotaLimit {
		b.Errorf("%s: %d pods Running after the replacement, want %d", label, tr.nRunning, quotaLimit)
	}
	tr.mu.Unlock()

	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "round=" + label}); err != nil {
		b.Fatalf("%s: delete the round's pods: %v", label, err)
	}
	b.Logf("%s: creates answered %s, 3rd admitted %s, 3rd Running %s, all decided %s, %d created %d refused, max %d admitted %d Running at once, %0.f API requests (%0.f 409s; ConfigMap writes %0.f, 409s %0.f; Kueue objects %0.f), replacement Running %s after the delete (%d refused retries), max %d Running meanwhile",
		label, res.returned.Round(time.Millisecond), res.thirdAdmitted.Round(time.Millisecond), res.thirdRunning.Round(time.Millisecond), res.decided.Round(time.Millisecond), res.created, res.refused,
		res.maxAdmitted, res.maxRunning, res.requests, res.conflicts, res.cmWrites, res.cmConflicts, res.kueueRequests,
		res.replaced.Round(time.Millisecond), res.retries, res.maxAfterDelete)
	return res
}

// workloadOfRound reports whether Workload u is of a pod of round label
// (Kueue copies no label of the pod; its owner reference names the pod).
func workloadOfRound(u *unstructured.Unstructured, label string) bool {
	for _, o := range u.GetOwnerReferences() {
		if o.Kind == "Pod" && strings.HasPrefix(o.Name, label+"-") {
			return true
		}
	}
	return false
}

// burstPod is BurstPod labelled round=label, and for Kueue with its
// LocalQueue.
func burstPod(b *testing.B, name, nodeName, label string, engine quotaEngine) *corev1.Pod {
	var p corev1.Pod
	if err := yaml.Unmarshal([]byte(BurstPod(name, burstNS, nodeName)), &p); err != nil {
		b.Fatal(err)
	}
	p.Labels = map[string]string{"round": label}
	if engine == engineKueue {
		p.Labels[KueueQueueLabel] = burstNS
	}
	return &p
}

// waitQuiet waits until the namespace has no pods left, the ledger holds
// no reservation of the tenant, and no Workload is left.
func waitQuiet(ctx context.Context, b *testing.B, client kubernetes.Interface, dyn dynamic.Interface, engine quotaEngine) {
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if why := eventually(wctx, func() string {
		l, err := client.CoreV1().Pods(burstNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		if len(l.Items) > 0 {
			return fmt.Sprintf("%d pods of %s left", len(l.Items), burstNS)
		}
		if engine == engineLedger {
			cm, err := client.CoreV1().ConfigMaps(quotaNamespace).Get(ctx, "bulkhead-quota-t-"+burstNS, metav1.GetOptions{})
			if err == nil && len(cm.Data) > 0 {
				return fmt.Sprintf("the ledger holds %d reservations", len(cm.Data))
			}
		}
		w, err := dyn.Resource(workloadsGVR).Namespace(burstNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err.Error()
		}
		if len(w.Items) > 0 {
			return fmt.Sprintf("%d Workloads left", len(w.Items))
		}
		return ""
	}); why != "" {
		b.Fatalf("before the %s round: %s", engine, why)
	}
}

// apiCounts are sums of the API server's apiserver_request_total.
type apiCounts struct {
	total, conflicts, cmWrites, cmConflicts, kueue float64
}

// apiRequests reads the API server's request counters.
func apiRequests(ctx context.Context, b *testing.B, client kubernetes.Interface) apiCounts {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		b.Fatalf("API server metrics: %v", err)
	}
	var n apiCounts
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		labels, value, ok := strings.Cut(strings.TrimPrefix(line, "apiserver_request_total{"), "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range strings.Split(labels, ",") {
			if k, val, ok := strings.Cut(kv, "="); ok {
				l[k] = strings.Trim(val, `"`)
			}
		}
		n.total += v
		conflict := l["code"] == "409"
		if conflict {
			n.conflicts += v
		}
		if l["resource"] == "configmaps" && (l["verb"] == "POST" || l["verb"] == "PUT" || l["verb"] == "PATCH") {
			n.cmWrites += v
			if conflict {
				n.cmConflicts += v
			}
		}
		if l["group"] == "kueue.x-k8s.io" {
			n.kueue += v
		}
	}
	return n
}

// reportQuota prints each engine's medians over its rounds and Kueue's
// ratios to the ledger's.
func reportQuota(b *testing.B, results map[quotaEngine][]quotaRound) {
	medDur := func(rs []quotaRound, f func(quotaRound) time.Duration) time.Duration {
		v := make([]time.Duration, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	medNum := func(rs []quotaRound, f func(quotaRound) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	maxInt := func(rs []quotaRound, f func(quotaRound) int) int {
		m := 0
		for _, r := range rs {
			m = max(m, f(r))
		}
		return m
	}
	type row struct {
		name string
		ms   bool
		dur  func(quotaRound) time.Duration
		num  func(quotaRound) float64
	}
	rows := []row{
		{name: "creates-answered", ms: true, dur: func(r quotaRound) time.Duration { return r.returned }},
		{name: "3rd-admitted", ms: true, dur: func(r quotaRound) time.Duration { return r.thirdAdmitted }},
		{name: "3rd-running", ms: true, dur: func(r quotaRound) time.Duration { return r.thirdRunning }},
		{name: "all-decided", ms: true, dur: func(r quotaRound) time.Duration { return r.decided }},
		{name: "replaced", ms: true, dur: func(r quotaRound) time.Duration { return r.replaced }},
		{name: "api-requests", num: func(r quotaRound) float64 { return r.requests }},
		{name: "api-409s", num: func(r quotaRound) float64 { return r.conflicts }},
		{name: "configmap-writes", num: func(r quotaRound) float64 { return r.cmWrites }},
		{name: "configmap-409s", num: func(r quotaRound) float64 { return r.cmConflicts }},
		{name: "kueue-object-requests", num: func(r quotaRound) float64 { return r.kueueRequests }},
		{name: "retries", num: func(r quotaRound) float64 { return float64(r.retries) }},
	}
	ledger, kueue := results[engineLedger], results[engineKueue]
	var table strings.Builder
	fmt.Fprintf(&table, "median of %d rounds each, %d concurrent creates over %s and %s, quota %d\n", quotaRounds, quotaBurst, NodeA, NodeB, quotaLimit)
	fmt.Fprintf(&table, "%-22s %12s %12s %8s\n", "", "ledger", "kueue", "k/l")
	for _, r := range rows {
		var l, k float64
		unit := ""
		if r.ms {
			l = float64(medDur(ledger, r.dur).Microseconds()) / 1000
			k = float64(medDur(kueue, r.dur).Microseconds()) / 1000
			unit = "-ms"
		} else {
			l, k = medNum(ledger, r.num), medNum(kueue, r.num)
		}
		b.ReportMetric(l, "ledger-"+r.name+unit)
		b.ReportMetric(k, "kueue-"+r.name+unit)
		ratio := "-"
		if l > 0 {
			ratio = fmt.Sprintf("%.2f", k/l)
		}
		fmt.Fprintf(&table, "%-22s %12.1f %12.1f %8s\n", r.name+unit, l, k, ratio)
	}
	for _, e := range []quotaEngine{engineLedger, engineKueue} {
		ma := maxInt(results[e], func(r quotaRound) int { return r.maxAdmitted })
		mr := maxInt(results[e], func(r quotaRound) int { return r.maxRunning })
		md := maxInt(results[e], func(r quotaRound) int { return r.maxAfterDelete })
		b.ReportMetric(float64(ma), string(e)+"-max-admitted")
		b.ReportMetric(float64(mr), string(e)+"-max-running")
		fmt.Fprintf(&table, "%s: at most %d admitted and %d Running at once in any burst; at most %d Running while one was replaced (the terminating one counts)\n", e, ma, mr, md)
	}
	b.Logf("quota engines:\n%s", table.String())
}

// TestKueueWebhooks checks the webhook configurations StartKueue makes from
// Kueue's own manifests: only pods' and Kueue's objects' webhooks, each
// called by url with the CA bundle, and the pod webhooks limited to the
// managed namespaces and to pods that name a LocalQueue.
func TestKueueWebhooks(t *testing.T) {
	share, err := KueueShareDir()
	if err != nil {
		t.Skipf("cluster: %v", err)
	}
	manifests, err := os.ReadFile(share + "/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://127.0.0.1:9443"
	ca := []byte("ca")
	mutating, validating, err := kueueWebhooks(manifests, base, ca, []string{burstNS})
	if err != nil {
		t.Fatal(err)
	}
	type hook struct {
		name       string
		clientURL  *string
		caBundle   []byte
		ns, object *metav1.LabelSelector
	}
	var hooks []hook
	for _, w := range mutating.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig.URL, w.ClientConfig.CABundle, w.NamespaceSelector, w.ObjectSelector})
	}
	for _, w := range validating.Webhooks {
		hooks = append(hooks, hook{w.Name, w.ClientConfig.URL, w.ClientConfig.CABundle, w.NamespaceSelector, w.ObjectSelector})
	}
	names := map[string]bool{}
	for _, h := range hooks {
		names[h.name] = true
		if h.clientURL == nil || !strings.HasPrefix(*h.clientURL, base+"/") || string(h.caBundle) != "ca" {
			t.Errorf("webhook %s: url %v, caBundle %q: want %s/... and the CA", h.name, h.clientURL, h.caBundle, base)
		}
		pod := h.name == "mpod.kb.io" || h.name == "vpod.kb.io"
		switch {
		case pod && (h.ns == nil || len(h.ns.MatchExpressions) != 1 || !slices.Equal(h.ns.MatchExpressions[0].Values, []string{burstNS})):
			t.Errorf("webhook %s: namespaceSelector %v, want the managed namespaces only", h.name, h.ns)
		case pod && (h.object == nil || len(h.object.MatchExpressions) != 1 || h.object.MatchExpressions[0].Key != KueueQueueLabel):
			t.Errorf("webhook %s: objectSelector %v, want pods with %s", h.name, h.object, KueueQueueLabel)
		case !pod && (h.ns != nil || h.object != nil):
			t.Errorf("webhook %s of Kueue's objects: selectors %v %v, want none", h.name, h.ns, h.object)
		}
	}
	for _, tc := range []struct {
		name string
		kept bool
	}{
		{"mpod.kb.io", true}, {"vpod.kb.io", true},
		{"mclusterqueue.kb.io", true}, {"vclusterqueue.kb.io", true}, {"vcohort.kb.io", true},
		{"mworkload.kb.io", true}, {"vworkload.kb.io", true}, {"vresourceflavor.kb.io", true},
		{"mjob.kb.io", false}, {"vdeployment.kb.io", false}, {"mraycluster.kb.io", false},
	} {
		if names[tc.name] != tc.kept {
			t.Errorf("webhook %s kept: %v, want %v", tc.name, names[tc.name], tc.kept)
		}
	}
}
