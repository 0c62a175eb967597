package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// TestReviewRefusesUnknownOperations: only CREATE and UPDATE are judged and
// only DELETE and CONNECT pass unjudged; anything else, a mis-spelling or
// an empty operation included, is refused with a reason naming the field.
func TestReviewRefusesUnknownOperations(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, base := readReview(t, "pod-allowed.json")
	tests := []struct {
		op      admissionv1.Operation
		allowed bool
	}{
		{op: admissionv1.Create, allowed: true},
		{op: admissionv1.Update, allowed: true},
		{op: admissionv1.Delete, allowed: true},
		{op: admissionv1.Connect, allowed: true},
		{op: ""},
		{op: "create"},
		{op: "Update"},
		{op: "PATCH"},
		{op: "CREATE "},
	}
	for _, tt := range tests {
		t.Run(string(tt.op), func(t *testing.T) {
			req := base.Request.DeepCopy()
			req.Operation = tt.op
			if tt.op == admissionv1.Update {
				req.OldObject = req.Object // an UPDATE that changes nothing
			}
			resp := rev.Review(context.Background(), req)
			if resp.UID != req.UID {
				t.Errorf("uid = %q, want %q", resp.UID, req.UID)
			}
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				return
			}
			if resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
				t.Fatalf("result = %+v, want 400", resp.Result)
			}
			for _, w := range []string{"request.operation", `pod "agent-1"`} {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		})
	}
}

// reviewOf wraps object (JSON) of kind in namespace as a CREATE request.
func reviewOf(t testing.TB, namespace string, kind schema.GroupVersionKind, object string) *admissionv1.AdmissionRequest {
	t.Helper()
	if !json.Valid([]byte(object)) {
		t.Fatalf("fixture is not JSON: %s", object)
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-" + namespace),
		Kind:      metav1.GroupVersionKind(kind),
		Namespace: namespace,
		Name:      "p",
		Operation: admissionv1.Create,
		Object:    runtime.RawExtension{Raw: []byte(object)},
	}
}

// podWith is a pod "p" on the bulkhead RuntimeClass whose containers have
// the given memory limits (JSON strings) and extra limits.
func podWith(limits ...string) string {
	var cs []string
	for i, l := range limits {
		cs = append(cs, fmt.Sprintf(`{"name":"c%d","image":"registry.local/app@sha256:%064d","resources":{"limits":{%s}}}`, i, 0, l))
	}
	return `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"runtimeClassName":"bulkhead","containers":[` + strings.Join(cs, ",") + `]}}`
}

// TestReviewRefusesAbsurdQuantities: memory and GPU quantities that are
// negative or beyond any node are refused with the field named, in every
// tier, instead of wrapping the pod's total (two 4Ei limits once summed to
// a negative number that passed every memory rule).
func TestReviewRefusesAbsurdQuantities(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	deployment := func(pod string) string {
		var p map[string]any
		_ = json.Unmarshal([]byte(pod), &p)
		b, _ := json.Marshal(map[string]any{
			"apiVersion": "apps/v1", "kind": "Deployment", "metadata": map[string]any{"name": "p"},
			"spec": map[string]any{"selector": map[string]any{}, "template": map[string]any{"metadata": map[string]any{}, "spec": p["spec"]}},
		})
		return string(b)
	}
	tests := []struct {
		name   string
		kind   schema.GroupVersionKind
		object string
		// want are substrings of a 400's message; none means allowed (or
		// refused by a rule, code 403, when forbidden is set).
		want      []string
		forbidden bool
	}{
		{name: "two 4Ei", kind: kindPod, object: podWith(`"memory":"4Ei"`, `"memory":"4Ei"`),
			want: []string{"spec.containers[0].resources.limits.memory", "4Ei", "more memory than any node"}},
		{name: "two 4Ei in a deployment", kind: kindDeployment, object: deployment(podWith(`"memory":"4Ei"`, `"memory":"4Ei"`)),
			want: []string{`deployment "p"`, "spec.template.spec.containers[0].resources.limits.memory"}},
		{name: "sum above any node", kind: kindPod, object: podWith(`"memory":"600Ti"`, `"memory":"600Ti"`),
			want: []string{"spec.containers[*].resources.limits.memory", "add up to 1200Ti"}},
		{name: "1e30 reads as 0", kind: kindPod, object: podWith(`"memory":"1e30"`),
			want: []string{"spec.containers[0].resources.limits.memory", "1e30"}},
		{name: "negative memory", kind: kindPod, object: podWith(`"memory":"64Gi"`, `"memory":"-64Gi"`),
			want: []string{"spec.containers[1].resources.limits.memory", "negative"}},
		{name: "negative request", kind: kindPod, object: podWith(`"memory":"1Gi"},"requests":{"memory":"-1Gi"`),
			want: []string{"spec.containers[0].resources.requests.memory", "negative"}},
		{name: "GPU 1e30 reads as 0", kind: kindPod, object: podWith(`"memory":"1Gi","nvidia.com/gpu":"1e30"`),
			want: []string{"spec.containers[0].resources.limits[nvidia.com/gpu]", "at most"}},
		{name: "negative GPU cancels a GPU", kind: kindPod, object: podWith(`"memory":"1Gi","nvidia.com/gpu":"1"`, `"memory":"1Gi","nvidia.com/gpu":"-1"`),
			want: []string{"spec.containers[1].resources.limits[nvidia.com/gpu]", "negative"}},
		{name: "ordinary limits pass", kind: kindPod, object: podWith(`"memory":"2Gi"`, `"memory":"2Gi"`)},
		{name: "a whole GPU is judged, not lost", kind: kindPod, object: podWith(`"memory":"1Gi","nvidia.com/gpu":"1"`), forbidden: true},
	}
	for _, tt := range tests {
		for _, ns := range []string{"agents", "research", "platform"} {
			t.Run(tt.name+"/"+ns, func(t *testing.T) {
				req := reviewOf(t, ns, tt.kind, tt.object)
				resp := rev.Review(context.Background(), req)
				if resp.UID != req.UID {
					t.Errorf("uid = %q, want %q", resp.UID, req.UID)
				}
				switch {
				case len(tt.want) > 0:
					if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest {
						t.Fatalf("allowed = %v, result %+v; want a 400", resp.Allowed, resp.Result)
					}
					for _, w := range tt.want {
						if !strings.Contains(resp.Result.Message, w) {
							t.Errorf("message %q lacks %q", resp.Result.Message, w)
						}
					}
				case tt.forbidden && ns == "agents":
					if resp.Allowed || resp.Result.Code != http.StatusForbidden {
						t.Fatalf("allowed = %v, result %+v; want a 403", resp.Allowed, resp.Result)
					}
				case !tt.forbidden:
					if !resp.Allowed {
						t.Fatalf("refused: %+v", resp.Result)
					}
				}
			})
		}
	}
}

// TestEffectiveLimitSaturates: however many limits are added, the total
// never wraps below one of them.
func TestEffectiveLimitSaturates(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	half := int64(math.MaxInt64/2 + 1)
	tests := []struct {
		name string
		spec corev1.PodSpec
		vals map[string]int64
		want int64
	}{
		{name: "two halves", spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}},
			vals: map[string]int64{"a": half, "b": half}, want: math.MaxInt64},
		{name: "sidecar and app", spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}}, InitContainers: []corev1.Container{{Name: "s", RestartPolicy: &always}}},
			vals: map[string]int64{"a": half, "s": math.MaxInt64}, want: math.MaxInt64},
		{name: "negative counts as zero", spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}},
			vals: map[string]int64{"a": 5, "b": -5}, want: 5},
		{name: "plain sum", spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}, InitContainers: []corev1.Container{{Name: "i"}}},
			vals: map[string]int64{"a": 2, "b": 3, "i": 4}, want: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := effectiveLimit(tt.spec, func(c corev1.Container) int64 { return tt.vals[c.Name] })
			if got != tt.want {
				t.Errorf("effectiveLimit = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestHostPathPatternMatchesItsRoot: "/dev/**" allows /dev itself (three
// real DaemonSets mount the host's /dev), paths are judged cleaned, and a
// refusal never quotes a rule that would have allowed the path.
func TestHostPathPatternMatchesItsRoot(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	daemonSet := func(hostPath string) string {
		return `{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"agent"},"spec":{"selector":{},"template":{"spec":{` +
			`"containers":[{"name":"newrelic","image":"newrelic/infrastructure-k8s:2.13.6","volumeMounts":[{"name":"dev","mountPath":"/dev"}]}],` +
			`"volumes":[{"name":"dev","hostPath":{"path":"` + hostPath + `"}}]}}}}`
	}
	tests := []struct {
		ns, hostPath string
		allowed      bool
		want         string
	}{
		{ns: "platform", hostPath: "/dev", allowed: true},
		{ns: "platform", hostPath: "/dev/", allowed: true},
		{ns: "platform", hostPath: "//dev/kvm", allowed: true},
		{ns: "platform", hostPath: "/var/../dev", allowed: true},
		{ns: "research", hostPath: "/dev", want: `container "newrelic" asks for host device /dev; tier "standard" allows []`},
		{ns: "research", hostPath: "//dev/kvm", want: `asks for host device /dev/kvm;`},
	}
	for _, tt := range tests {
		t.Run(tt.ns+tt.hostPath, func(t *testing.T) {
			resp := rev.Review(context.Background(), reviewOf(t, tt.ns, kindDaemonSet, daemonSet(tt.hostPath)))
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				return
			}
			if !strings.Contains(resp.Result.Message, tt.want) || strings.Contains(resp.Result.Message, "/dev/**") {
				t.Errorf("message %q: want %q and no allow-list that covers the path", resp.Result.Message, tt.want)
			}
		})
	}
}
