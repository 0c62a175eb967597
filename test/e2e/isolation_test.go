package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/images"
)

// createContainer creates and starts a busybox container whose config edit
// shapes, as a kubelet would send it. containerd hands the shim the
// container's OCI spec at start (its task's Create): that is where the node
// judges it. A container that fails to start is removed, as the kubelet
// would, and its id returned with the error.
func createContainer(ctx context.Context, pn *pipelineNode, podID string, pod *cri.PodSandboxConfig, name string, edit func(*cri.ContainerConfig)) (string, error) {
	cfg := &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: images.WorkloadImage},
		Command:  []string{"/bin/sh", "-c", "exec sleep 3600"},
		LogPath:  name + ".log",
		Linux:    &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{}},
	}
	if edit != nil {
		edit(cfg)
	}
	resp, err := pn.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: podID, Config: cfg, SandboxConfig: pod})
	if err != nil {
		return "", err
	}
	if _, err := pn.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
		if _, rerr := pn.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: resp.ContainerId}); rerr != nil {
			return resp.ContainerId, fmt.Errorf("%w (and removing it: %v)", err, rerr)
		}
		return resp.ContainerId, err
	}
	return resp.ContainerId, nil
}

// TestNodeJudgesEveryContainerWithoutTheWebhook: with no webhook in front of
// it, the node itself refuses an untrusted pod's containers that ask for the
// host (its filesystem, capabilities, devices) and an untrusted sandbox on
// the host network, through CRI as a kubelet would send them. A refused
// container leaves the pod as it was; the trusted tier may do what the
// untrusted may not.
func TestNodeJudgesEveryContainerWithoutTheWebhook(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	agent := podConfig(pn.Node, "agent", "agents", nil)
	agentID, err := runPod(ctx, pn.Node, agent)
	if err != nil {
		t.Fatalf("untrusted pod: %v", err)
	}
	hostPath := func(src string, ro bool) func(*cri.ContainerConfig) {
		return func(c *cri.ContainerConfig) {
			c.Mounts = append(c.Mounts, &cri.Mount{HostPath: src, ContainerPath: "/host", Readonly: ro})
		}
	}
	addCaps := func(caps ...string) func(*cri.ContainerConfig) {
		return func(c *cri.ContainerConfig) {
			c.Linux.SecurityContext.Capabilities = &cri.Capability{AddCapabilities: caps}
		}
	}
	refusals := []struct {
		name string
		edit func(*cri.ContainerConfig)
		rule string
	}{
		{"root", hostPath("/", false), "workload.host_path"},
		{"root-ro", hostPath("/", true), "workload.host_path"},
		{"double-slash", hostPath("//etc", true), "workload.host_path"},
		{"ledger-dir", hostPath(pn.Dir(), false), "workload.host_path"},
		{"sys-admin", addCaps("SYS_ADMIN"), "workload.capability"},
		{"net-admin", addCaps("NET_ADMIN"), "workload.capability"},
		{"device", func(c *cri.ContainerConfig) {
			c.Devices = append(c.Devices, &cri.Device{HostPath: "/dev/null", ContainerPath: "/dev/hostnull", Permissions: "rw"})
		}, "workload.device_forbidden"},
	}
	for _, r := range refusals {
		_, err := createContainer(ctx, pn, agentID, agent, r.name, r.edit)
		if err == nil {
			t.Errorf("container %s: created; want the node to refuse it with %s", r.name, r.rule)
			continue
		}
		for _, want := range []string{"bulkhead refused pod agents/agent", "[" + r.rule + "] "} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("container %s: refusal %q lacks %q", r.name, err, want)
			}
		}
		t.Logf("container %s refused as expected: %v", r.name, err)
	}
	// The pod is as it was: an ordinary container still starts in it, and
	// none of the refused ones exists.
	ok, err := createContainer(ctx, pn, agentID, agent, "ok", nil)
	if err != nil {
		t.Fatalf("an allowed container after the refusals: %v", err)
	}
	if out, err := execSync(ctx, pn.Node, ok, "true"); err != nil {
		t.Errorf("exec in the allowed container: %v %s", err, out)
	}
	list, err := pn.Runtime.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: agentID}})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Containers) != 1 || list.Containers[0].Id != ok {
		t.Errorf("pod containers after refusals: %d, want only the allowed one", len(list.Containers))
	}

	// A sandbox on the host network: containerd writes no network
	// namespace, and the node judges that, not what a webhook saw.
	hostNet := podConfig(pn.Node, "agent-hostnet", "agents", nil)
	hostNet.Linux.SecurityContext = &cri.LinuxSandboxSecurityContext{NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE}}
	if _, err := runPod(ctx, pn.Node, hostNet); err == nil || !strings.Contains(err.Error(), "workload.host_namespace") {
		t.Errorf("untrusted host-network pod: %v, want a refusal naming workload.host_namespace", err)
	} else {
		t.Logf("host-network pod refused as expected: %v", err)
	}

	// The trusted tier may mount host paths and add capabilities.
	platform := podConfig(pn.Node, "platform", "platform", nil)
	platformID, err := runPod(ctx, pn.Node, platform)
	if err != nil {
		t.Fatalf("trusted pod: %v", err)
	}
	if _, err := createContainer(ctx, pn, platformID, platform, "host", func(c *cri.ContainerConfig) {
		hostPath(pn.Dir(), true)(c)
		addCaps("SYS_ADMIN")(c)
	}); err != nil {
		t.Errorf("trusted container with a host path and SYS_ADMIN: %v", err)
	}

	for _, id := range []string{agentID, platformID} {
		if err := removePod(ctx, pn.Node, id); err != nil {
			t.Error(err)
		}
	}
	if res := pn.ledger(t); len(res) != 0 {
		t.Errorf("ledger after removal: %d reservations left", len(res))
	}
}
