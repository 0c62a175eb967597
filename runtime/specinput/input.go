package specinput

import (
	"fmt"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
)

// Pod is who a spec's pod is, as the node recorded it from its sandbox's
// CRI annotations when the sandbox was created (never from what the pod's
// author annotated).
type Pod struct {
	// SandboxID is containerd's id of the pod's sandbox.
	SandboxID string
	// Namespace, Name and UID identify the pod in Kubernetes.
	Namespace, Name, UID string
	// Handler is the CRI runtime handler that selected Bulkhead.
	Handler string
	// Annotations are the pod's bulkhead.dev/ requests.
	Annotations map[string]string
	// NetNS is the path of the pod's network namespace; "" when the pod
	// shares the host's.
	NetNS string
}

// Dirs are the node's directories where the kubelet and containerd keep
// each pod's own files (config.Config's kubelet_root, containerd_root,
// containerd_state): a bind from there is the pod's, not a host path.
type Dirs struct {
	KubeletRoot, ContainerdRoot, ContainerdState string
}

// sandboxContainerName names the sandbox (pause) container in the policy input.
const sandboxContainerName = "sandbox"

// Sandbox is the policy input (kind sandbox) for the sandbox of pod, whose
// spec containerd wrote, on a node with dirs: what the pod asks for
// (memory, GPU, RDMA) and what its sandbox shares of the host. Usage and
// node are the ledger's, left empty. An error names the annotation that
// cannot be read.
func Sandbox(pod Pod, spec *specs.Spec, dirs Dirs) (policy.Input, error) {
	in := policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindSandbox,
		Namespace: pod.Namespace,
		Pod: policy.Pod{
			Name: pod.Name, UID: pod.UID, Annotations: pod.Annotations, RuntimeHandler: pod.Handler,
		},
	}
	// The node judges what will run, whatever the webhook saw: host
	// namespaces and sysctls from the sandbox's spec, and the sandbox
	// container itself when it asks the host for anything.
	in.Pod.HostNetwork, in.Pod.HostPID, in.Pod.HostIPC = hostNamespaces(spec)
	if spec.Linux != nil && len(spec.Linux.Sysctl) > 0 {
		in.Pod.Sysctls = spec.Linux.Sysctl
	}
	if c, _ := containerOf(sandboxContainerName, spec, podFilesOf(dirs, pod, ""), nil); asksHost(c) {
		in.Pod.Containers = []policy.Container{c}
	}
	if v := spec.Annotations[cri.AnnotationSandboxMemory]; v != "" {
		mem, err := strconv.ParseInt(v, 10, 64)
		if err != nil || mem < 0 {
			return in, fmt.Errorf("annotation %s: %q is not a byte count", cri.AnnotationSandboxMemory, v)
		}
		in.Request.MemoryBytes = mem
	}
	ann, err := policy.ParseAnnotations(pod.Annotations)
	if err != nil {
		return in, err
	}
	switch {
	case ann.Profile != "":
		count := ann.Count
		if count == 0 {
			count = 1
		}
		in.Request.GPU = &policy.GPURequest{Profile: ann.Profile, Count: count}
	case ann.Count != 0:
		return in, fmt.Errorf("annotation %s: needs %s", policy.AnnotationGPUCount, policy.AnnotationGPUProfile)
	}
	in.Request.RDMA = ann.RDMA
	return in, nil
}

// Container is the policy input (kind container) for creating container
// id of pod as spec describes it, on a node with dirs: the pod's identity
// and host namespaces, and what this container asks of the host. Device
// nodes in granted (the RDMA VFs Bulkhead itself hands the pod) are not
// asked for. Quotas and GPUs were settled at the sandbox's create, so
// request and usage stay empty.
func Container(pod Pod, id string, spec *specs.Spec, dirs Dirs, granted []string) policy.Input {
	in := policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindContainer,
		Namespace: pod.Namespace,
		Pod: policy.Pod{
			Name: pod.Name, UID: pod.UID, Annotations: pod.Annotations, RuntimeHandler: pod.Handler,
			HostNetwork: pod.NetNS == "",
		},
	}
	network, pid, ipc := hostNamespaces(spec)
	in.Pod.HostNetwork = in.Pod.HostNetwork || network
	in.Pod.HostPID, in.Pod.HostIPC = pid, ipc
	if spec.Linux != nil && len(spec.Linux.Sysctl) > 0 {
		in.Pod.Sysctls = spec.Linux.Sysctl
	}
	c, volumes := containerOf(ContainerName(id, spec), spec, podFilesOf(dirs, pod, id), granted)
	in.Pod.Containers, in.Pod.Volumes = []policy.Container{c}, volumes
	return in
}

// ContainerName is container id's name in its pod, as containerd's CRI
// writes it into the spec; the id outside the CRI.
func ContainerName(id string, spec *specs.Spec) string {
	if name := spec.Annotations[cri.AnnotationContainerName]; name != "" {
		return name
	}
	return id
}
