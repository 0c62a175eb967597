// Command demo runs a real local node — containerd, Bulkhead's shim, gVisor —
// starts pods through the CRI as a kubelet would, explains what happened in
// plain words, and tears everything down on exit or Ctrl-C.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/images"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

func run(ctx context.Context) error {
	bins := node.BinDirs()
	if err := node.Requirements(bins); err != nil {
		return fmt.Errorf("%v — run `make build tools` and `sudo make demo`", err)
	}
	dir, err := os.MkdirTemp("", "bulkhead-demo-")
	if err != nil {
		return err
	}
	say("starting a private containerd in %s with Bulkhead as runtime handler %q", dir, node.Handler)
	n, err := node.Start(ctx, node.Options{Dir: dir, BinDir: bins, Bridge: "bh-demo0", Subnet: "10.77.0.0/24"})
	if err != nil {
		return err
	}
	defer func() {
		say("tearing down: pods, containerd, bridge, %s", dir)
		n.Stop(context.Background())
	}()

	pod := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: "coder-agent", Namespace: "agents", Uid: "demo-1"},
		Hostname:     "coder-agent",
		LogDirectory: filepath.Join(dir, "pod-logs"),
		Linux:        &cri.LinuxPodSandboxConfig{},
	}
	if err := os.MkdirAll(pod.LogDirectory, 0o755); err != nil {
		return err
	}
	start := time.Now()
	sb, err := n.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: pod, RuntimeHandler: node.Handler})
	if err != nil {
		return fmt.Errorf("RunPodSandbox: %w", err)
	}
	st, err := n.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
	if err != nil {
		return err
	}
	say("pod agents/coder-agent is running in a gVisor sandbox (%s), CNI IP %s, after %v",
		sb.PodSandboxId[:12], st.Status.GetNetwork().GetIp(), time.Since(start).Round(time.Millisecond))

	c, err := n.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{
		PodSandboxId: sb.PodSandboxId,
		Config: &cri.ContainerConfig{
			Metadata: &cri.ContainerMetadata{Name: "agent"},
			Image:    &cri.ImageSpec{Image: images.WorkloadImage},
			Command:  []string{"/bin/sh", "-c", "echo agent says hello; exec sleep 3600"},
			LogPath:  "agent.log",
			Linux:    &cri.LinuxContainerConfig{},
		},
		SandboxConfig: pod,
	})
	if err != nil {
		return fmt.Errorf("CreateContainer: %w", err)
	}
	if _, err := n.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		return fmt.Errorf("StartContainer: %w", err)
	}
	out, err := n.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: c.ContainerId, Cmd: []string{"dmesg"}, Timeout: 20})
	if err != nil {
		return fmt.Errorf("ExecSync: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out.Stdout)), "\n")
	say("inside the pod the kernel is gVisor's; its boot log begins:")
	for i, l := range lines {
		if i == 3 {
			break
		}
		fmt.Printf("      %s\n", l)
	}
	uname, _ := n.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: c.ContainerId, Cmd: []string{"uname", "-r"}, Timeout: 20})
	host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	say("uname -r inside: %s; on the host: %s", strings.TrimSpace(string(uname.GetStdout())), strings.TrimSpace(string(host)))
	say("runsc processes on the host for this node: %d", len(node.ProcessesUnder(n.RunscRoot)))

	say("stopping and removing the pod")
	if _, err := n.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		return err
	}
	if _, err := n.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
		return err
	}
	left, _ := os.ReadDir(filepath.Join(n.StateDir, "sandboxes"))
	say("after removal: %d Bulkhead sandbox records, %d runsc processes", len(left), len(node.ProcessesUnder(n.RunscRoot)))
	return nil
}
