package admission

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// claimRequest is the CREATE of a ResourceClaim (or, with template, a
// ResourceClaimTemplate) name in namespace ns asking for spec.
func claimRequest(t testing.TB, template bool, ns, name string, spec *resourcev1.ResourceClaimSpec) *admissionv1.AdmissionRequest {
	t.Helper()
	gvk, resource := kindResourceClaim, "resourceclaims"
	meta := metav1.ObjectMeta{Name: name, Namespace: ns}
	var obj any = &resourcev1.ResourceClaim{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: gvk.Kind}, ObjectMeta: meta, Spec: *spec}
	if template {
		gvk, resource = kindResourceClaimTemplate, "resourceclaimtemplates"
		obj = &resourcev1.ResourceClaimTemplate{TypeMeta: metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: gvk.Kind}, ObjectMeta: meta,
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: *spec}}
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("req-claim-" + name),
		Kind:      metav1.GroupVersionKind(gvk),
		Resource:  metav1.GroupVersionResource(schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource}),
		Namespace: ns,
		Name:      name,
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: raw},
	}
}

// TestResourceClaimsAreJudged: a ResourceClaim or ResourceClaimTemplate is
// judged on its own by the DRA rules its namespace's tier applies to a
// pod's claims, and refused only for what the claim adds (not for what
// any pod of the namespace would lack, such as a RuntimeClass).
func TestResourceClaimsAreJudged(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	allGPUs := exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeAll, 0)
	oneMIG := exactly("mig.nvidia.com", resourcev1.DeviceAllocationModeExactCount, 1)
	nic := exactly("nic.example.com", resourcev1.DeviceAllocationModeExactCount, 2)
	empty := &resourcev1.ResourceClaimSpec{}
	tests := []struct {
		name     string
		template bool
		ns       string
		spec     *resourcev1.ResourceClaimSpec
		allowed  bool
		want     []string
	}{
		{name: "claim for all GPUs, untrusted", ns: "agents", spec: allGPUs,
			want: []string{`resourceclaim "c" in namespace "agents" (tenant "agents", tier "untrusted"`, "[gpu.dra_forbidden]", `resource claim "c" (claim "c")`, "every matching device"}},
		{name: "template for a MIG slice, standard", template: true, ns: "research", spec: oneMIG,
			want: []string{`resourceclaimtemplate "c"`, "[gpu.dra_forbidden]", `(template "c")`, `1 device(s) of GPU device class "mig.nvidia.com"`}},
		{name: "claim for another class, untrusted", ns: "agents-batch", spec: nic, want: []string{"[workload.device_class]", `"nic.example.com"`}},
		{name: "template for all GPUs, trusted", template: true, ns: "platform", spec: allGPUs, allowed: true},
		{name: "claim for another class, trusted", ns: "platform", spec: nic, allowed: true},
		{name: "a claim asking for nothing, untrusted", ns: "agents", spec: empty, allowed: true},
		{name: "a namespace of no tenant gets the most restrictive settings", ns: "default", spec: oneMIG, want: []string{"[gpu.dra_forbidden]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := rev.Review(context.Background(), claimRequest(t, tt.template, tt.ns, "c", tt.spec))
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				if len(resp.Warnings) != 0 {
					t.Errorf("warnings %q: a claim is not a pod (no memory limit to miss)", resp.Warnings)
				}
				return
			}
			// Not what any pod of the namespace would lack: the claim does
			// not add them.
			checkRefusal(t, tt.name, resp, tt.want, []string{"runtime.handler_required", "quota.memory_limit_missing"})
		})
	}
}

// TestClaimSwapAfterAdmission is issue 24's suspicion about claims, proven:
// a pod is judged on its claim as the reader sees it at admission; the
// claim (immutable, but deletable) is then re-created under the same name
// asking for every GPU, before the scheduler allocates it. On c746b90 no
// rule sent the new claim to the webhook, and the handler could not read
// one; now its CREATE is refused by the rule the pod would have met.
func TestClaimSwapAfterAdmission(t *testing.T) {
	reader := claimTemplates{"agents/claim/c": &resourcev1.ResourceClaimSpec{}}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Claims: reader})
	if err != nil {
		t.Fatal(err)
	}
	pod := testPod("agents", "p", "uid-p", "", "1Gi", "")
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "c", ResourceClaimName: new("c")}}
	if resp := rev.Review(context.Background(), podRequest(t, admissionv1.Create, pod)); !resp.Allowed {
		t.Fatalf("the pod with an empty claim was refused: %+v", resp.Result)
	}
	// kubectl delete resourceclaim c; kubectl create -f all-gpus-claim-c.yaml
	swap := exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeAll, 0)
	resp := rev.Review(context.Background(), claimRequest(t, false, "agents", "c", swap))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "[gpu.dra_forbidden]") {
		t.Fatalf("the swapped claim: %+v, want a refusal naming gpu.dra_forbidden", resp.Result)
	}
	// The pod, judged with the claim as swapped, meets the same rule.
	reader["agents/claim/c"] = swap
	if resp := rev.Review(context.Background(), podRequest(t, admissionv1.Create, pod)); resp.Allowed || !strings.Contains(resp.Result.Message, "[gpu.dra_forbidden]") {
		t.Errorf("the pod with the swapped claim: %+v, want the same rule", resp.Result)
	}
}

// TestClaimReviewFailsClosed: an unreadable claim is a 400 naming it, a
// policy error a 500, and a claim on its way out passes.
func TestClaimReviewFailsClosed(t *testing.T) {
	failing := staticDecider{decision: policy.Decision{Reasons: []policy.Reason{{Rule: policy.RuleError, Message: "boom"}}}, err: errors.New("evaluation failed")}
	rev, err := NewReviewer(Options{Decider: failing})
	if err != nil {
		t.Fatal(err)
	}
	req := claimRequest(t, false, "agents", "c", &resourcev1.ResourceClaimSpec{})
	if resp := rev.Review(context.Background(), req); resp.Allowed || resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, "policy evaluation failed (fail closed)") {
		t.Errorf("policy error: %+v, want a 500", resp.Result)
	}
	bad := req.DeepCopy()
	bad.Object.Raw = []byte(`{"spec":{"devices":7}}`)
	if resp := rev.Review(context.Background(), bad); resp.Allowed || resp.Result.Code != 400 || !strings.Contains(resp.Result.Message, `resourceclaim "c" in namespace "agents": object: decoding ResourceClaim`) {
		t.Errorf("bad object: %+v, want a 400 naming the claim", resp.Result)
	}
	leaving := req.DeepCopy()
	leaving.Operation = admissionv1.Update
	leaving.Object.Raw = []byte(`{"metadata":{"name":"c","deletionTimestamp":"2026-12-04T10:00:00Z"},"spec":{}}`)
	if resp := rev.Review(context.Background(), leaving); !resp.Allowed {
		t.Errorf("update of a claim being deleted: %+v, want allowed", resp.Result)
	}
}

// BenchmarkClaimReview: a claim costs two decisions (with and without it);
// compare with BenchmarkPodUpdateReview, one decision plus the old pod's
// decoding.
func BenchmarkClaimReview(b *testing.B) {
	rev, err := NewReviewer(Options{Decider: openEngine(b)})
	if err != nil {
		b.Fatal(err)
	}
	req := claimRequest(b, false, "agents", "c", exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeExactCount, 1))
	for b.Loop() {
		if resp := rev.Review(context.Background(), req); resp.Allowed {
			b.Fatal("allowed")
		}
	}
}

func BenchmarkPodUpdateReview(b *testing.B) {
	rev, err := NewReviewer(Options{Decider: openEngine(b)})
	if err != nil {
		b.Fatal(err)
	}
	p := testPod("agents", "p", "uid-p", "", "1Gi", corev1.PodRunning)
	req := updateRequest(b, p, resized(p, "2Gi"), SubresourceResize)
	for b.Loop() {
		if resp := rev.Review(context.Background(), req); !resp.Allowed {
			b.Fatal(resp.Result.Message)
		}
	}
}
