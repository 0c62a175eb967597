package mig

import (
	"errors"
	"strings"
	"testing"
)

func TestSandboxGPUMode(t *testing.T) {
	tests := []struct {
		runtime, fallback string
		supports          bool
		want              GPUMode
		err               error
		msg               string
	}{
		{"runc", FallbackRefuse, true, GPUModeMIG, nil, ""},
		{"io.containerd.runc.v2", FallbackRefuse, true, GPUModeMIG, nil, ""},
		{"/usr/bin/crun", FallbackWholeGPU, true, GPUModeMIG, nil, ""},
		{"runsc", FallbackRefuse, false, "", ErrMIGUnsupportedInSandbox, `runtime "runsc": MIG slices are not supported`},
		{"io.containerd.runsc.v1", FallbackRefuse, false, "", ErrMIGUnsupportedInSandbox, "/dev/nvidia-caps/*"},
		{"gvisor", FallbackWholeGPU, false, GPUModeWhole, nil, ""},
		{"kata", FallbackRefuse, false, "", ErrMIGUnsupportedInSandbox, "kata"},
		{"runsc", "maybe", false, "", nil, `decision.gpu.mig_in_sandbox "maybe"`},
	}
	for _, tt := range tests {
		if got := SandboxSupportsMIG(tt.runtime); got != tt.supports {
			t.Errorf("SandboxSupportsMIG(%q) = %v", tt.runtime, got)
		}
		mode, err := SandboxGPUMode(tt.runtime, tt.fallback)
		if tt.msg != "" {
			if err == nil || !strings.Contains(err.Error(), tt.msg) || (tt.err != nil && !errors.Is(err, tt.err)) {
				t.Errorf("SandboxGPUMode(%q, %q) error %v, want %q", tt.runtime, tt.fallback, err, tt.msg)
			}
			continue
		}
		if err != nil || mode != tt.want {
			t.Errorf("SandboxGPUMode(%q, %q) = %v, %v; want %v", tt.runtime, tt.fallback, mode, err, tt.want)
		}
	}
}
