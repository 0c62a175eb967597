package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/test/images"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// runcTierMissing says what this machine lacks for the runc tier, or "":
// the test node registers handler bulkhead-runc exactly when both exist.
func runcTierMissing() string {
	for _, bin := range []string{"containerd-shim-bulkhead-runc-v1", "runc"} {
		if _, err := node.LookPath(bin); err != nil {
			return "needs " + bin + " (make build tools)"
		}
	}
	return ""
}

// TestRuncTierPlacesMIGSlices: the trusted tier runs on runc through
// Bulkhead (handler bulkhead-runc) and gets a real MIG slice from the
// hardware-true mock: a GPU instance at a valid placement, its UUID in the
// container's environment, destroyed with the pod. An untrusted pod on that
// handler is refused with the rule id.
func TestRuncTierPlacesMIGSlices(t *testing.T) {
	if why := runcTierMissing(); why != "" {
		t.Skip("runc tier: " + why)
	}
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	run := func(cfg *cri.PodSandboxConfig) (string, error) { return runPodOn(ctx, pn.Node, node.RuncHandler, cfg) }

	agent := podConfig(pn.Node, "agent-runc", "agents", nil)
	if _, err := run(agent); err == nil || !strings.Contains(err.Error(), "runtime.runc_forbidden") {
		t.Errorf("untrusted pod on %s: %v, want a refusal naming runtime.runc_forbidden", node.RuncHandler, err)
	} else {
		t.Logf("refused as expected: %v", err)
	}

	trainer := podConfig(pn.Node, "trainer", "platform", map[string]string{policy.AnnotationGPUProfile: "3g.71gb"})
	id, err := run(trainer)
	if err != nil {
		t.Fatalf("trusted pod with a 3g.71gb slice on %s: %v", node.RuncHandler, err)
	}
	insts := pn.migInstances(t)
	if len(insts) != 1 || insts[0].Profile != "3g.71gb" || !strings.HasPrefix(insts[0].UUID, "MIG-") {
		t.Fatalf("MIG instances after the pod started: %+v, want one 3g.71gb", insts)
	}
	if s := insts[0].Start; s != 0 && s != 4 {
		t.Errorf("3g instance at start %d: real hardware places 3g at 0 or 4", s)
	}
	res := pn.ledger(t)
	if len(res) != 1 || res[0].Instance == nil || res[0].Instance.UUID != insts[0].UUID {
		t.Errorf("ledger: %+v, want the pod's reservation holding the instance", res)
	}
	// The slice's CDI spec: one per sandbox, naming the instance.
	if owners := pn.cdiSpecs(t); len(owners) != 1 || owners[0] != id {
		t.Errorf("CDI specs for sandboxes %v, want the pod's %s", owners, id)
	} else if data, err := os.ReadFile(filepath.Join(pn.cdiDir, "bulkhead.dev-gpu_"+id+".json")); err != nil || !strings.Contains(string(data), `"name": "`+insts[0].UUID+`"`) {
		t.Errorf("CDI spec of the pod: %v\n%s", err, data)
	}
	if out, err := exec.CommandContext(ctx, bulkheadCLI(t), "node", "status", "--config", pn.ShimConf).CombinedOutput(); err != nil || !strings.Contains(string(out), insts[0].UUID) {
		t.Errorf("bulkhead node status does not list the instance %s: %v\n%s", insts[0].UUID, err, out)
	}

	resp, err := pn.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: id,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: "main"},
			Image:    &cri.ImageSpec{Image: images.WorkloadImage},
			Command:  []string{"/bin/sh", "-c", "exec sleep 3600"},
			LogPath:  "main.log",
			Linux:    &cri.LinuxContainerConfig{},
		},
		SandboxConfig: trainer,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pn.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		t.Fatal(err)
	}
	// The container's own process (exec'd processes take containerd's
	// stored spec, which the shim does not rewrite).
	env, err := execSync(ctx, pn.Node, resp.ContainerId, "sh", "-c", "tr '\\0' '\\n' </proc/1/environ | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p'")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(env); got != insts[0].UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want the instance's %s", got, insts[0].UUID)
	}
	// runc: the container sees the host's kernel, not gVisor's.
	host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	if rel, err := execSync(ctx, pn.Node, resp.ContainerId, "cat", "/proc/sys/kernel/osrelease"); err != nil || strings.TrimSpace(rel) != strings.TrimSpace(string(host)) {
		t.Errorf("kernel in the runc pod: %q (%v), want the host's %q", rel, err, host)
	}

	if err := removePod(ctx, pn.Node, id); err != nil {
		t.Fatal(err)
	}
	if insts := pn.migInstances(t); len(insts) != 0 {
		t.Errorf("MIG instances after removal: %+v", insts)
	}
	if res := pn.ledger(t); len(res) != 0 {
		t.Errorf("ledger after removal: %d reservations", len(res))
	}
	if owners := pn.cdiSpecs(t); len(owners) != 0 {
		t.Errorf("CDI specs after removal: %v", owners)
	}
}

// TestRuncShimKilledThenGC: kill -9 of a runc pod's shim while it holds a
// MIG instance, the kubelet's stop and remove of the broken sandbox, then
// `bulkhead node gc`: no instance, reservation, record or fence entry is
// left, and a second pass finds nothing.
func TestRuncShimKilledThenGC(t *testing.T) {
	if why := runcTierMissing(); why != "" {
		t.Skip("runc tier: " + why)
	}
	pn := startPipelineNode(t)
	cli := bulkheadCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	cfg := podConfig(pn.Node, "victim", "platform", map[string]string{policy.AnnotationGPUProfile: "2g.35gb"})
	id, err := runPodOn(ctx, pn.Node, node.RuncHandler, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res := pn.ledger(t)
	if len(res) != 1 || res[0].Instance == nil {
		t.Fatalf("ledger: %+v, want one reservation holding a MIG instance", res)
	}
	if err := syscall.Kill(res[0].ShimPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 shim %d: %v", res[0].ShimPID, err)
	}
	// What the kubelet does with a sandbox whose shim died.
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, serr := pn.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id})
		_, rerr := pn.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
		if serr == nil && rerr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stop/remove after the shim died: %v / %v", serr, rerr)
		}
		time.Sleep(time.Second)
	}
	out, err := exec.CommandContext(ctx, cli, "node", "gc", "--config", pn.ShimConf).CombinedOutput()
	if err != nil {
		t.Fatalf("bulkhead node gc: %v\n%s", err, out)
	}
	t.Logf("bulkhead node gc: %s", out)
	if out, err := exec.CommandContext(ctx, cli, "node", "gc", "--config", pn.ShimConf).CombinedOutput(); err != nil || strings.Contains(string(out), id) {
		t.Errorf("second gc: %v\n%s", err, out)
	}
	if insts := pn.migInstances(t); len(insts) != 0 {
		t.Errorf("MIG instances after gc: %+v", insts)
	}
	pn.assertNodeClean(t)
}
