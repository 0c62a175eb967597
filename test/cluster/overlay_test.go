package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// TestSetTOML: a key is set on its one uncommented line; a key on no line,
// or on two, is refused by name (the shipped file changed under the test).
func TestSetTOML(t *testing.T) {
	const src = "# metrics_address = \"x\"\n[agent]\nmetrics_address = \":9470\"\n[netpol]\ncluster_cidrs = [\"a\"]\n[b]\nuntrusted = [\"1\"]\n[c]\nuntrusted = [\"2\"]\n"
	for _, tc := range []struct {
		name    string
		values  map[string]string
		want    string
		wantErr string
	}{
		{"sets", map[string]string{"metrics_address": `""`, "cluster_cidrs": `["10.0.0.0/8"]`},
			"# metrics_address = \"x\"\n[agent]\nmetrics_address = \"\"\n[netpol]\ncluster_cidrs = [\"10.0.0.0/8\"]\n[b]\nuntrusted = [\"1\"]\n[c]\nuntrusted = [\"2\"]\n", ""},
		{"missing", map[string]string{"pin_dir": `"/x"`}, "", "key pin_dir: on 0 lines, want 1"},
		{"twice", map[string]string{"untrusted": `[]`}, "", "key untrusted: on 2 lines, want 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := setTOML(src, tc.values)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("setTOML = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestOverlayRenders: the test overlay, rendered by kubectl kustomize over
// the repository's deploy/, keeps the node DaemonSet and the webhook's
// Deployment, changes the DaemonSet only in its images and the installer's
// RESTART_CONTAINERD and NVIDIA_DRIVER_PROC, and replaces the node
// ConfigMap with this cluster's config.toml and the mock gpu.toml.
func TestOverlayRenders(t *testing.T) {
	kubectl, err := node.LookPath("kubectl")
	if err != nil {
		t.Skip("needs kubectl (make tools)")
	}
	dir := t.TempDir()
	in := &Install{Repo: filepath.Join(dir, "repo"), Overlay: filepath.Join(dir, "overlay"), dir: dir, gpuNodes: []string{NodeA}, mockGPUs: 2,
		images: []builtImage{{Name: "bulkhead-node-agent", Repository: "bulkhead.local/bulkhead-node-agent", Tag: ImageTag}}}
	if err := copyTree(filepath.Join(repoRoot(t), "deploy"), filepath.Join(in.Repo, "deploy")); err != nil {
		t.Fatal(err)
	}
	// Stand-ins for the per-cluster files gen-tls.sh and build.sh write.
	for _, f := range []string{"tls/tls.crt", "tls/tls.key", "tls/ca.crt", "tls/client-ca.crt", "policy/bundle.tar.gz", "policy/bundle.pem"} {
		p := filepath.Join(in.Repo, "deploy", f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("stand-in"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(in.Overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Cluster{opts: Options{ClusterCIDRs: []string{"10.190.16.0/20", "fd19:1::/48"}}, Nodes: []*Worker{
		{Name: NodeA, opts: NodeOptions{Node: node.Options{Subnet: "10.190.17.0/24", Subnet6: "fd19:1:0:1::/64"}}},
		{Name: NodeB, opts: NodeOptions{Node: node.Options{Subnet: "10.190.18.0/24"}}},
	}}
	if err := in.writeOverlay(c); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "kustomize", in.Overlay).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	deployment := false
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch {
		case meta.Kind == "DaemonSet" && meta.Metadata.Name == nodeDaemonSet:
			ds = &appsv1.DaemonSet{}
			if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
				t.Fatal(err)
			}
		case meta.Kind == "ConfigMap" && meta.Metadata.Name == "bulkhead-node-config":
			cm = &corev1.ConfigMap{}
			if err := yaml.Unmarshal([]byte(doc), cm); err != nil {
				t.Fatal(err)
			}
		case meta.Kind == "Deployment" && meta.Metadata.Name == webhookDeployment:
			deployment = true
		}
	}
	if ds == nil || !deployment || cm == nil {
		t.Fatalf("rendered: DaemonSet %v, webhook Deployment %v, ConfigMap %v: want all three", ds != nil, deployment, cm != nil)
	}
	env := map[string]string{}
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		if ctr.Name == "install" {
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
		}
		if ctr.Name == "agent" && ctr.Image != "bulkhead.local/bulkhead-node-agent:"+ImageTag {
			t.Errorf("agent image %q, want the test's", ctr.Image)
		}
	}
	for k, want := range map[string]string{
		"RESTART_CONTAINERD": "kill $(cat /host/run/containerd/containerd.pid)",
		"NVIDIA_DRIVER_PROC": "/host" + gpuMarker,
		"GPU_NODE":           "auto", // deploy/'s, unchanged
		"HOST_ROOT":          "/host",
	} {
		if env[k] != want {
			t.Errorf("install container %s = %q, want %q", k, env[k], want)
		}
	}
	conf, gpu := cm.Data["config.toml"], cm.Data["gpu.toml"]
	for _, want := range []string{
		`metrics_address = ""`,
		`cluster_cidrs = ["10.190.16.0/20", "fd19:1::/48", "10.0.0.0/24", "fd10:96::/112"]`,
		`untrusted = ["10.190.17.1/32", "fd19:1:0:1::1/128", "10.190.18.1/32"]`,
		`pin_dir = "/sys/fs/bpf/bulkhead"`, // deploy/'s, unchanged
	} {
		if !strings.Contains(conf, want) {
			t.Errorf("config.toml lacks %s:\n%s", want, conf)
		}
	}
	for _, want := range []string{`backend = "mock"`, "mock_gpus = 2", "[dra]"} {
		if !strings.Contains(gpu, want) {
			t.Errorf("gpu.toml lacks %s:\n%s", want, gpu)
		}
	}
}
