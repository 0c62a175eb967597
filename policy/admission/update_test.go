package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// ledgerReviewer is one webhook replica deciding on a quota ledger kept in
// a fake clientset with compare-and-swap ConfigMaps; store shows the
// reservations it writes.
func ledgerReviewer(t *testing.T) (*Reviewer, *casConfigMaps) {
	t.Helper()
	client := fake.NewClientset()
	store := &casConfigMaps{}
	client.PrependReactor("*", "configmaps", store.react)
	return quotaReviewer(t, client), store
}

// updateRequest is the UPDATE the API server sends when old becomes now
// through subresource ("" for the pod itself, "resize", ...).
func updateRequest(t testing.TB, old, now *corev1.Pod, subresource string) *admissionv1.AdmissionRequest {
	t.Helper()
	req := podRequest(t, admissionv1.Update, now)
	raw, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	req.OldObject = runtime.RawExtension{Raw: raw}
	req.SubResource, req.RequestSubResource = subresource, subresource
	return req
}

// resized is p with its first container's memory limit (and request) set to memory.
func resized(p *corev1.Pod, memory string) *corev1.Pod {
	out := p.DeepCopy()
	q := resource.MustParse(memory)
	out.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory] = q
	out.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: q}
	return out
}

// reservedMemory is the memory the ledger of agents holds for uid, or -1.
func reservedMemory(t *testing.T, store *casConfigMaps, ledgerName, uid string) int64 {
	t.Helper()
	v, ok := store.entries(ledgerName)[uid]
	if !ok {
		return -1
	}
	r, err := parseReservation(v)
	if err != nil {
		t.Fatal(err)
	}
	return r.usage.MemoryBytes
}

type updateStep struct {
	name    string
	req     func(t *testing.T) *admissionv1.AdmissionRequest
	allowed bool
	want    []string // in the refusal
	notWant []string // not in the refusal
	check   func(t *testing.T)
}

func runSteps(t *testing.T, rev *Reviewer, steps []updateStep) {
	t.Helper()
	for _, st := range steps {
		resp := rev.Review(context.Background(), st.req(t))
		if resp.Allowed != st.allowed {
			t.Fatalf("%s: allowed = %v, want %v (%+v)", st.name, resp.Allowed, st.allowed, resp.Result)
		}
		if !st.allowed {
			checkRefusal(t, st.name, resp, st.want, st.notWant)
		}
		if st.check != nil {
			st.check(t)
		}
	}
}

// checkRefusal checks that resp, a refusal, is a 403 whose message names
// every one of want and none of notWant; errors start with what.
func checkRefusal(t *testing.T, what string, resp *admissionv1.AdmissionResponse, want, notWant []string) {
	t.Helper()
	if resp.Result.Code != http.StatusForbidden {
		t.Errorf("%s: code %d, want 403: %s", what, resp.Result.Code, resp.Result.Message)
	}
	for _, w := range want {
		if !strings.Contains(resp.Result.Message, w) {
			t.Errorf("%s: message %q lacks %q", what, resp.Result.Message, w)
		}
	}
	for _, w := range notWant {
		if strings.Contains(resp.Result.Message, w) {
			t.Errorf("%s: message %q names %q", what, resp.Result.Message, w)
		}
	}
}

// TestResizeIsJudgedAgainstTheLedger is issue 24's first hole at the
// webhook: a tenant with a 64Gi memory quota (agents) runs 2x30Gi and
// resizes one in place. A resize past the quota is refused naming
// quota.memory; one that shrinks is admitted but gives back nothing, so a
// later resize cannot use memory the node may still hold.
func TestResizeIsJudgedAgainstTheLedger(t *testing.T) {
	rev, store := ledgerReviewer(t)
	const ledger = "bulkhead-quota-t-agents"
	const gi = int64(1) << 30
	a := testPod("agents", "a", "uid-a", "", "30Gi", corev1.PodRunning)
	b := testPod("agents", "b", "uid-b", "", "30Gi", corev1.PodRunning)
	c := testPod("agents", "c", "uid-c", "", "4Gi", corev1.PodRunning)
	holds := func(uid string, want int64) func(t *testing.T) {
		return func(t *testing.T) {
			if got := reservedMemory(t, store, ledger, uid); got != want {
				t.Errorf("ledger holds %d bytes for %s, want %d", got, uid, want)
			}
		}
	}
	runSteps(t, rev, []updateStep{
		{name: "create a (30Gi)", req: func(t *testing.T) *admissionv1.AdmissionRequest { return podRequest(t, admissionv1.Create, a) }, allowed: true, check: holds("uid-a", 30*gi)},
		{name: "create b (30Gi)", req: func(t *testing.T) *admissionv1.AdmissionRequest { return podRequest(t, admissionv1.Create, b) }, allowed: true, check: holds("uid-b", 30*gi)},
		{name: "resize a to 60Gi: 90Gi of 64Gi", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return updateRequest(t, a, resized(a, "60Gi"), SubresourceResize)
		}, want: []string{`resize of pod "a" in namespace "agents"`, "[quota.memory]", `tenant "agents"`}, check: holds("uid-a", 30*gi)},
		{name: "a 4Gi pod fits in what is left (64Gi of 64Gi)", req: func(t *testing.T) *admissionv1.AdmissionRequest { return podRequest(t, admissionv1.Create, c) }, allowed: true, check: holds("uid-c", 4*gi)},
		{name: "resize a to 31Gi: 65Gi of 64Gi", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return updateRequest(t, a, resized(a, "31Gi"), SubresourceResize)
		}, want: []string{"[quota.memory]"}, check: holds("uid-a", 30*gi)},
		{name: "resize b down to 10Gi: admitted, the reservation kept", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return updateRequest(t, b, resized(b, "10Gi"), SubresourceResize)
		}, allowed: true, check: holds("uid-b", 30*gi)},
		{name: "resize a to 50Gi on b's shrink: refused, the node may still hold b's 30Gi", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return updateRequest(t, a, resized(a, "50Gi"), SubresourceResize)
		}, want: []string{"[quota.memory]"}, check: holds("uid-a", 30*gi)},
		{name: "b back to 30Gi: within what it holds", req: func(t *testing.T) *admissionv1.AdmissionRequest {
			return updateRequest(t, resized(b, "10Gi"), resized(b, "30Gi"), SubresourceResize)
		}, allowed: true, check: holds("uid-b", 30*gi)},
	})
	if got := store.entries(ledger); len(got) != 3 {
		t.Errorf("ledger: %v, want the three pods", got)
	}
}

// TestRequestAnnotationsImmutable is issue 24's third hole: on c746b90 an
// UPDATE that dropped a pod's GPU annotations re-charged its reservation
// to no GPU, and the tenant got more GPUs than its quota. A bulkhead.dev/
// annotation added, changed or removed on UPDATE is refused, naming the
// rule; other annotations change freely.
func TestRequestAnnotationsImmutable(t *testing.T) {
	rev, store := ledgerReviewer(t)
	const ledger = "bulkhead-quota-t-research"
	// research: standard tier, 28 GPU slices = 4 whole GPUs, one per pod.
	g1 := testPod("research", "g1", "uid-g1", policy.ProfileWhole, "8Gi", corev1.PodRunning)
	g1.Annotations[policy.AnnotationGPUCount] = "1"
	whole := func(i int) func(t *testing.T) *admissionv1.AdmissionRequest {
		return func(t *testing.T) *admissionv1.AdmissionRequest {
			return podRequest(t, admissionv1.Create, testPod("research", fmt.Sprintf("g%d", i), fmt.Sprintf("uid-g%d", i), policy.ProfileWhole, "8Gi", ""))
		}
	}
	slices := func(want int) func(t *testing.T) {
		return func(t *testing.T) {
			v, ok := store.entries(ledger)["uid-g1"]
			r, err := parseReservation(v)
			if !ok || err != nil || r.usage.GPUSlices != want {
				t.Errorf("g1's reservation %q (%v), want %d GPU slices", v, err, want)
			}
		}
	}
	edit := func(f func(map[string]string)) func(t *testing.T) *admissionv1.AdmissionRequest {
		return func(t *testing.T) *admissionv1.AdmissionRequest {
			now := g1.DeepCopy()
			f(now.Annotations)
			return updateRequest(t, g1, now, "")
		}
	}
	immutable := "[" + RuleRequestAnnotationImmutable + "]"
	runSteps(t, rev, []updateStep{
		{name: "create g1 with a whole GPU (7 slices)", req: func(t *testing.T) *admissionv1.AdmissionRequest { return podRequest(t, admissionv1.Create, g1) }, allowed: true, check: slices(7)},
		{name: "g2 (14 of 28 slices)", req: whole(2), allowed: true},
		{name: "g3 (21 of 28 slices)", req: whole(3), allowed: true},
		{name: "g4 (28 of 28 slices)", req: whole(4), allowed: true},
		{name: "remove the GPU annotations", req: edit(func(a map[string]string) {
			delete(a, policy.AnnotationGPUProfile)
			delete(a, policy.AnnotationGPUCount)
		}), want: []string{`pod "g1" in namespace "research" (tenant "research", tier "standard"`, immutable,
			`annotation bulkhead.dev/gpu-count removed (was "1")`, `annotation bulkhead.dev/gpu-profile removed (was "whole")`}, check: slices(7)},
		{name: "the quota still holds g1's GPU", req: whole(5), want: []string{"[quota.gpu_slices]"}},
		{name: "change the profile", req: edit(func(a map[string]string) { a[policy.AnnotationGPUProfile] = "1g.18gb" }),
			want: []string{immutable, `bulkhead.dev/gpu-profile changed from "whole" to "1g.18gb"`}, check: slices(7)},
		{name: "add an RDMA request", req: edit(func(a map[string]string) { a[policy.AnnotationRDMA] = "true" }),
			want: []string{immutable, `bulkhead.dev/rdma added ("true")`}},
		{name: "add an identity annotation that agrees with the namespace", req: edit(func(a map[string]string) { a["bulkhead.dev/tenant"] = "research" }),
			want: []string{immutable, "bulkhead.dev/tenant added"}},
		{name: "any key under the prefix", req: edit(func(a map[string]string) { a["bulkhead.dev/future-request"] = "x" }),
			want: []string{immutable}},
		{name: "a value no pod may hold is refused for the change alone", req: edit(func(a map[string]string) { a[policy.AnnotationGPUCount] = "9999" }),
			want: []string{immutable, `changed from "1" to "9999"`}, notWant: []string{"[gpu.", "[quota."}},
		{name: "other annotations change freely", req: edit(func(a map[string]string) { a["example.com/owner"] = "team-b" }), allowed: true, check: slices(7)},
	})

	// An UPDATE the API server would never send, without the old pod, is
	// refused: neither rule can be checked.
	req := podRequest(t, admissionv1.Update, g1)
	resp := rev.Review(context.Background(), req)
	if resp.Allowed || resp.Result.Code != http.StatusBadRequest || !strings.Contains(resp.Result.Message, "request.oldObject") {
		t.Errorf("UPDATE without oldObject: %+v, want a 400 naming request.oldObject", resp.Result)
	}
}

// TestPodUsageNeverShrinks: without a ledger (one replica counting from
// the pod informer), a live pod resized to less is still counted at the
// most it held; deleting it gives everything back.
func TestPodUsageNeverShrinks(t *testing.T) {
	u := &PodUsage{synced: func() bool { return true }, pods: map[types.UID]charge{}, namespaces: map[string]policy.Usage{}}
	p := testPod("agents", "p", "uid-p", "", "30Gi", corev1.PodRunning)
	u.set(p)
	u.set(resized(p, "2Gi"))
	s, _ := u.Snapshot("")
	if got := s["agents"].MemoryBytes; got != 30<<30 {
		t.Errorf("after a resize to 2Gi the pod counts %d bytes, want 30Gi", got)
	}
	u.set(resized(p, "40Gi"))
	if s, _ = u.Snapshot(""); s["agents"].MemoryBytes != 40<<30 || s["agents"].Sandboxes != 1 {
		t.Errorf("after a resize to 40Gi: %+v, want 1 sandbox of 40Gi", s["agents"])
	}
	u.remove(p.UID)
	if s, _ = u.Snapshot(""); len(s) != 0 {
		t.Errorf("after deletion: %v, want nothing", s)
	}
}

// TestTrimPodKeepsThePodLevelLimit: the informer's trimmed pod is charged
// what the pod itself is, a pod-level memory limit included (without it a
// pod whose containers set none was counted at 0 bytes).
func TestTrimPodKeepsThePodLevelLimit(t *testing.T) {
	p := testPod("agents", "p", "uid-p", "", "1Gi", corev1.PodRunning)
	delete(p.Spec.Containers[0].Resources.Limits, corev1.ResourceMemory)
	p.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("8Gi")}}
	trimmed, err := trimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := chargeOf(trimmed.(*corev1.Pod)), chargeOf(p); got != want || want.MemoryBytes != 8<<30 {
		t.Errorf("trimmed pod charged %+v, the pod %+v, want 8Gi both", got, want)
	}
	// A pod whose request annotations do not parse (one the informer sees
	// but the webhook never admitted) is still charged its pod-level limit.
	p.Annotations = map[string]string{policy.AnnotationGPUCount: "many"}
	if got := chargeOf(p); got.MemoryBytes != 8<<30 {
		t.Errorf("pod with a bad annotation charged %+v, want its pod-level 8Gi", got)
	}
}
