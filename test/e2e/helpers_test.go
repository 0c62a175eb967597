package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/images"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// nodeSeq gives every node of this test binary its own bridge and subnet.
var nodeSeq atomic.Int32

// startNode starts a private node or skips the test saying what is missing.
func startNode(t testing.TB, opts node.Options) *node.Node {
	t.Helper()
	bins := node.BinDirs()
	if err := node.Requirements(bins); err != nil {
		t.Skipf("e2e: %v", err)
	}
	seq := nodeSeq.Add(1)
	// A caller's directories first (the upgrade test's installed release).
	opts.BinDir = append(opts.BinDir, bins...)
	if opts.Dir == "" {
		dir, err := os.MkdirTemp("", "bh-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		opts.Dir = dir
	}
	if opts.Bridge == "" {
		opts.Bridge = fmt.Sprintf("bh%d-%d", os.Getpid()%100000, seq)
	}
	if opts.Subnet == "" {
		opts.Subnet = nodeSubnet(seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := node.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd and agent logs (tail):\n%s", tail(n.Log(), 120))
			logs, _ := exec.Command("sh", "-c", "tail -n 40 "+filepath.Join(n.Dir(), "logs")+"/*/* 2>/dev/null | head -200").Output()
			t.Logf("runsc logs (tail):\n%s", logs)
		}
		n.Stop(context.Background())
	})
	return n
}

// nodeSubnet is the pod CIDR of the node numbered seq (nodeSeq).
func nodeSubnet(seq int32) string {
	return fmt.Sprintf("10.%d.%d.0/24", 200+int(seq)%50, os.Getpid()%250)
}

// regoBundle is the repository's policy bundle directory, rego/.
func regoBundle(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	bundle, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", "..", "rego"))
	if err != nil {
		t.Fatal(err)
	}
	return bundle
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// podConfig is a minimal pod in namespace ns.
func podConfig(n *node.Node, name, ns string, annotations map[string]string) *cri.PodSandboxConfig {
	return &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: ns, Uid: name + "-uid", Attempt: 0},
		Hostname:     name,
		LogDirectory: filepath.Join(n.Dir(), "pod-logs", ns+"_"+name),
		Annotations:  annotations,
		Labels:       map[string]string{"app": name},
		Linux:        &cri.LinuxPodSandboxConfig{},
	}
}

// runPod runs a sandbox with the bulkhead handler.
func runPod(ctx context.Context, n *node.Node, cfg *cri.PodSandboxConfig) (string, error) {
	return runPodOn(ctx, n, node.Handler, cfg)
}

// runPodOn runs a sandbox with the runtime handler handler.
func runPodOn(ctx context.Context, n *node.Node, handler string, cfg *cri.PodSandboxConfig) (string, error) {
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		return "", err
	}
	resp, err := n.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return "", err
	}
	return resp.PodSandboxId, nil
}

// startContainer creates and starts a busybox container running script.
func startContainer(ctx context.Context, n *node.Node, podID string, pod *cri.PodSandboxConfig, name, script string) (string, error) {
	resp, err := n.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: podID,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: name},
			Image:    &cri.ImageSpec{Image: images.WorkloadImage},
			Command:  []string{"/bin/sh", "-c", script},
			LogPath:  name + ".log",
			Linux:    &cri.LinuxContainerConfig{},
		},
		SandboxConfig: pod,
	})
	if err != nil {
		return "", fmt.Errorf("create container %s: %w", name, err)
	}
	if _, err := n.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		return "", fmt.Errorf("start container %s: %w", name, err)
	}
	return resp.ContainerId, nil
}

// execSync runs cmd in a container and returns its stdout.
func execSync(ctx context.Context, n *node.Node, id string, cmd ...string) (string, error) {
	resp, err := n.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 30})
	if err != nil {
		return "", err
	}
	if resp.ExitCode != 0 {
		return string(resp.Stdout), fmt.Errorf("exec %v: exit %d: %s", cmd, resp.ExitCode, resp.Stderr)
	}
	return string(resp.Stdout), nil
}

// removePod stops and removes a sandbox.
func removePod(ctx context.Context, n *node.Node, id string) error {
	if _, err := n.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("stop pod %s: %w", id, err)
	}
	if _, err := n.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("remove pod %s: %w", id, err)
	}
	return nil
}

// podIP returns the pod's primary IP from CRI.
func podIP(ctx context.Context, n *node.Node, id string) (string, error) {
	st, err := n.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id})
	if err != nil {
		return "", err
	}
	if st.Status.GetNetwork().GetIp() == "" {
		return "", fmt.Errorf("pod %s has no IP", id)
	}
	return st.Status.Network.Ip, nil
}

// processes returns the command lines of processes that mention dir and
// whose command line contains every word.
func processes(dir string, words ...string) []string {
	var out []string
	for _, pid := range node.ProcessesUnder(dir) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		ok := true
		for _, w := range words {
			if !strings.Contains(cmd, w) {
				ok = false
			}
		}
		if ok {
			out = append(out, cmd)
		}
	}
	return out
}

// vethsOn lists interfaces enslaved to the bridge.
func vethsOn(bridge string) []string {
	out, _ := exec.Command("ip", "-o", "link", "show", "master", bridge).Output()
	var links []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			links = append(links, l)
		}
	}
	return links
}

// dirEntries lists a directory, treating absence as empty.
func dirEntries(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
