// Package cri names what containerd's CRI plugin writes into every sandbox
// and container spec. Both the node agent and the thin shims read these
// annotations; the package imports nothing, so a shim links it for free.
package cri

// Annotations containerd's CRI plugin sets on every sandbox and container spec.
const (
	AnnotationContainerType    = "io.kubernetes.cri.container-type"
	AnnotationSandboxID        = "io.kubernetes.cri.sandbox-id"
	AnnotationSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	AnnotationSandboxName      = "io.kubernetes.cri.sandbox-name"
	AnnotationSandboxUID       = "io.kubernetes.cri.sandbox-uid"
	AnnotationContainerName    = "io.kubernetes.cri.container-name"
	AnnotationImageName        = "io.kubernetes.cri.image-name"
	AnnotationRuntimeHandler   = "io.containerd.cri.runtime-handler"
	// AnnotationSandboxMemory is the pod's total memory limit, on the
	// sandbox's spec: the sum of its containers' limits, where one without
	// a limit counts 0.
	AnnotationSandboxMemory = "io.kubernetes.cri.sandbox-memory"
	// ContainerTypeSandbox is AnnotationContainerType's value on a pod's
	// sandbox (pause) container.
	ContainerTypeSandbox = "sandbox"
)
