// Command containerd-shim-bulkhead-runc-v1 is the containerd shim for the
// runtime type io.containerd.bulkhead-runc.v1: containerd's runc task
// service with Bulkhead's pipeline (policy, quota, MIG, fence) in front of
// it, one process per pod, for the tiers the policy lets run on runc.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/pkg/shim"

	"github.com/bulkhead-runtime/bulkhead/runtime"
)

func main() {
	runtime.RegisterRuncTaskService()
	shim.Run(context.Background(), manager.NewShimManager(runtime.RuncRuntimeType))
}
