// Command containerd-shim-bulkhead-v1 is the containerd shim for the runtime
// type io.containerd.bulkhead.v1: gVisor's task service with Bulkhead's pod
// extension in front of it, one process per pod.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"
	_ "gvisor.dev/gvisor/pkg/shim/v1/plugin" // registers gVisor's task service

	"github.com/bulkhead-runtime/bulkhead/runtime/gvisor"
)

func main() {
	gvisor.RegisterPodExtension()
	shim.Run(context.Background(), gvisor.NewManager())
}
