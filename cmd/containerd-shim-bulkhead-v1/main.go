// Command containerd-shim-bulkhead-v1 is the containerd shim for the runtime
// type io.containerd.bulkhead.v1: gVisor's task service with Bulkhead's pod
// extension in front of it, one process per pod.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/containerd/containerd/v2/pkg/shim"
	_ "gvisor.dev/gvisor/pkg/shim/v1/plugin" // registers gVisor's task service

	"github.com/bulkhead-runtime/bulkhead/internal/version"
	"github.com/bulkhead-runtime/bulkhead/runtime/gvisor"
)

func main() {
	// --version names Bulkhead's build, where containerd's shim flags
	// (-v) would name containerd's.
	if len(os.Args) == 2 && slices.Contains([]string{"--version", "-version", "-v"}, os.Args[1]) {
		fmt.Println("containerd-shim-bulkhead-v1", version.String())
		return
	}
	gvisor.RegisterPodExtension()
	shim.Run(context.Background(), gvisor.NewManager())
}
