package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// benchReviews are the bodies the benchmark clients send in turn: an
// allowed pod, a pod refused for asking for runc, a Deployment refused for
// its template.
var benchReviews = []string{"pod-allowed.json", "pod-runc.json", "deployment-violates.json"}

// benchWebhook builds the webhook the way Run does: the real engine on the
// default bundle, tenant usage from an informer holding 300 pods in 11
// namespaces of other tenants (the agents tenant's quota stays free), the
// RuntimeClasses deploy/ installs, metrics.
func benchWebhook(b *testing.B) (*Reviewer, http.Handler) {
	b.Helper()
	objs := []runtime.Object{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead"}, Handler: "bulkhead"},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "runc"}, Handler: "runc"},
	}
	for i := range 300 {
		ns := "platform"
		if i%11 != 0 {
			ns = fmt.Sprintf("team-%d", i%11)
		}
		objs = append(objs, testPod(ns, fmt.Sprintf("p%d", i), fmt.Sprintf("uid-%d", i), "", "64Mi", corev1.PodRunning))
	}
	cluster, err := NewCluster(fake.NewClientset(objs...))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if err := cluster.Start(ctx); err != nil {
		b.Fatal(err)
	}
	m := NewMetrics()
	usage := &movingUsage{src: cluster.Usage, namespace: "agents"}
	rev, err := NewReviewer(Options{Decider: openEngine(b), Usage: usage, Handlers: cluster.Handlers, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev, Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	return rev, h
}

// movingUsage is the informer's usage with the memory the reviewed tenant
// holds moved on every review, as it does in a cluster where the pods
// admitted before are running: otherwise every review after the third
// would repeat one already decided and the policy's rule caches would
// answer whole decisions from memory.
type movingUsage struct {
	src       UsageSource
	namespace string
	n         atomic.Int64
}

func (u *movingUsage) Snapshot(exclude types.UID) (map[string]policy.Usage, error) {
	m, err := u.src.Snapshot(exclude)
	if err != nil {
		return nil, err
	}
	out := maps.Clone(m)
	if out == nil {
		out = map[string]policy.Usage{}
	}
	got := out[u.namespace]
	got.MemoryBytes += (u.n.Add(1) % 65536) << 10
	out[u.namespace] = got
	return out, nil
}

// reviewTemplate makes reviews of new objects from one review: an API
// server never sends the same object twice, and a benchmark that did would
// let the policy's rule caches answer from memory what they must derive.
type reviewTemplate struct {
	body      []byte
	name, uid []byte // quoted, as they appear in body
}

func newReviewTemplate(b *testing.B, file string) reviewTemplate {
	t, err := makeReviewTemplate(file)
	if err != nil {
		b.Fatal(err)
	}
	return t
}

func makeReviewTemplate(file string) (reviewTemplate, error) {
	body, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		return reviewTemplate{}, err
	}
	var r admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &r); err != nil || r.Request == nil {
		return reviewTemplate{}, fmt.Errorf("%s: not an AdmissionReview with a request: %v", file, err)
	}
	var meta struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if err := json.Unmarshal(r.Request.Object.Raw, &meta); err != nil || meta.Metadata.Name == "" {
		return reviewTemplate{}, fmt.Errorf("%s: no metadata.name in the object: %v", file, err)
	}
	return reviewTemplate{body: body, name: []byte(strconv.Quote(meta.Metadata.Name)), uid: []byte(strconv.Quote(string(r.Request.UID)))}, nil
}

// nth is the review of the n-th object: name and request uid get "-n".
func (t reviewTemplate) nth(n int64) []byte {
	suffix := "-" + strconv.FormatInt(n, 10) + `"`
	out := bytes.ReplaceAll(t.body, t.name, append(t.name[:len(t.name)-1:len(t.name)-1], suffix...))
	return bytes.Replace(out, t.uid, append(t.uid[:len(t.uid)-1:len(t.uid)-1], suffix...), 1)
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p)
	return sorted[i]
}

// deployedGC is what ConfigureGC sets in the webhook's container as
// deploy/webhook/deployment.yaml runs it: a 512Mi memory limit.
var deployedGC = GCSettings{GCPercent: DefaultGCPercent, MemoryLimit: shareOf(512 << 20)}

// goDefaultGC is Go's own default: collect when the heap has doubled.
var goDefaultGC = GCSettings{GCPercent: 100}

// withGC runs f with the process's collector set to s.
func withGC(s GCSettings, f func()) {
	prevPercent, prevLimit := debug.SetGCPercent(s.GCPercent), debug.SetMemoryLimit(-1)
	applyGC(s)
	defer func() {
		debug.SetGCPercent(prevPercent)
		debug.SetMemoryLimit(prevLimit)
	}()
	f()
}

// BenchmarkWebhook measures AdmissionReviews over TLS on loopback with 1, 16
// and 64 concurrent clients (one keep-alive connection each), against a
// baseline measured in the same run: Reviewer.Review called directly, with
// no HTTP, TLS or JSON (and the engine's Decide alone). Reported: p50/p99
// latency per review (ms), reviews per second, CPU time per review, and p50
// relative to the direct baseline. The collector runs as ConfigureGC sets
// it in the deployed container; clients=64,gc=go-default repeats 64 clients
// with Go's default collector for comparison.
func BenchmarkWebhook(b *testing.B) {
	withGC(deployedGC, func() { benchmarkWebhook(b) })
}

func benchmarkWebhook(b *testing.B) {
	rev, h := benchWebhook(b)
	var templates []reviewTemplate
	for _, f := range benchReviews {
		templates = append(templates, newReviewTemplate(b, f))
	}

	// The policy evaluation alone, on the inputs the reviews build.
	b.Run("baseline=engine-decide", func(b *testing.B) {
		engine := openEngine(b)
		var inputs []policy.Input
		for _, f := range benchReviews {
			_, r := readReview(b, f)
			pod, err := podOf(schema.GroupVersionKind(r.Request.Kind), r.Request.Object.Raw)
			if err != nil {
				b.Fatal(err)
			}
			in, err := inputFor(r.Request.Namespace, pod, nil)
			if err != nil {
				b.Fatal(err)
			}
			inputs = append(inputs, in)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		cpu0 := cpuTime()
		for i := range b.N {
			in := inputs[i%len(inputs)]
			in.Pod.Name, in.Pod.UID = in.Pod.Name+"-"+strconv.Itoa(i), "uid-"+strconv.Itoa(i)
			in.Usage.MemoryBytes = int64(i%65536) << 10 // as movingUsage
			start := time.Now()
			if _, err := engine.Decide(context.Background(), in); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		reportCPU(b, cpu0)
		slices.Sort(lat)
		b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	})

	// The whole review without transport: input, usage, decision, response.
	var baselineP50 time.Duration
	b.Run("baseline=direct-review", func(b *testing.B) {
		reqs := make([]*admissionv1.AdmissionRequest, b.N)
		for i := range reqs {
			review, err := decodeReview(templates[i%len(templates)].nth(int64(i)))
			if err != nil {
				b.Fatal(err)
			}
			reqs[i] = review.Request
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		cpu0 := cpuTime()
		for i := range b.N {
			start := time.Now()
			resp := rev.Review(context.Background(), reqs[i])
			lat = append(lat, time.Since(start))
			if resp.UID == "" {
				b.Fatal("no uid")
			}
		}
		b.StopTimer()
		reportCPU(b, cpu0)
		slices.Sort(lat)
		baselineP50 = percentile(lat, 0.50)
		b.ReportMetric(float64(percentile(lat, 0.50).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	})

	ca := newTestCA(b)
	dir := b.TempDir()
	ca.issue(b, dir, 1)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	if err != nil {
		b.Fatal(err)
	}
	// The handler's own time, from its first line to its flushed answer:
	// what a client waits beyond it is waiting for a CPU.
	var handled struct {
		sync.Mutex
		lat []time.Duration
	}
	timed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t0 := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(t0)
		handled.Lock()
		handled.lat = append(handled.lat, d)
		handled.Unlock()
	})
	base := tlsServer(b, timed, certs)

	for _, run := range []struct {
		clients int
		gc      string
	}{{1, ""}, {16, ""}, {64, ""}, {64, "go-default"}} {
		clients, name := run.clients, fmt.Sprintf("clients=%d", run.clients)
		if run.gc != "" {
			name += ",gc=" + run.gc
		}
		b.Run(name, func(b *testing.B) {
			if run.gc == "go-default" {
				prev := debug.SetGCPercent(goDefaultGC.GCPercent)
				defer debug.SetGCPercent(prev)
			}
			var cpu0 time.Duration
			all, elapsed := closedLoop(ca.pool, base+PathValidate, clients, int64(b.N), templates, func() {
				handled.Lock()
				handled.lat = handled.lat[:0]
				handled.Unlock()
				b.ResetTimer()
				cpu0 = cpuTime()
			}, func(err error) { b.Error(err) })
			b.StopTimer()
			reportCPU(b, cpu0)
			p50 := reportLatencies(b, all, elapsed)
			handled.Lock()
			served := slices.Clone(handled.lat)
			handled.Unlock()
			slices.Sort(served)
			b.ReportMetric(float64(percentile(served, 0.50).Microseconds())/1000, "handler-p50-ms")
			b.ReportMetric(float64(percentile(served, 0.99).Microseconds())/1000, "handler-p99-ms")
			if baselineP50 > 0 {
				b.ReportMetric(float64(p50)/float64(baselineP50), "p50/direct")
			}
		})
	}

	// The same 64 clients from a process of their own, as the API server
	// is: the kernel, not this process's scheduler, shares the CPUs between
	// clients and webhook. server-cpu-us/op is this process, client-cpu-us/op
	// the load generator's (handshakes and start-up included).
	b.Run("clients=64,load=process", func(b *testing.B) {
		cfg, err := json.Marshal(loadConfig{URL: base + PathValidate, CA: ca.pem(), Clients: 64, N: int64(b.N)})
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), loadEnv+"="+string(cfg))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		b.ResetTimer()
		cpu0 := cpuTime()
		out, err := cmd.Output()
		b.StopTimer()
		if err != nil {
			b.Fatalf("load generator: %v\n%s", err, stderr.Bytes())
		}
		if b.N > 0 {
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "server-cpu-us/op")
			child := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			b.ReportMetric(float64(child.Microseconds())/float64(b.N), "client-cpu-us/op")
		}
		if len(out) < 8 || len(out)%8 != 0 {
			b.Fatalf("load generator wrote %d bytes", len(out))
		}
		elapsed := time.Duration(binary.LittleEndian.Uint64(out))
		all := make([]time.Duration, 0, len(out)/8-1)
		for i := 8; i < len(out); i += 8 {
			all = append(all, time.Duration(binary.LittleEndian.Uint64(out[i:])))
		}
		reportLatencies(b, all, elapsed)
	})
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports CPU time per operation since cpu0: unlike latency it
// does not grow when other processes compete for the cores, so it bounds
// what dedicated cores can do (throughput <= cores / cpu-us/op). Over TLS
// it includes the benchmark's own clients, which run in this process.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	if b.N > 0 {
		b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
	}
}

// postReview sends one review and reads the answer.
func postReview(c *http.Client, url string, body []byte) error {
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return nil
}

// closedLoop is the API server as the benchmark plays it: clients
// keep-alive TLS connections to url, each sending its next review (the
// templates in turn, each for a new object) as soon as the last is
// answered, until n reviews are answered. ready runs after every
// connection's handshake, just before the first timed review. It returns
// every review's latency and the time from ready to the last answer.
func closedLoop(roots *x509.CertPool, url string, clients int, n int64, templates []reviewTemplate, ready func(), fail func(error)) ([]time.Duration, time.Duration) {
	hc := make([]*http.Client, clients)
	for i := range hc {
		hc[i] = &http.Client{Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 1,
		}}
		// Handshake before timing: the API server keeps its connections
		// to a webhook alive.
		if err := postReview(hc[i], url, templates[0].nth(-1)); err != nil {
			fail(err)
		}
	}
	defer func() {
		for _, c := range hc {
			c.CloseIdleConnections()
		}
	}()
	var next atomic.Int64
	lats := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	ready()
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				body := templates[i%int64(len(templates))].nth(i)
				t0 := time.Now()
				if err := postReview(hc[c], url, body); err != nil {
					fail(err)
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	return slices.Concat(lats...), time.Since(start)
}

// reportLatencies reports p50, p99, mean, p99/mean and throughput of one
// closed-loop run and returns p50.
func reportLatencies(b *testing.B, all []time.Duration, elapsed time.Duration) time.Duration {
	slices.Sort(all)
	p50, p99 := percentile(all, 0.50), percentile(all, 0.99)
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
	// With every client always waiting on one review, the mean is clients
	// / throughput whatever the order of service (Little's law); p99/mean
	// says how far from first come, first served the order was (about 1
	// for FIFO, about 4.6 for random order).
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	if len(all) > 0 {
		mean := sum / time.Duration(len(all))
		b.ReportMetric(float64(mean.Microseconds())/1000, "mean-ms")
		b.ReportMetric(float64(p99)/float64(mean), "p99/mean")
	}
	if elapsed > 0 {
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "reviews/s")
	}
	return p50
}

// loadEnv, when set, makes this test binary the load generator of
// BenchmarkWebhook/clients=64,load=process (see generateLoad) instead of
// running tests.
const loadEnv = "BULKHEAD_WEBHOOK_LOAD"

// loadConfig is what the load generator process is asked to do.
type loadConfig struct {
	URL     string `json:"url"`
	CA      []byte `json:"ca"` // PEM
	Clients int    `json:"clients"`
	N       int64  `json:"n"`
}

func TestMain(m *testing.M) {
	if raw := os.Getenv(loadEnv); raw != "" {
		os.Exit(generateLoad(raw, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// generateLoad runs the closed loop cfg asks for and writes the elapsed
// time, then every latency, to out (nanoseconds, little-endian uint64).
func generateLoad(raw string, out, errs io.Writer) int {
	var cfg loadConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(errs, "load generator:", err)
		return 2
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.CA) {
		fmt.Fprintln(errs, "load generator: no CA certificate")
		return 2
	}
	var templates []reviewTemplate
	for _, f := range benchReviews {
		t, err := makeReviewTemplate(f)
		if err != nil {
			fmt.Fprintln(errs, "load generator:", err)
			return 2
		}
		templates = append(templates, t)
	}
	var failed atomic.Bool
	all, elapsed := closedLoop(roots, cfg.URL, cfg.Clients, cfg.N, templates, func() {}, func(err error) {
		if !failed.Swap(true) {
			fmt.Fprintln(errs, "load generator:", err)
		}
	})
	buf := binary.LittleEndian.AppendUint64(nil, uint64(elapsed))
	for _, d := range all {
		buf = binary.LittleEndian.AppendUint64(buf, uint64(d))
	}
	if _, err := out.Write(buf); err != nil || failed.Load() {
		return 1
	}
	return 0
}
