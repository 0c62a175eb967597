package admission

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// claimTemplates is a ClaimReader over a fixed set of templates and claims.
type claimTemplates map[string]*resourcev1.ResourceClaimSpec

func (c claimTemplates) ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error) {
	key := namespace + "/claim/" + name
	if template {
		key = namespace + "/template/" + name
	}
	if s, ok := c[key]; ok {
		return s, nil
	}
	return nil, errors.New("not found")
}

func exactly(class string, mode resourcev1.DeviceAllocationMode, count int64) *resourcev1.ResourceClaimSpec {
	return &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: mode, Count: count},
	}}}}
}

// TestReviewJudgesDRAClaims: a pod that asks for GPUs through a DRA claim
// template (the GKE sample's allocationMode All) is refused where a GPU
// is, and a claim that cannot be read is refused below trusted.
func TestReviewJudgesDRAClaims(t *testing.T) {
	allGPUs := exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeAll, 0)
	firstAvailable := &resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name: "gpu", FirstAvailable: []resourcev1.DeviceSubRequest{
			{Name: "big", DeviceClassName: "gpu.nvidia.com", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
			{Name: "small", DeviceClassName: "mig.nvidia.com", AllocationMode: resourcev1.DeviceAllocationModeExactCount},
		},
	}}}}
	nic := exactly("nic.example.com", resourcev1.DeviceAllocationModeExactCount, 1)
	// Bulkhead's own class: judged like the annotation once the selector,
	// in the form Bulkhead's driver documents, pins one profile.
	mig := func(selectors ...string) *resourcev1.ResourceClaimSpec {
		s := exactly(migdra.DeviceClassName, resourcev1.DeviceAllocationModeExactCount, 1)
		for _, e := range selectors {
			s.Devices.Requests[0].Exactly.Selectors = append(s.Devices.Requests[0].Exactly.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: e}})
		}
		return s
	}
	tests := []struct {
		name    string
		ns      string
		reader  ClaimReader
		runc    bool // the pod on RuntimeClass bulkhead-runc instead of bulkhead (gVisor)
		allowed bool
		want    []string
	}{
		{name: "no reader, untrusted", ns: "agents", want: []string{"[workload.claim_unread]", `resource claim "gpu" (template "all-gpus")`}},
		{name: "no reader, standard", ns: "research", want: []string{"[workload.claim_unread]"}},
		{name: "no reader, trusted", ns: "platform", allowed: true},
		{name: "template missing", ns: "agents", reader: claimTemplates{}, want: []string{"[workload.claim_unread]"}},
		{name: "all GPUs, untrusted", ns: "agents", reader: claimTemplates{"agents/template/all-gpus": allGPUs},
			want: []string{"[gpu.dra_forbidden]", "every matching device", `"gpu.nvidia.com"`}},
		{name: "all GPUs, standard", ns: "research", reader: claimTemplates{"research/template/all-gpus": allGPUs}, want: []string{"[gpu.dra_forbidden]"}},
		{name: "all GPUs, trusted", ns: "platform", reader: claimTemplates{"platform/template/all-gpus": allGPUs}, allowed: true},
		{name: "first available", ns: "agents", reader: claimTemplates{"agents/template/all-gpus": firstAvailable},
			want: []string{`request "gpu/big") for 1 device(s)`, `request "gpu/small") for 1 device(s) of GPU device class "mig.nvidia.com"`}},
		{name: "other class", ns: "agents", reader: claimTemplates{"agents/template/all-gpus": nic}, want: []string{"[workload.device_class]", `"nic.example.com"`}},
		{name: "bulkhead MIG slice, trusted, runc", ns: "platform", runc: true, reader: claimTemplates{"platform/template/all-gpus": mig(migdra.ProfileSelector("3g.71gb"))}, allowed: true},
		{name: "bulkhead MIG slice, trusted, gVisor", ns: "platform", reader: claimTemplates{"platform/template/all-gpus": mig(migdra.ProfileSelector("3g.71gb"))},
			want: []string{"[gpu.mig_in_gvisor]", `profile "3g.71gb" is a MIG slice claimed through DRA`}},
		{name: "bulkhead MIG slice of no known profile", ns: "platform", runc: true, reader: claimTemplates{"platform/template/all-gpus": mig(migdra.ProfileSelector("9g.999gb"))},
			want: []string{"[gpu.profile_unknown]", `"9g.999gb"`}},
		{name: "bulkhead MIG slice, no profile pinned", ns: "platform", runc: true, reader: claimTemplates{"platform/template/all-gpus": mig()},
			want: []string{"[gpu.dra_profile_unpinned]", `"mig.bulkhead.dev"`}},
	}
	_, review := readReview(t, "pod-dra-gpu.json")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev, err := NewReviewer(Options{Decider: openEngine(t), Claims: tt.reader})
			if err != nil {
				t.Fatal(err)
			}
			req := review.Request.DeepCopy()
			req.Namespace = tt.ns
			if tt.runc {
				raw := regexp.MustCompile(`"runtimeClassName":\s*"bulkhead"`).ReplaceAllString(string(req.Object.Raw), `"runtimeClassName":"bulkhead-runc"`)
				if raw == string(req.Object.Raw) {
					t.Fatal("the fixture names no runtimeClassName bulkhead to change")
				}
				req.Object.Raw = []byte(raw)
			}
			resp := rev.Review(context.Background(), req)
			if resp.Allowed != tt.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, tt.allowed, resp.Result)
			}
			if tt.allowed {
				return
			}
			if resp.Result.Code != http.StatusForbidden {
				t.Errorf("code = %d, want 403", resp.Result.Code)
			}
			for _, w := range tt.want {
				if !strings.Contains(resp.Result.Message, w) {
					t.Errorf("message %q lacks %q", resp.Result.Message, w)
				}
			}
		})
	}
}

// TestResourceClaimsInInput: the pod spec's claims reach the input by name,
// an existing claim read as such.
func TestResourceClaimsInInput(t *testing.T) {
	pod := podWith(`"memory":"1Gi"`)
	pod = strings.Replace(pod, `"spec":{`, `"spec":{"resourceClaims":[{"name":"a","resourceClaimName":"shared"},{"name":"b","resourceClaimTemplateName":"t"},{"name":"c"}],`, 1)
	p, err := podOf(kindPod, []byte(pod))
	if err != nil {
		t.Fatal(err)
	}
	in, err := inputFor("agents", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	readClaims("agents", in.Pod.ResourceClaims, claimTemplates{"agents/claim/shared": exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeExactCount, 0)})
	got := in.Pod.ResourceClaims
	if len(got) != 3 || got[0].ClaimName != "shared" || !got[0].Read || got[1].TemplateName != "t" || got[1].Read || got[2].Read {
		t.Fatalf("claims = %+v", got)
	}
	if r := got[0].Requests; len(r) != 1 || r[0].DeviceClass != "gpu.nvidia.com" || r[0].Count != 1 || r[0].AllocationMode != "ExactCount" {
		t.Errorf("requests = %+v, want one ExactCount of 1 on gpu.nvidia.com", r)
	}
}
