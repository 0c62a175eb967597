package specinput

import (
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
)

var testDirs = Dirs{KubeletRoot: "/var/lib/kubelet", ContainerdRoot: "/var/lib/containerd", ContainerdState: "/run/containerd"}

func testPod() Pod {
	return Pod{SandboxID: "sb1", Namespace: "research", Name: "p", UID: "uid-1", Handler: "bulkhead", NetNS: "/var/run/netns/cni-1"}
}

// TestSandboxReadsRequestsAndHostNamespaces: the sandbox's input carries
// the pod's memory total, its GPU request and the host namespaces its spec
// shares; an annotation that cannot be read is an error naming it.
func TestSandboxReadsRequestsAndHostNamespaces(t *testing.T) {
	spec := specinputtest.CRISpec()
	spec.Annotations[cri.AnnotationSandboxMemory] = "1073741824"
	hostIPC(spec)
	pod := testPod()
	pod.Annotations = map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}
	in, err := Sandbox(pod, spec, testDirs)
	if err != nil {
		t.Fatal(err)
	}
	if in.Kind != policy.KindSandbox || in.Namespace != "research" || in.Pod.Name != "p" || in.Pod.RuntimeHandler != "bulkhead" {
		t.Errorf("identity: %+v", in)
	}
	if in.Request.MemoryBytes != 1<<30 || in.Request.GPU == nil || in.Request.GPU.Profile != "1g.18gb" || in.Request.GPU.Count != 1 {
		t.Errorf("request: %+v", in.Request)
	}
	if in.Pod.HostNetwork || in.Pod.HostPID || !in.Pod.HostIPC {
		t.Errorf("host namespaces: network %v pid %v ipc %v, want ipc alone", in.Pod.HostNetwork, in.Pod.HostPID, in.Pod.HostIPC)
	}
	if len(in.Pod.Containers) != 0 {
		t.Errorf("a sandbox asking the host for nothing is listed as a container: %+v", in.Pod.Containers)
	}

	spec.Annotations[cri.AnnotationSandboxMemory] = "1Gi"
	if _, err := Sandbox(pod, spec, testDirs); err == nil || !strings.Contains(err.Error(), cri.AnnotationSandboxMemory) {
		t.Errorf("memory total 1Gi: error = %v, want one naming %s", err, cri.AnnotationSandboxMemory)
	}
	delete(spec.Annotations, cri.AnnotationSandboxMemory)
	pod.Annotations = map[string]string{policy.AnnotationGPUCount: "1"}
	if _, err := Sandbox(pod, spec, testDirs); err == nil || !strings.Contains(err.Error(), policy.AnnotationGPUProfile) {
		t.Errorf("GPU count without a profile: error = %v, want one naming %s", err, policy.AnnotationGPUProfile)
	}
}

// TestContainerJudgesWhatItAsks: a container's input names it as the CRI
// wrote it and lists what it asks of the host; a pod without a network
// namespace of its own is on the host's network whatever the container's
// spec says.
func TestContainerJudgesWhatItAsks(t *testing.T) {
	spec := specinputtest.CRISpec()
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind"}})
	in := Container(testPod(), "c1", spec, testDirs, nil)
	if in.Kind != policy.KindContainer || len(in.Pod.Containers) != 1 {
		t.Fatalf("input %+v", in)
	}
	c := in.Pod.Containers[0]
	if c.Name != "main" || len(c.Mounts) != 1 || c.Mounts[0].HostPath != "/" {
		t.Errorf("container %+v, want main with the host's / mounted", c)
	}
	if in.Pod.HostNetwork || in.Request != (policy.Request{}) {
		t.Errorf("host network %v, request %+v: want neither", in.Pod.HostNetwork, in.Request)
	}
	pod := testPod()
	pod.NetNS = ""
	if in := Container(pod, "c1", spec, testDirs, nil); !in.Pod.HostNetwork {
		t.Error("a pod on the host's network: container input not host network")
	}
	if got := ContainerName("c9", &specs.Spec{}); got != "c9" {
		t.Errorf("ContainerName outside the CRI = %q, want the id", got)
	}
}
