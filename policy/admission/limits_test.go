package admission

import (
	"context"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

func memoryLimits(q string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(q)}}
}

// TestInputForMemoryLimits: each container carries the memory limit the
// kubelet will give it (its own, else the pod-level spec.resources limit,
// else none), and the pod's request is what the kubelet charges the pod's
// cgroup and containerd's sandbox-memory (the pod-level limit, else the
// containers' effective sum where a container without a limit counts 0).
func TestInputForMemoryLimits(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name    string
		spec    corev1.PodSpec
		want    map[string]int64 // container name -> memory_bytes
		request int64
	}{
		{name: "1Mi beside an unlimited sidecar", spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "main", Resources: memoryLimits("1Mi")}, {Name: "sidecar"},
		}}, want: map[string]int64{"main": 1 << 20, "sidecar": 0}, request: 1 << 20},
		{name: "a limit of 0 is none", spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "main", Resources: memoryLimits("1Mi")}, {Name: "zero", Resources: memoryLimits("0")},
		}}, want: map[string]int64{"main": 1 << 20, "zero": 0}, request: 1 << 20},
		{name: "init, native sidecar and ephemeral containers", spec: corev1.PodSpec{
			InitContainers:      []corev1.Container{{Name: "setup", Resources: memoryLimits("2Mi")}, {Name: "proxy", RestartPolicy: &always}},
			Containers:          []corev1.Container{{Name: "main", Resources: memoryLimits("1Mi")}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}},
		}, want: map[string]int64{"setup": 2 << 20, "proxy": 0, "main": 1 << 20, "debug": 0}, request: 2 << 20},
		{name: "pod-level limit bounds the containers without one", spec: corev1.PodSpec{
			Resources:           &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}},
			Containers:          []corev1.Container{{Name: "main", Resources: memoryLimits("1Mi")}, {Name: "sidecar"}},
			EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}},
		}, want: map[string]int64{"main": 1 << 20, "sidecar": 2 << 30, "debug": 2 << 30}, request: 2 << 30},
		{name: "pod-level limit is the pod's charge", spec: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("60Gi")}},
			Containers: []corev1.Container{{Name: "main", Resources: memoryLimits("1Mi")}},
		}, want: map[string]int64{"main": 1 << 20}, request: 60 << 30},
		{name: "pod-level request alone bounds nothing", spec: corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
			Containers: []corev1.Container{{Name: "main", Resources: memoryLimits("1Mi")}, {Name: "sidecar"}},
		}, want: map[string]int64{"main": 1 << 20, "sidecar": 0}, request: 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, err := inputFor("agents", podObject{Workload: "Pod", Name: "p", Spec: tt.spec}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for name, c := range containersByName(t, in) {
				got[name] = c.MemoryBytes
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("memory_bytes = %v, want %v", got, tt.want)
			}
			if in.Request.MemoryBytes != tt.request {
				t.Errorf("request.memory_bytes = %d, want %d", in.Request.MemoryBytes, tt.request)
			}
		})
	}
}

// TestInputForPodLevelMemoryBounds: a pod-level memory limit is refused,
// naming the field, where a container's would be.
func TestInputForPodLevelMemoryBounds(t *testing.T) {
	for q, want := range map[string]string{
		"-1Mi": "spec.resources.limits.memory: -1Mi is negative",
		"2Pi":  "spec.resources.limits.memory: 2Pi is more memory than any node has",
	} {
		spec := corev1.PodSpec{
			Resources:  &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(q)}},
			Containers: []corev1.Container{{Name: "main"}},
		}
		_, err := inputFor("agents", podObject{Workload: "Pod", Name: "p", Spec: spec}, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("pod-level limit %s: err = %v, want %q", q, err, want)
		}
	}
}

// enforcingEngine opens testBundle with data.bulkhead.enforcement set to
// enforcement (the signed bundle's setting), with the test tenants.
func enforcingEngine(t *testing.T, enforcement map[string]string) *policy.Engine {
	t.Helper()
	return openEngineOn(t, testBundle(t, policytest.Enforcement(enforcement)))
}

// TestReviewUnlimitedSidecar is issue 24's attack at the webhook: a 1Mi
// container beside one without a memory limit was charged 1Mi and read as
// limited. The sidecar's missing limit is named; with
// quota.memory_limit_missing: deny the pod is refused (and kubectl debug,
// whose container can set no limit, unless the pod sets a pod-level one),
// and by default it is a warning.
func TestReviewUnlimitedSidecar(t *testing.T) {
	attack := func() *corev1.Pod {
		p := testPod("agents", "sidecar-pod", "uid-sidecar", "", "1Mi", corev1.PodPending)
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "sidecar", Image: digestImage})
		return p
	}
	podLevel := func() *corev1.Pod {
		p := attack()
		p.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
		return p
	}
	debugged := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers = p.Spec.Containers[:1]
		addEphemeral(nil)(p)
		return p
	}
	tests := []struct {
		name  string
		pod   *corev1.Pod
		debug bool
		want  string // the container named; "" when every container is bounded
	}{
		{name: "1Mi beside an unlimited sidecar", pod: attack(), want: `container "sidecar" sets no memory limit`},
		{name: "unlimited native sidecar", pod: func() *corev1.Pod {
			p := testPod("agents", "sidecar-pod", "uid-sidecar", "", "1Mi", corev1.PodPending)
			always := corev1.ContainerRestartPolicyAlways
			p.Spec.InitContainers = []corev1.Container{{Name: "proxy", Image: digestImage, RestartPolicy: &always}}
			return p
		}(), want: `container "proxy" sets no memory limit`},
		{name: "kubectl debug", pod: debugged(testPod("agents", "sidecar-pod", "uid-sidecar", "", "1Mi", corev1.PodRunning)), debug: true,
			want: `ephemeral container "debugger" sets no memory limit`},
		{name: "pod-level limit bounds the sidecar", pod: podLevel()},
		{name: "kubectl debug under a pod-level limit", pod: debugged(podLevel()), debug: true},
	}
	warn, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	deny, err := NewReviewer(Options{Decider: enforcingEngine(t, map[string]string{"quota.memory_limit_missing": "deny"})})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := podRequest(t, admissionv1.Create, tt.pod)
			if tt.debug {
				req = debugRequest(t, tt.pod)
			}
			w := warn.Review(context.Background(), req)
			if !w.Allowed {
				t.Fatalf("default bundle refused: %+v", w.Result)
			}
			warned := strings.Join(w.Warnings, "\n")
			switch {
			case tt.want == "" && strings.Contains(warned, "quota.memory_limit_missing"):
				t.Errorf("warnings %q name a missing limit, want none", w.Warnings)
			case tt.want != "" && (!strings.Contains(warned, "quota.memory_limit_missing") || !strings.Contains(warned, tt.want)):
				t.Errorf("warnings %q lack quota.memory_limit_missing: %s", w.Warnings, tt.want)
			}
			d := deny.Review(context.Background(), req)
			switch {
			case tt.want == "" && !d.Allowed:
				t.Errorf("deny bundle refused a bounded pod: %+v", d.Result)
			case tt.want != "" && (d.Allowed || !strings.Contains(d.Result.Message, "[quota.memory_limit_missing] ") || !strings.Contains(d.Result.Message, tt.want)):
				t.Errorf("deny bundle: allowed=%v %+v, want a refusal naming quota.memory_limit_missing: %s", d.Allowed, d.Result, tt.want)
			}
		})
	}
}

// TestReviewVolumeTypes: below trusted only Pod Security "restricted"'s
// volume types pass the webhook (workload.volume_type); an inline NFS,
// iSCSI, FC, FlexVolume, RBD, gitRepo or image volume is refused whether a
// container mounts it or not, and the trusted tier allows any.
func TestReviewVolumeTypes(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		source corev1.VolumeSource
		want   string // the type named in the untrusted tenant's refusal; "" allows
	}{
		{name: "emptyDir", source: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{name: "claim", source: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
		{name: "inline CSI", source: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "secrets-store.csi.k8s.io"}}},
		{name: "generic ephemeral", source: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
		{name: "NFS", source: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "10.0.0.9", Path: "/export"}}, want: "of type nfs"},
		{name: "iSCSI", source: corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{TargetPortal: "10.0.0.9:3260", IQN: "iqn.2001-04.com.example:x", Lun: 0}}, want: "of type iscsi"},
		{name: "FC", source: corev1.VolumeSource{FC: &corev1.FCVolumeSource{WWIDs: []string{"3600508b400105e210000900000490000"}}}, want: "of type fc"},
		{name: "FlexVolume", source: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "example.com/cifs"}}, want: "of type flexVolume"},
		{name: "RBD", source: corev1.VolumeSource{RBD: &corev1.RBDVolumeSource{CephMonitors: []string{"10.0.0.9"}, RBDImage: "x"}}, want: "of type rbd"},
		{name: "gitRepo", source: corev1.VolumeSource{GitRepo: &corev1.GitRepoVolumeSource{Repository: "https://example.com/x.git"}}, want: "of type gitRepo"},
		{name: "image", source: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: digestImage}}, want: "of type image"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, mounted := range []bool{true, false} {
				for _, ns := range []string{"agents", "research", "platform"} {
					p := testPod(ns, "vol-pod", "uid-vol", "", "1Gi", corev1.PodPending)
					p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: tt.source}}
					if mounted {
						p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}
					}
					resp := rev.Review(context.Background(), podRequest(t, admissionv1.Create, p))
					refused := tt.want != "" && ns != "platform"
					switch {
					case !refused && !resp.Allowed:
						t.Errorf("%s (mounted %v): refused %+v", ns, mounted, resp.Result)
					case refused && (resp.Allowed || !strings.Contains(resp.Result.Message, "[workload.volume_type] ") || !strings.Contains(resp.Result.Message, tt.want)):
						t.Errorf("%s (mounted %v): allowed=%v %+v, want workload.volume_type naming %q", ns, mounted, resp.Allowed, resp.Result, tt.want)
					}
				}
			}
		})
	}
}
