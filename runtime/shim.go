package runtime

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/sys"
	"github.com/containerd/log"
)

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

// shimOOMScore keeps the shim killable but well behind the workloads it serves.
const shimOOMScore = -999

// SetShimOOMScore gives the shim process pid -999 where the caller may
// lower scores (CAP_SYS_RESOURCE) and otherwise containerd's own score + 1.
// It must not log: containerd reads the start command's output as bootstrap
// parameters. The shim itself warns about the fallback once it serves
// (WarnOOMScore).
func SetShimOOMScore(pid int) error {
	if err := sys.SetOOMScore(pid, shimOOMScore); err != nil {
		if err := shim.AdjustOOMScore(pid); err != nil {
			return fmt.Errorf("shim pid %d: set oom_score_adj: %w", pid, err)
		}
	}
	return nil
}

// WarnOOMScore logs a warning when the running shim did not get the
// oom_score_adj it wanted.
func WarnOOMScore(ctx context.Context) {
	score, err := sys.GetOOMScoreAdj(os.Getpid())
	if err == nil && score != shimOOMScore {
		log.G(ctx).Warnf("shim oom_score_adj is %d, not %d: this node denies CAP_SYS_RESOURCE, so the shim uses containerd's score + 1", score, shimOOMScore)
	}
}

// Version is the shim's version, set at link time.
var Version = "dev"
