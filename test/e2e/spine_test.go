// Package e2e drives a private containerd through the CRI Go client, as the
// kubelet would, with Bulkhead's shim as runtime handler "bulkhead". These
// tests need root, the tools from `make tools` and the binaries from
// `make build`; without them they skip saying what is missing.
package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

func TestPodRunsInGVisorThroughCRI(t *testing.T) {
	n := startNode(t, node.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pod := podConfig(n, "spine", "default", nil)
	podID, err := runPod(ctx, n, pod)
	if err != nil {
		t.Fatalf("RunPodSandbox: %v", err)
	}
	ip, err := podIP(ctx, n, podID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod %s has CNI IP %s", podID[:12], ip)

	// With the pipeline off (a benchmark baseline) the shim asks no agent
	// and nothing is recorded: the pod is gVisor's alone.
	if _, err := os.Stat(filepath.Join(n.StateDir, "sandboxes", podID)); !os.IsNotExist(err) {
		t.Errorf("sandbox record of a pod the pipeline never saw: stat = %v, want none", err)
	}

	c1, err := startContainer(ctx, n, podID, pod, "first", "echo hello-from-bulkhead; exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	out, err := execSync(ctx, n, c1, "sh", "-c", "echo round-trip-$((40+2))")
	if err != nil || strings.TrimSpace(out) != "round-trip-42" {
		t.Fatalf("exec round trip: %q, %v", out, err)
	}
	// The workload's kernel is gVisor's: its boot log says so.
	dmesg, err := execSync(ctx, n, c1, "dmesg")
	if err != nil || !strings.Contains(dmesg, "gVisor") {
		t.Errorf("dmesg inside the pod does not show gVisor (err %v):\n%s", err, dmesg)
	}
	// And runsc runs it on the host.
	if sandboxes := processes(n.RunscRoot, "boot"); len(sandboxes) != 1 {
		t.Errorf("want 1 runsc sandbox process for the pod, got %d: %q", len(sandboxes), sandboxes)
	}

	// Container logs are written by the CRI to the pod's log directory.
	logPath := filepath.Join(pod.LogDirectory, "first.log")
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _ := os.ReadFile(logPath)
		if strings.Contains(string(data), "stdout F hello-from-bulkhead") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("container log %s lacks the greeting: %q", logPath, data)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A second container joins the same sandbox: still one shim, one sandbox.
	c2, err := startContainer(ctx, n, podID, pod, "second", "exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := execSync(ctx, n, c2, "true"); err != nil {
		t.Fatal(err)
	}
	if sandboxes := processes(n.RunscRoot, "boot"); len(sandboxes) != 1 {
		t.Errorf("two containers: want 1 runsc sandbox process, got %d", len(sandboxes))
	}
	if shims := processes(n.Dir(), "containerd-shim-bulkhead-v1", "-id"); len(shims) != 1 {
		t.Errorf("two containers: want 1 shim process, got %d: %q", len(shims), shims)
	}
	// Both containers are in gVisor's one kernel: the second sees the first's process.
	ps, err := execSync(ctx, n, c2, "cat", "/proc/uptime")
	if err != nil || ps == "" {
		t.Errorf("second container exec: %v", err)
	}

	if err := removePod(ctx, n, podID); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, n)
}

// runscNullNetNS is runsc's node-wide pin of an empty network namespace that
// every gofer joins (runsc/specutils.NullNetNSFilename). It belongs to no pod
// and is reused by the next one; node.Stop unmounts it.
const runscNullNetNS = "null-netns"

// assertNothingLeft checks that no pod left anything on the node.
func assertNothingLeft(t *testing.T, n *node.Node) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		var problems []string
		if p := processes(n.Dir(), "containerd-shim-bulkhead-v1"); len(p) > 0 {
			problems = append(problems, "shim processes: "+strings.Join(p, "; "))
		}
		if p := processes(n.RunscRoot); len(p) > 0 {
			problems = append(problems, "runsc processes: "+strings.Join(p, "; "))
		}
		for _, m := range node.MountsUnder(n.Dir()) {
			if strings.HasSuffix(m, "/"+runscNullNetNS) {
				continue
			}
			if strings.Contains(m, "netns") || strings.Contains(m, "io.containerd.runtime.v2.task") {
				problems = append(problems, "mount "+m)
			}
		}
		if v := vethsOn(n.BridgeName()); len(v) > 0 {
			problems = append(problems, "veths: "+strings.Join(v, "; "))
		}
		if e := slices.DeleteFunc(dirEntries(filepath.Join(n.RunscRoot, "k8s.io")), func(s string) bool { return s == runscNullNetNS }); len(e) > 0 {
			problems = append(problems, "runsc state: "+strings.Join(e, ", "))
		}
		if e := dirEntries(filepath.Join(n.StateDir, "sandboxes")); len(e) > 0 {
			problems = append(problems, "shim state: "+strings.Join(e, ", "))
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("left behind after removal:\n%s", strings.Join(problems, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
