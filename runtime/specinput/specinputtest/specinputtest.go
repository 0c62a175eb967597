// Package specinputtest holds OCI specs and task updates as containerd's
// CRI plugin writes them, for the tests of runtime/specinput and runtime.
// No production binary imports it.
package specinputtest

import (
	_ "embed"
	"encoding/json"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

//go:embed cri-container.json
var criContainer []byte

// CRISpec is a container spec as containerd's CRI plugin writes it for a
// pod with UID "uid-1" in sandbox "sb1": the pod's own binds,
// containerd's default capabilities, masked paths and every namespace.
func CRISpec() *specs.Spec {
	var spec specs.Spec
	if err := json.Unmarshal(criContainer, &spec); err != nil {
		panic("specinputtest: cri-container.json: " + err.Error())
	}
	return &spec
}

// WithMemoryLimit sets the container's memory limit as containerd's CRI
// plugin writes it (WithResources): the limit, swap equal to it, and the
// CPU shares the kubelet always passes.
func WithMemoryLimit(n int64) func(*specs.Spec) {
	return func(s *specs.Spec) {
		shares := uint64(2)
		s.Linux.Resources = &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: &shares},
			Memory: &specs.LinuxMemory{Limit: &n, Swap: &n},
		}
	}
}

// WithoutMemoryLimit is a container without a memory limit as containerd
// writes it: the kubelet passes memory_limit_in_bytes 0, and containerd
// leaves an empty memory section.
func WithoutMemoryLimit(s *specs.Spec) {
	shares := uint64(2)
	s.Linux.Resources = &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares}, Memory: &specs.LinuxMemory{}}
}

// ResourcesAny is a task update's resources as containerd sends them.
func ResourcesAny(tb testing.TB, r *specs.LinuxResources) *anypb.Any {
	tb.Helper()
	data, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	return &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources", Value: data}
}

// MemoryResources is a task update that sets the memory limit to limit.
func MemoryResources(limit int64) *specs.LinuxResources {
	return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}, CPU: &specs.LinuxCPU{}}
}
