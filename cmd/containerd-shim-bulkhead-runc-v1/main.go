// Command containerd-shim-bulkhead-runc-v1 is the containerd shim for the
// runtime type io.containerd.bulkhead-runc.v1: containerd's runc task
// service with a thin Bulkhead pod in front of it (package runtime/runc),
// one process per pod, for the tiers the policy lets run on runc. Every
// decision is the node agent's.
package main

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/bulkhead-runtime/bulkhead/internal/version"
	"github.com/bulkhead-runtime/bulkhead/runtime/runc"
)

func main() {
	// --version names Bulkhead's build, where containerd's shim flags
	// (-v) would name containerd's.
	if len(os.Args) == 2 && slices.Contains([]string{"--version", "-version", "-v"}, os.Args[1]) {
		fmt.Println("containerd-shim-bulkhead-runc-v1", version.String())
		return
	}
	runc.RegisterTaskService()
	shim.Run(context.Background(), manager.NewShimManager(runc.RuntimeType))
}
