package runtime

import "time"

// CRI annotations containerd sets on every sandbox and container spec.
const (
	AnnotationContainerType    = "io.kubernetes.cri.container-type"
	AnnotationSandboxID        = "io.kubernetes.cri.sandbox-id"
	AnnotationSandboxNamespace = "io.kubernetes.cri.sandbox-namespace"
	AnnotationSandboxName      = "io.kubernetes.cri.sandbox-name"
	AnnotationSandboxUID       = "io.kubernetes.cri.sandbox-uid"
	AnnotationContainerName    = "io.kubernetes.cri.container-name"
	AnnotationImageName        = "io.kubernetes.cri.image-name"
	AnnotationRuntimeHandler   = "io.containerd.cri.runtime-handler"
	// ContainerTypeSandbox is AnnotationContainerType's value on a pod's
	// sandbox (pause) container.
	ContainerTypeSandbox = "sandbox"
)

// shimStarted is about when this shim process started (its runtime
// package initialised), for the start-time log line of its sandbox.
var shimStarted = time.Now()

// Version is the shim's version, set at link time.
var Version = "dev"
