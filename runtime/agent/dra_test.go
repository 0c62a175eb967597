package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
	_ "github.com/bulkhead-runtime/bulkhead/mig/mocknode/register" // mig.backend = "mock"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// TestAgentHostsTheKubeletPlugin: with dra.enabled and an API server to
// publish to, the agent's plugin registers with the kubelet (its sockets
// appear in the kubelet's directories) and is gone once stopped; without
// either, the agent serves without it.
func TestAgentHostsTheKubeletPlugin(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct {
		name           string
		enabled, kube  bool
		wantRegistered bool
	}{
		{"enabled", true, true, true},
		{"disabled", false, true, false},
		{"no API server", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "agent-dra") // short: unix socket paths
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			bundle, err := filepath.Abs("../../rego")
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Default()
			cfg.RunscRoot = filepath.Join(dir, "runsc")
			cfg.RuncRoot = filepath.Join(dir, "runc")
			cfg.StateDir = filepath.Join(dir, "state")
			cfg.LedgerPath = filepath.Join(dir, "ledger.db")
			cfg.Policy = config.PolicyConfig{Bundle: bundle, InsecureSkipVerification: true}
			cfg.Netpol.Enabled = false
			cfg.MIG = config.MIGConfig{Backend: "mock", MockModel: "h200", MockGPUs: 1, MockState: filepath.Join(dir, "gpus.json"), CDISpecDir: filepath.Join(dir, "cdi")}
			cfg.DRA = config.DRAConfig{Enabled: tc.enabled, RegistrarDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin")}
			cfg.Agent.NodeName = "gpu-node"
			if tc.kube {
				// An API server that never answers: publishing retries in the
				// background, registration does not wait for it.
				cfg.Agent.Kubeconfig = filepath.Join(dir, "kubeconfig")
				kc := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n" +
					"users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
				if err := os.WriteFile(cfg.Agent.Kubeconfig, []byte(kc), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(cfg.DRA.RegistrarDir, 0o700); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			a, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			stop := a.startDRA(ctx)
			reg := filepath.Join(cfg.DRA.RegistrarDir, migdra.DriverName+"-reg.sock")
			plugin := filepath.Join(cfg.DRA.PluginDir, "dra.sock")
			for _, sock := range []string{reg, plugin} {
				_, err := os.Stat(sock)
				if registered := err == nil; registered != tc.wantRegistered {
					t.Errorf("%s: %v; want registered %v", sock, err, tc.wantRegistered)
				}
			}
			stop()
			for _, sock := range []string{reg, plugin} {
				if _, err := os.Stat(sock); err == nil {
					t.Errorf("%s: still there after stop", sock)
				}
			}
		})
	}
}
