package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// repoRego is the repository's policy bundle directory.
func repoRego(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", "..", "rego"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestNodeFileAgentSection: the node file Start writes is one the agent and
// the shims accept, with the agent's keys from Options, whatever sections
// the appended pipeline TOML opens; with the pipeline off it is a
// benchmark baseline.
func TestNodeFileAgentSection(t *testing.T) {
	dir := t.TempDir()
	pipeline, err := Pipeline{Bundle: repoRego(t), TenantsJSON: `{"bulkhead": {"tenants": {}}}`, MockModel: "h200", MockGPUs: 1,
		PinDir: "/sys/fs/bpf/bh-test"}.ShimConfig(filepath.Join(dir, "pipeline"), "10.1.2.0/24")
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{
		opts: Options{Dir: dir, PipelineEnabled: true, ShimConfig: pipeline, KubeletRoot: "/kubelet",
			AgentKubeconfig: "/cluster/admin.kubeconfig", AgentNodeName: "node-1", AgentMetricsAddress: "127.0.0.1:0"},
		StateDir: filepath.Join(dir, "bulkhead"), RunscRoot: filepath.Join(dir, "runsc"),
		agentSocket: filepath.Join(dir, "agent.sock"),
	}
	cfg, err := config.Parse([]byte(n.nodeFile("/bin/runsc", "/bin/runc")))
	if err != nil {
		t.Fatalf("the node file is refused: %v\n%s", err, n.nodeFile("/bin/runsc", "/bin/runc"))
	}
	want := config.AgentConfig{Socket: filepath.Join(dir, "agent.sock"), MetricsAddress: "127.0.0.1:0", Kubeconfig: "/cluster/admin.kubeconfig", NodeName: "node-1"}
	if cfg.Agent != want {
		t.Errorf("[agent] = %+v, want %+v", cfg.Agent, want)
	}
	if !cfg.Pipeline.Enabled || cfg.MIG.Backend != "mock" || !cfg.Netpol.Enabled {
		t.Errorf("pipeline %+v, mig.backend %q, netpol.enabled %t: want the appended pipeline's", cfg.Pipeline, cfg.MIG.Backend, cfg.Netpol.Enabled)
	}

	n.opts = Options{Dir: dir}
	cfg, err = config.Parse([]byte(n.nodeFile("/bin/runsc", "/bin/runc")))
	if err != nil {
		t.Fatalf("the node file without the pipeline is refused: %v", err)
	}
	if cfg.Pipeline.Enabled || !cfg.Pipeline.BenchmarkBaseline || cfg.Agent.Socket != n.agentSocket {
		t.Errorf("pipeline %+v, agent socket %q: want a benchmark baseline with the node's socket", cfg.Pipeline, cfg.Agent.Socket)
	}
}

// TestNodeAgentLifecycle starts a node with the pipeline and checks the
// agent's life as test/node manages it: it serves its socket (0600) before
// Start returns and admits a pod; stopped, it exits 0 on SIGTERM and a
// sandbox create is refused naming its socket; started again it admits
// pods; killed, it leaves its socket behind and a new one serves anyway;
// Stop leaves no process of it.
func TestNodeAgentLifecycle(t *testing.T) {
	bins := BinDirs()
	if err := Requirements(bins); err != nil {
		t.Skipf("node: %v", err)
	}
	dir, err := os.MkdirTemp("", "bh-node-")
	if err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/bh-node-%d", os.Getpid())
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	subnet := fmt.Sprintf("10.198.%d.0/24", os.Getpid()%250)
	tenants := `{"bulkhead": {"tenants": {"agents": {"tier": "untrusted", "namespaces": ["agents"], "quota": {"sandboxes": 5, "memory": "8Gi"}}}}}`
	extra, err := Pipeline{Bundle: repoRego(t), TenantsJSON: tenants, MockModel: "h200", MockGPUs: 1, PinDir: pinDir,
		Signed: true, BinDirs: bins}.ShimConfig(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	n, err := Start(ctx, Options{Dir: dir, BinDir: bins, Bridge: fmt.Sprintf("bhn%d", os.Getpid()%100000), Subnet: subnet,
		PipelineEnabled: true, ShimConfig: extra})
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node log:\n%s", n.Log())
		}
		if !stopped {
			n.Stop(context.Background())
		}
	})

	pid := n.AgentPID()
	if pid == 0 {
		t.Fatal("Start returned without a running agent")
	}
	st, err := os.Stat(n.AgentSocket())
	if err != nil || st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("agent socket %s: %v, mode %v: want a socket, 0600", n.AgentSocket(), err, st.Mode())
	}
	seq := 0
	runPod := func() (string, error) {
		seq++
		name := fmt.Sprintf("pod-%d", seq)
		cfg := &cri.PodSandboxConfig{
			Metadata:     &cri.PodSandboxMetadata{Name: name, Namespace: "agents", Uid: name + "-uid"},
			Hostname:     name,
			LogDirectory: filepath.Join(dir, "pod-logs", name),
			Linux:        &cri.LinuxPodSandboxConfig{},
		}
		if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
			return "", err
		}
		resp, err := n.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: Handler})
		if err != nil {
			return "", err
		}
		return resp.PodSandboxId, nil
	}
	if _, err := runPod(); err != nil {
		t.Fatalf("a pod of tenant agents with the agent running: %v", err)
	}

	if err := n.StopAgent(ctx); err != nil {
		t.Fatalf("StopAgent: %v", err)
	}
	if n.AgentPID() != 0 || syscall.Kill(pid, 0) == nil {
		t.Errorf("after StopAgent: AgentPID %d, pid %d still signalable", n.AgentPID(), pid)
	}
	if id, err := runPod(); err == nil {
		t.Errorf("sandbox %s created with the agent stopped: the pipeline must fail closed", id)
	} else if !strings.Contains(err.Error(), n.AgentSocket()) {
		t.Errorf("refusal with the agent stopped does not name its socket %s: %v", n.AgentSocket(), err)
	}

	if err := n.StartAgent(ctx); err != nil {
		t.Fatalf("StartAgent: %v", err)
	}
	if _, err := runPod(); err != nil {
		t.Fatalf("a pod after the agent's restart: %v", err)
	}
	if err := n.StartAgent(ctx); err == nil {
		t.Error("StartAgent while an agent runs: no error")
	}

	if err := n.KillAgent(); err != nil {
		t.Fatalf("KillAgent: %v", err)
	}
	if _, err := os.Stat(n.AgentSocket()); err != nil {
		t.Logf("the killed agent's socket is gone (%v); a new one must serve either way", err)
	}
	if err := n.KillAgent(); err == nil {
		t.Error("KillAgent with no agent running: no error")
	}
	if err := n.StartAgent(ctx); err != nil {
		t.Fatalf("StartAgent after KillAgent: %v", err)
	}
	if _, err := runPod(); err != nil {
		t.Fatalf("a pod after the agent was killed and started again: %v", err)
	}

	last := n.AgentPID()
	n.Stop(context.Background())
	stopped = true
	if syscall.Kill(last, 0) == nil {
		t.Errorf("agent pid %d survived Stop", last)
	}
	if pids := ProcessesUnder(dir); len(pids) > 0 {
		t.Errorf("processes under %s after Stop: %v", dir, pids)
	}
}
