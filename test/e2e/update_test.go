package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/images"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// updateTenants gives a gVisor tenant and a runc tenant the memory quota of
// issue 24's resize: 64Gi.
const updateTenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"],   "quota": {"sandboxes": 5, "gpu_slices": 6, "memory": "64Gi"}},
  "platform": {"tier": "trusted",   "namespaces": ["platform"], "quota": {"sandboxes": 5, "gpu_slices": 56, "memory": "64Gi"}}
}}}`

const gib = int64(1) << 30

// TestResizeJudgedAgainstQuota: CRI UpdateContainerResources (the kubelet's
// in-place resize) reaches the shim as a task Update, and both shims judge
// it against the tenant's quota. A tenant with a 64Gi memory quota runs two
// pods of 30Gi; resizing one to 60Gi is refused with [quota.memory] and the
// ledger, the container's limit and containerd's view stay as they were;
// resizing it to 34Gi succeeds and re-charges the pod; a third pod of 1Gi
// is then refused at its sandbox's create, where before this shim held 94Gi.
func TestResizeJudgedAgainstQuota(t *testing.T) {
	pn := startPipelineNodeTenants(t, false, updateTenants)
	for _, tt := range []struct {
		name, handler, ns string
		missing           string
	}{
		{"gvisor", node.Handler, "agents", ""},
		{"runc", node.RuncHandler, "platform", runcTierMissing()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.missing != "" {
				t.Skip("runc tier: " + tt.missing)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			pods := map[string]string{} // sandbox id -> pod name
			var main, podB string
			var cfgB *cri.PodSandboxConfig
			for _, name := range []string{"resize-a", "resize-b"} {
				cfg := podConfig(pn.Node, name+"-"+tt.name, tt.ns, nil)
				// The kubelet's pod total: containerd turns it into the
				// io.kubernetes.cri.sandbox-memory annotation.
				cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: 30 * gib}
				id, err := runPodOn(ctx, pn.Node, tt.handler, cfg)
				if err != nil {
					t.Fatalf("pod %s: %v", name, err)
				}
				t.Cleanup(func() { _ = removePod(context.Background(), pn.Node, id) })
				pods[id] = name
				c, err := startLimitedContainer(ctx, pn.Node, id, cfg, "main", 30*gib)
				if err != nil {
					t.Fatal(err)
				}
				if name == "resize-a" {
					main = c
				} else {
					podB, cfgB = id, cfg
				}
			}
			charges := func() map[string]int64 {
				out := map[string]int64{}
				for _, r := range pn.ledger(t) {
					if _, ok := pods[r.SandboxID]; ok {
						out[pods[r.SandboxID]] = r.MemoryBytes
					}
				}
				return out
			}
			if got := charges(); got["resize-a"] != 30*gib || got["resize-b"] != 30*gib {
				t.Fatalf("ledger before the resize: %v, want 30Gi each", got)
			}
			// wantMemory checks main's memory limit as containerd reports
			// it and, under runc, as its cgroup holds it.
			wantMemory := func(when string, want int64) {
				t.Helper()
				if got := containerMemory(ctx, t, pn.Node, main); got != want {
					t.Errorf("container's memory limit %s: %d, want %dGi", when, got, want/gib)
				}
				if tt.name == "runc" {
					if got := cgroupMemory(ctx, t, pn.Node, main); got != want {
						t.Errorf("cgroup memory limit %s: %d, want %dGi", when, got, want/gib)
					}
				}
			}

			// 30Gi + 60Gi > 64Gi.
			_, err := pn.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
				ContainerId: main, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 60 * gib},
			})
			if err == nil || !strings.Contains(err.Error(), "[quota.memory] ") || !strings.Contains(err.Error(), "tenant "+tt.ns) {
				t.Fatalf("resize to 60Gi: %v, want a refusal naming [quota.memory] and tenant %s", err, tt.ns)
			}
			t.Logf("refused as expected: %v", err)
			if got := charges(); got["resize-a"] != 30*gib || got["resize-b"] != 30*gib {
				t.Errorf("ledger after the refused resize: %v, want 30Gi each", got)
			}
			wantMemory("after the refused resize", 30*gib)

			// 30Gi + 34Gi = 64Gi.
			if _, err := pn.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
				ContainerId: main, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 34 * gib},
			}); err != nil {
				t.Fatalf("resize to 34Gi: %v", err)
			}
			if got := charges(); got["resize-a"] != 34*gib || got["resize-b"] != 30*gib {
				t.Errorf("ledger after the resize to 34Gi: %v, want resize-a 34Gi", got)
			}
			wantMemory("after the resize", 34*gib)

			// The tenant is full: a 1Gi pod does not fit.
			cfg := podConfig(pn.Node, "resize-c-"+tt.name, tt.ns, nil)
			cfg.Linux.Resources = &cri.LinuxContainerResources{MemoryLimitInBytes: gib}
			if id, err := runPodOn(ctx, pn.Node, tt.handler, cfg); err == nil {
				_ = removePod(ctx, pn.Node, id)
				t.Errorf("a 1Gi pod beside 64Gi held (quota 64Gi) was admitted")
			} else if !strings.Contains(err.Error(), "[quota.memory] ") {
				t.Errorf("a 1Gi pod beside 64Gi held: %v, want [quota.memory]", err)
			}

			// A shrink frees what it gave up.
			if _, err := pn.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
				ContainerId: main, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 30 * gib},
			}); err != nil {
				t.Fatalf("resize back to 30Gi: %v", err)
			}
			if got := charges(); got["resize-a"] != 30*gib {
				t.Errorf("ledger after the resize back to 30Gi: %v", got)
			}

			// A container resized before it starts: containerd only rewrites
			// its stored spec, and the shim sees 10Gi at the container's
			// create, past its pod's 30Gi total (60 + 10 > 64).
			late, err := createLimitedContainer(ctx, pn.Node, podB, cfgB, "late", gib)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pn.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
				ContainerId: late, Linux: &cri.LinuxContainerResources{MemoryLimitInBytes: 10 * gib},
			}); err != nil {
				t.Fatalf("resize of a created container (containerd's spec only): %v", err)
			}
			if _, err := pn.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: late}); err == nil || !strings.Contains(err.Error(), "[quota.memory] ") {
				t.Errorf("start of a container resized to 10Gi beside 60Gi held: %v, want [quota.memory]", err)
			}
			if got := charges(); got["resize-a"] != 30*gib || got["resize-b"] != 30*gib {
				t.Errorf("ledger after the refused start: %v, want 30Gi each", got)
			}
		})
	}
}

// startLimitedContainer creates and starts a busybox container in the pod
// limited to memory bytes.
func startLimitedContainer(ctx context.Context, n *node.Node, podID string, pod *cri.PodSandboxConfig, name string, memory int64) (string, error) {
	id, err := createLimitedContainer(ctx, n, podID, pod, name, memory)
	if err != nil {
		return "", err
	}
	if _, err := n.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id}); err != nil {
		return "", err
	}
	return id, nil
}

// createLimitedContainer creates, without starting it, a busybox container
// in the pod limited to memory bytes.
func createLimitedContainer(ctx context.Context, n *node.Node, podID string, pod *cri.PodSandboxConfig, name string, memory int64) (string, error) {
	resp, err := n.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: podID,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: name},
			Image:    &cri.ImageSpec{Image: images.WorkloadImage},
			Command:  []string{"/bin/sh", "-c", "exec sleep 3600"},
			LogPath:  name + ".log",
			Linux:    &cri.LinuxContainerConfig{Resources: &cri.LinuxContainerResources{MemoryLimitInBytes: memory}},
		},
		SandboxConfig: pod,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

// containerMemory is the memory limit containerd reports for the container
// (what it keeps only once the runtime applied it).
func containerMemory(ctx context.Context, t *testing.T, n *node.Node, id string) int64 {
	t.Helper()
	st, err := n.Runtime.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	return st.GetStatus().GetResources().GetLinux().GetMemoryLimitInBytes()
}

// cgroupMemory is the memory limit of the runc container's own cgroup, read
// inside it (cgroup v1's memory controller, or v2's memory.max).
func cgroupMemory(ctx context.Context, t *testing.T, n *node.Node, id string) int64 {
	t.Helper()
	out, err := execSync(ctx, n, id, "sh", "-c", "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		t.Fatalf("cgroup memory limit %q: %v", out, err)
	}
	return v
}
