package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

const digestImage = "registry.local/agent@sha256:4f6a0b2c8e9d1a3b5c7e9f1a3b5c7d9e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1c"

// testPod is a pod of the agents tenant's shape: RuntimeClass bulkhead, a
// pinned image, a memory limit and an optional MIG profile.
func testPod(ns, name, uid, profile string, memory string, phase corev1.PodPhase) *corev1.Pod {
	rc := "bulkhead"
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			RuntimeClassName: &rc,
			Containers: []corev1.Container{{
				Name: "main", Image: digestImage,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}},
			}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
	if profile != "" {
		p.Annotations[policy.AnnotationGPUProfile] = profile
	}
	return p
}

func podRequest(t testing.TB, op admissionv1.Operation, p *corev1.Pod) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("req-" + p.Name),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: p.Namespace,
		Name:      p.Name,
		Operation: op,
		Object:    runtime.RawExtension{Raw: raw},
	}
}

// waitFor polls cond until it holds; the informer delivers events
// asynchronously. The bound only stops a broken test from hanging.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("gave up waiting for %s", what)
}

// TestReviewQuotaFromInformer feeds the tenant's cluster-wide usage from a
// client-go informer on a fake clientset into the real engine.
func TestReviewQuotaFromInformer(t *testing.T) {
	client := fake.NewClientset(
		// agents tenant (namespaces agents and agents-batch): 2 live pods
		// holding 2+3 GPU slices and 12Gi; the finished pod holds nothing.
		testPod("agents", "p1", "uid-p1", "2g.35gb", "4Gi", corev1.PodRunning),
		testPod("agents-batch", "p2", "uid-p2", "3g.71gb", "8Gi", corev1.PodPending),
		testPod("agents", "done", "uid-done", "3g.71gb", "8Gi", corev1.PodSucceeded),
		// another tenant's pods never count against agents.
		testPod("research", "r1", "uid-r1", "7g.141gb", "100Gi", corev1.PodRunning),
		testPod("research", "r2", "uid-r2", "", "100Gi", corev1.PodRunning),
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor-fast"}, Handler: "bulkhead"},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sneaky"}, Handler: "runc"},
	)
	cluster, err := NewCluster(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Ready(); err == nil {
		t.Error("Ready before Start reported ready")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Ready(); err != nil {
		t.Fatalf("Ready after Start: %v", err)
	}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Usage: cluster.Usage, Handlers: cluster.Handlers})
	if err != nil {
		t.Fatal(err)
	}

	snap, err := cluster.Usage.Snapshot("")
	if err != nil {
		t.Fatal(err)
	}
	wantAgents := policy.Usage{Sandboxes: 1, GPUSlices: 2, MemoryBytes: 4 << 30}
	if snap["agents"] != wantAgents {
		t.Errorf("usage of namespace agents = %+v, want %+v", snap["agents"], wantAgents)
	}

	withRC := func(p *corev1.Pod, rc string) *corev1.Pod { p.Spec.RuntimeClassName = &rc; return p }
	tests := []struct {
		name    string
		before  func()
		req     *admissionv1.AdmissionRequest
		allowed bool
		want    string
	}{
		{name: "fits: 3 of 3 sandboxes",
			req: podRequest(t, admissionv1.Create, testPod("agents", "new-1g", "", "", "1Gi", "")), allowed: true},
		{name: "over GPU quota counts both namespaces",
			req:  podRequest(t, admissionv1.Create, testPod("agents", "new-2g", "", "2g.35gb", "1Gi", "")),
			want: `[quota.gpu_slices] tenant "agents" holds 5 GPU compute slices; 2 more exceed its quota of 6`},
		{name: "over memory quota",
			req:  podRequest(t, admissionv1.Create, testPod("agents-batch", "big", "", "", "60Gi", "")),
			want: "[quota.memory]"},
		{name: "RuntimeClass resolved to its handler",
			req: podRequest(t, admissionv1.Create, withRC(testPod("agents", "fast", "", "", "1Gi", ""), "gvisor-fast")), allowed: true},
		{name: "RuntimeClass whose handler is runc",
			req:  podRequest(t, admissionv1.Create, withRC(testPod("agents", "sneaky", "", "", "1Gi", ""), "sneaky")),
			want: `[runtime.runc_forbidden] tier "untrusted" may not run pods under runc (handler "runc")`},
		{name: "third pod fills the sandbox quota",
			before: func() {
				if _, err := client.CoreV1().Pods("agents-batch").Create(ctx, testPod("agents-batch", "p3", "uid-p3", "", "1Gi", corev1.PodRunning), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "p3 to be counted", func() bool {
					s, err := cluster.Usage.Snapshot("")
					return err == nil && s["agents-batch"].Sandboxes == 2
				})
			},
			req:  podRequest(t, admissionv1.Create, testPod("agents", "fourth", "", "", "1Gi", "")),
			want: `[quota.sandboxes] tenant "agents" runs 3 sandboxes; one more exceeds its quota of 3`},
		{name: "update of a counted pod does not count itself",
			req: updateRequest(t, testPod("agents-batch", "p3", "uid-p3", "", "1Gi", corev1.PodRunning), testPod("agents-batch", "p3", "uid-p3", "", "1Gi", corev1.PodRunning), ""), allowed: true},
		{name: "a deleted pod frees its share",
			before: func() {
				if err := client.CoreV1().Pods("agents").Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "p1 to be uncounted", func() bool {
					s, err := cluster.Usage.Snapshot("")
					return err == nil && s["agents"].Sandboxes == 0
				})
			},
			req: podRequest(t, admissionv1.Create, testPod("agents", "after-delete", "", "", "1Gi", "")), allowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			resp := rev.Review(ctx, tt.req)
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v: %+v", resp.Allowed, tt.allowed, resp.Result)
			}
			if !tt.allowed && !strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("message %q lacks %q", resp.Result.Message, tt.want)
			}
		})
	}
}

// TestReviewUsageNotSynced: without a synced pod cache the webhook cannot
// vouch for quotas and refuses.
func TestReviewUsageNotSynced(t *testing.T) {
	cluster, err := NewCluster(fake.NewClientset())
	if err != nil {
		t.Fatal(err)
	}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Usage: cluster.Usage})
	if err != nil {
		t.Fatal(err)
	}
	resp := rev.Review(context.Background(), podRequest(t, admissionv1.Create, testPod("agents", "x", "", "", "1Gi", "")))
	if resp.Allowed || resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, "pod informer has not synced") {
		t.Fatalf("response = %+v, want a fail-closed refusal naming the unsynced informer", resp.Result)
	}
}

// TestRequestOf covers the mapping of annotations and resource limits to
// input.request, including every refusal.
func TestRequestOf(t *testing.T) {
	lim := func(kv ...string) corev1.ResourceRequirements {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return corev1.ResourceRequirements{Limits: l}
	}
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name        string
		annotations map[string]string
		spec        corev1.PodSpec
		want        policy.Request
		err         string
	}{
		{name: "nothing", want: policy.Request{}},
		{name: "profile only", annotations: map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}, want: policy.Request{GPU: &policy.GPURequest{Profile: "1g.18gb", Count: 1}}},
		{name: "profile and count", annotations: map[string]string{policy.AnnotationGPUProfile: "2g.35gb", policy.AnnotationGPUCount: "2"}, want: policy.Request{GPU: &policy.GPURequest{Profile: "2g.35gb", Count: 2}}},
		{name: "nvidia.com/gpu is whole GPUs", spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/gpu", "2")}}}, want: policy.Request{GPU: &policy.GPURequest{Profile: "whole", Count: 2}}},
		{name: "MIG resource", spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/mig-1g.18gb", "3")}}}, want: policy.Request{GPU: &policy.GPURequest{Profile: "1g.18gb", Count: 3}}},
		{name: "memory: sum of containers and sidecars vs largest init", spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Resources: lim("memory", "3Gi")}, {RestartPolicy: &always, Resources: lim("memory", "1Gi")}},
			Containers:     []corev1.Container{{Resources: lim("memory", "1Gi")}, {Resources: lim("memory", "512Mi")}},
		}, want: policy.Request{MemoryBytes: 3 << 30}},
		{name: "rdma", annotations: map[string]string{policy.AnnotationRDMA: "true"}, want: policy.Request{RDMA: true}},
		{name: "bad count", annotations: map[string]string{policy.AnnotationGPUProfile: "1g.18gb", policy.AnnotationGPUCount: "0"}, err: "annotation bulkhead.dev/gpu-count: must be an integer from 1 to 64"},
		{name: "count without profile", annotations: map[string]string{policy.AnnotationGPUCount: "1"}, err: "needs bulkhead.dev/gpu-profile"},
		{name: "bad profile", annotations: map[string]string{policy.AnnotationGPUProfile: "all of them"}, err: `annotation bulkhead.dev/gpu-profile: must be "whole" or a MIG profile`},
		{name: "count contradicts limits", annotations: map[string]string{policy.AnnotationGPUProfile: "whole", policy.AnnotationGPUCount: "1"}, spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/gpu", "2")}}}, err: "1 contradicts the pod's GPU resource limits (2)"},
		{name: "profile contradicts MIG resource", annotations: map[string]string{policy.AnnotationGPUProfile: "2g.35gb"}, spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/mig-1g.18gb", "1")}}}, err: `"2g.35gb" contradicts resource limit nvidia.com/mig-1g.18gb`},
		{name: "two MIG profiles", spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/mig-1g.18gb", "1")}, {Resources: lim("nvidia.com/mig-2g.35gb", "1")}}}, err: "a pod uses one profile"},
		{name: "whole and MIG", spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: lim("nvidia.com/mig-1g.18gb", "1", "nvidia.com/gpu", "1")}}}, err: "ask for one kind of GPU"},
		{name: "bad rdma", annotations: map[string]string{policy.AnnotationRDMA: "please"}, err: `annotation bulkhead.dev/rdma: must be "true" or "false", got "please"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := requestOf(tt.annotations, tt.spec)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			gotJSON, _ := json.Marshal(got)
			wantJSON, _ := json.Marshal(tt.want)
			if string(gotJSON) != string(wantJSON) {
				t.Errorf("request = %s, want %s", gotJSON, wantJSON)
			}
		})
	}
}

// TestServerOverQuota sends a real AdmissionReview over TLS to a webhook
// whose tenant usage comes from an informer: the agents tenant already runs
// its 3 sandboxes, so the pod is refused, while a Deployment (judged as a
// template, like ResourceQuota does) is not.
func TestServerOverQuota(t *testing.T) {
	cluster, err := NewCluster(fake.NewClientset(
		testPod("agents", "a1", "uid-a1", "", "1Gi", corev1.PodRunning),
		testPod("agents", "a2", "uid-a2", "", "1Gi", corev1.PodRunning),
		testPod("agents-batch", "a3", "uid-a3", "", "1Gi", corev1.PodPending),
	))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cluster.Start(ctx); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	dir := t.TempDir()
	ca.issue(t, dir, 7)
	certs, err := NewCertReloader(dir+"/tls.crt", dir+"/tls.key", nil)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Usage: cluster.Usage, Handlers: cluster.Handlers})
	if err != nil {
		t.Fatal(err)
	}
	h, err := Handler(HandlerOptions{Reviewer: rev, Ready: cluster.Ready})
	if err != nil {
		t.Fatal(err)
	}
	base := tlsServer(t, h, certs)
	client := newClient(ca, true)
	tests := []struct {
		file    string
		allowed bool
		want    string
	}{
		{file: "pod-allowed.json", want: `[quota.sandboxes] tenant "agents" runs 3 sandboxes; one more exceeds its quota of 3`},
		{file: "cronjob-allowed.json", allowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			body, in := readReview(t, tt.file)
			resp, err := client.Post(base+PathValidate, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out admissionv1.AdmissionReview
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
			if out.Response.UID != in.Request.UID || out.Response.Allowed != tt.allowed {
				t.Fatalf("response %+v, want uid %s allowed %v", out.Response, in.Request.UID, tt.allowed)
			}
			if !tt.allowed && (out.Response.Result.Code != 403 || !strings.Contains(out.Response.Result.Message, tt.want)) {
				t.Errorf("result %d %q, want 403 with %q", out.Response.Result.Code, out.Response.Result.Message, tt.want)
			}
		})
	}
}
