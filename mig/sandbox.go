package mig

import (
	"errors"
	"fmt"
	"strings"
)

// ErrMIGUnsupportedInSandbox means the chosen sandbox cannot use a MIG
// slice. gVisor's nvproxy passes /dev/nvidiactl, /dev/nvidia-uvm and
// /dev/nvidiaN through but not the /dev/nvidia-caps/* capability devices a
// MIG slice needs, so a workload would start and then find no usable GPU.
var ErrMIGUnsupportedInSandbox = errors.New("MIG slices are not supported in this sandbox")

// DevNvidiaCaps is the directory of MIG capability devices: a container
// needs its slice's GI and CI capability nodes from here to use the slice.
const DevNvidiaCaps = "/dev/nvidia-caps"

// MIG fallbacks a policy may answer with (decision.gpu.mig_in_sandbox).
const (
	// FallbackRefuse refuses the pod.
	FallbackRefuse = "refuse"
	// FallbackWholeGPU gives the pod a whole (non-MIG) GPU instead.
	FallbackWholeGPU = "whole-gpu"
)

// GPUMode is how a sandbox gets its GPU.
type GPUMode string

const (
	// GPUModeMIG hands over a MIG slice.
	GPUModeMIG GPUMode = "mig"
	// GPUModeWhole hands over an entire GPU that is not in MIG mode.
	GPUModeWhole GPUMode = "whole-gpu"
)

// runtimeName reduces a runtime or shim name ("io.containerd.runsc.v1",
// "/usr/bin/runc", "gvisor") to its base name.
func runtimeName(runtime string) string {
	r := strings.ToLower(strings.TrimSpace(runtime))
	if i := strings.LastIndexByte(r, '/'); i >= 0 {
		r = r[i+1:]
	}
	r = strings.TrimPrefix(r, "io.containerd.")
	if i := strings.LastIndex(r, ".v"); i > 0 {
		r = r[:i]
	}
	if r == "gvisor" {
		r = "runsc"
	}
	return r
}

// SandboxSupportsMIG reports whether a container runtime can use a MIG
// slice: true for runtimes that run the container on the host kernel with
// the host driver (runc, crun), false for gVisor (runsc) and for anything
// unknown, so that an unrecognised sandbox fails closed.
func SandboxSupportsMIG(runtime string) bool {
	switch runtimeName(runtime) {
	case "runc", "crun":
		return true
	}
	return false
}

// SandboxGPUMode applies the policy's answer for a sandbox that wants a MIG
// slice: the slice if the runtime supports it, else the fallback. A refusal
// wraps ErrMIGUnsupportedInSandbox and says why.
func SandboxGPUMode(runtime, fallback string) (GPUMode, error) {
	if fallback != FallbackRefuse && fallback != FallbackWholeGPU {
		return "", fmt.Errorf("decision.gpu.mig_in_sandbox %q: want %q or %q", fallback, FallbackRefuse, FallbackWholeGPU)
	}
	if SandboxSupportsMIG(runtime) {
		return GPUModeMIG, nil
	}
	if fallback == FallbackWholeGPU {
		return GPUModeWhole, nil
	}
	return "", fmt.Errorf("runtime %q: %w (it does not expose %s/*); policy decision.gpu.mig_in_sandbox is %q",
		runtime, ErrMIGUnsupportedInSandbox, DevNvidiaCaps, FallbackRefuse)
}
