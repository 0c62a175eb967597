package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// debugRequest is the AdmissionRequest kubectl debug causes: an UPDATE of
// the pods/ephemeralcontainers subresource whose object is the whole pod.
func debugRequest(t testing.TB, p *corev1.Pod) *admissionv1.AdmissionRequest {
	t.Helper()
	return updateRequest(t, p, p, SubresourceEphemeralContainers)
}

// mountHostPath adds hostPath volume name for path and mounts it in the
// pod's first container, with subPath.
func mountHostPath(name, path, subPath string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, hostPathVolume(name, path))
		c := &p.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: "/mnt/" + name, SubPath: subPath})
	}
}

func addCapability(cp corev1.Capability) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{cp}}}
	}
}

func addEphemeral(sc *corev1.SecurityContext) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
			TargetContainerName:      "main",
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: digestImage, SecurityContext: sc},
		})
	}
}

// TestReviewHostAccess runs pods that ask the host for something through
// the real default bundle: the untrusted tenant (namespace agents) is
// refused each, with the rule that says why, and the trusted tenant
// (namespace platform) is allowed what its tier allows.
func TestReviewHostAccess(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	tests := []struct {
		name   string
		mutate func(*corev1.Pod)
		// debug sends the pod as kubectl debug does (ephemeralcontainers UPDATE).
		debug bool
		// want are substrings of the untrusted tenant's refusal.
		want []string
		// trustedDenies are substrings of the trusted tenant's refusal; none
		// means the trusted tier allows the pod.
		trustedDenies []string
	}{
		{name: "host root", mutate: mountHostPath("root", "/", ""), want: []string{"[workload.host_path]", `host path "/"`}},
		{name: "kubelet pods", mutate: mountHostPath("pods", "/var/lib/kubelet/pods", ""), want: []string{"[workload.host_path]", `"/var/lib/kubelet/pods"`}},
		{name: "bulkhead config", mutate: mountHostPath("config", "/etc/bulkhead", ""), want: []string{"[workload.host_path]", `"/etc/bulkhead"`}},
		{name: "bulkhead ledger", mutate: mountHostPath("ledger", "/var/lib/bulkhead", ""), want: []string{"[workload.host_path]", `"/var/lib/bulkhead"`}},
		{name: "double slash uverbs", mutate: mountHostPath("uverbs", "//dev/infiniband/uverbs0", ""),
			want:          []string{"[rdma.device_forbidden]", "/dev/infiniband/uverbs0", "[workload.host_path]"},
			trustedDenies: []string{"[rdma.device_forbidden]"}},
		{name: "root with subPath to infiniband", mutate: mountHostPath("root", "/", "dev/infiniband"),
			want:          []string{"[rdma.device_forbidden]", "/dev/infiniband", "[workload.host_path]"},
			trustedDenies: []string{"[rdma.device_forbidden]"}},
		{name: "host path volume mounted by no container", mutate: func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, hostPathVolume("idle", "/var/lib/kubelet"))
		}, want: []string{"[workload.host_path]", `volume "idle"`, `"/var/lib/kubelet"`}},
		{name: "SYS_ADMIN", mutate: addCapability("SYS_ADMIN"), want: []string{"[workload.capability]", "SYS_ADMIN"}},
		{name: "NET_ADMIN", mutate: addCapability("NET_ADMIN"), want: []string{"[workload.capability]", "NET_ADMIN"}},
		{name: "NET_RAW", mutate: addCapability("NET_RAW"), want: []string{"[workload.capability]", "NET_RAW"}},
		{name: "cap_sys_admin spelt otherwise", mutate: addCapability("cap_sys_admin"), want: []string{"[workload.capability]", "SYS_ADMIN"}},
		{name: "host port", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}
		}, want: []string{"[workload.host_port]", "8080"}},
		{name: "unsafe sysctl", mutate: func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}}}
		}, want: []string{"[workload.sysctl]", "kernel.msgmax"}},
		{name: "seccomp Unconfined", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		}, want: []string{"[workload.unconfined]", "seccomp"}},
		{name: "pod-wide seccomp Unconfined", mutate: func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
		}, want: []string{"[workload.unconfined]", "seccomp"}},
		{name: "legacy AppArmor annotation unconfined", mutate: func(p *corev1.Pod) {
			p.Annotations[corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix+"main"] = "unconfined"
		}, want: []string{"[workload.unconfined]", "AppArmor"}},
		{name: "CDI device by annotation", mutate: func(p *corev1.Pod) {
			p.Annotations["cdi.k8s.io/gpu"] = "bulkhead.dev/gpu=GPU-00000000-0000-0000-0000-000000000001"
		}, want: []string{"[workload.cdi_device]", `"cdi.k8s.io/gpu"`, "bulkhead.dev/gpu=GPU-"}},
		{name: "init container adds a capability", mutate: func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: digestImage,
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}}}
		}, want: []string{"[workload.capability]", `container "setup"`}},
		{name: "kubectl debug adds a privileged container", debug: true,
			mutate: addEphemeral(&corev1.SecurityContext{Privileged: &yes}),
			want:   []string{"[workload.privileged]", `ephemeral container "debugger"`, `ephemeralcontainers of pod "main-pod"`}},
		{name: "kubectl debug mounts the host root", debug: true,
			mutate: func(p *corev1.Pod) {
				p.Spec.Volumes = append(p.Spec.Volumes, hostPathVolume("root", "/"))
				addEphemeral(nil)(p)
				p.Spec.EphemeralContainers[0].VolumeMounts = []corev1.VolumeMount{{Name: "root", MountPath: "/host"}}
			},
			want: []string{"[workload.host_path]", `ephemeral container "debugger"`}},
		{name: "kubectl debug on a pod in its grace period", debug: true,
			mutate: func(p *corev1.Pod) {
				p.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
				addEphemeral(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}})(p)
			},
			want: []string{"[workload.capability]", `ephemeral container "debugger"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, ns := range []string{"agents", "platform"} {
				p := testPod(ns, "main-pod", "uid-main-pod", "", "1Gi", corev1.PodRunning)
				tt.mutate(p)
				req := podRequest(t, admissionv1.Create, p)
				if tt.debug {
					req = debugRequest(t, p)
				}
				resp := rev.Review(context.Background(), req)
				want := tt.want
				if ns == "platform" {
					want = tt.trustedDenies
				}
				if len(want) == 0 {
					if !resp.Allowed {
						t.Errorf("%s: refused %+v, want allowed", ns, resp.Result)
					}
					continue
				}
				if resp.Allowed || resp.Result == nil {
					t.Errorf("%s: allowed, want refused naming %q", ns, want)
					continue
				}
				if resp.Result.Code != 403 {
					t.Errorf("%s: code %d, want 403: %s", ns, resp.Result.Code, resp.Result.Message)
				}
				for _, w := range want {
					if !strings.Contains(resp.Result.Message, w) {
						t.Errorf("%s: message %q lacks %q", ns, resp.Result.Message, w)
					}
				}
			}
		})
	}
}

// TestReviewDebugOfAllowedPod: the baseline pod of TestReviewHostAccess is
// allowed, and so is kubectl debug adding an unprivileged container to it.
func TestReviewDebugOfAllowedPod(t *testing.T) {
	rev, err := NewReviewer(Options{Decider: openEngine(t)})
	if err != nil {
		t.Fatal(err)
	}
	p := testPod("agents", "main-pod", "uid-main-pod", "", "1Gi", corev1.PodRunning)
	if resp := rev.Review(context.Background(), podRequest(t, admissionv1.Create, p)); !resp.Allowed {
		t.Fatalf("baseline pod refused: %+v", resp.Result)
	}
	addEphemeral(nil)(p)
	if resp := rev.Review(context.Background(), debugRequest(t, p)); !resp.Allowed {
		t.Fatalf("unprivileged ephemeral container refused: %+v", resp.Result)
	}
}

// TestReviewSubresources: the object itself and its ephemeralcontainers
// (and resize) are judged, even for a pod being deleted; status, binding,
// eviction and scale cannot change what a pod asks of the host and pass
// without a decision.
func TestReviewSubresources(t *testing.T) {
	failing := staticDecider{err: context.DeadlineExceeded}
	rev, err := NewReviewer(Options{Decider: failing})
	if err != nil {
		t.Fatal(err)
	}
	deleting := testPod("agents", "p", "uid-p", "", "1Gi", corev1.PodRunning)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	tests := []struct {
		subresource string
		pod         *corev1.Pod
		judged      bool
	}{
		{subresource: "", judged: true},
		{subresource: SubresourceEphemeralContainers, judged: true},
		{subresource: SubresourceEphemeralContainers, pod: deleting, judged: true},
		{subresource: "resize", judged: true},
		{subresource: "some-future-subresource", judged: true},
		{subresource: "", pod: deleting, judged: false}, // finalizer removal
		{subresource: "status", judged: false},
		{subresource: "binding", judged: false},
		{subresource: "eviction", judged: false},
		{subresource: "scale", judged: false},
	}
	for _, tt := range tests {
		name := tt.subresource
		if name == "" {
			name = "object"
		}
		if tt.pod != nil {
			name += " deleting"
		}
		t.Run(name, func(t *testing.T) {
			p := tt.pod
			if p == nil {
				p = testPod("agents", "p", "uid-p", "", "1Gi", corev1.PodRunning)
			}
			req := updateRequest(t, p, p, tt.subresource)
			resp := rev.Review(context.Background(), req)
			// The failing decider refuses whatever it judges.
			if judged := !resp.Allowed; judged != tt.judged {
				t.Fatalf("judged = %v, want %v (%+v)", judged, tt.judged, resp.Result)
			}
			if tt.judged && (resp.Result.Code != 500 || !strings.Contains(resp.Result.Message, "policy evaluation failed")) {
				t.Errorf("result = %+v, want the failing decider's refusal", resp.Result)
			}
		})
	}
}

// recordingUsage is a UsageSource whose tenant runs the pod under review:
// it counts that pod unless asked to exclude it, and records the UIDs.
type recordingUsage struct {
	pod      types.UID
	excluded []types.UID
}

func (u *recordingUsage) Snapshot(exclude types.UID) (map[string]policy.Usage, error) {
	u.excluded = append(u.excluded, exclude)
	sandboxes := 3 // the agents tenant's quota, the pod under review included
	if exclude == u.pod {
		sandboxes--
	}
	return map[string]policy.Usage{"agents": {Sandboxes: sandboxes, MemoryBytes: int64(sandboxes) << 30}}, nil
}

// TestReviewDebugQuotaExcludesThePod: kubectl debug on a pod of a tenant at
// its sandbox quota is an update of that pod, not one more sandbox.
func TestReviewDebugQuotaExcludesThePod(t *testing.T) {
	usage := &recordingUsage{pod: "uid-main-pod"}
	rev, err := NewReviewer(Options{Decider: openEngine(t), Usage: usage})
	if err != nil {
		t.Fatal(err)
	}
	p := testPod("agents", "main-pod", "uid-main-pod", "", "1Gi", corev1.PodRunning)
	addEphemeral(nil)(p)
	resp := rev.Review(context.Background(), debugRequest(t, p))
	if !resp.Allowed {
		t.Fatalf("debug of a counted pod refused: %+v", resp.Result)
	}
	if len(usage.excluded) == 0 || usage.excluded[len(usage.excluded)-1] != "uid-main-pod" {
		t.Errorf("usage snapshots excluded %q, want the pod's UID", usage.excluded)
	}
}
