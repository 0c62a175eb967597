package cluster

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/deploy/image"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// overlayFS is the test overlay of deploy/ (overlay/kustomization.yaml says
// what it changes and why).
//
//go:embed overlay/*.yaml
var overlayFS embed.FS

// Install is Bulkhead installed on a cluster the way docs/install.md tells
// an operator, from a copy of the repository's deploy/ and rego/ in the
// cluster's directory (deploy/tls and deploy/policy are per cluster), with
// the images of deploy/image imported on every node as docs/release.md
// tells: the webhook's Deployment and the node DaemonSet run as deployed,
// its installer registering the runtimes in each node's containerd and its
// agent serving the node's shims.
type Install struct {
	// Repo is the copy: Repo/deploy, Repo/rego.
	Repo string
	// Overlay is the kustomization applied: deploy/ with the test overlay.
	Overlay string
	// AdmissionKubeconfig is docs/install.md step 3b's webhooks.kubeconfig:
	// the API server's client certificate for the webhook.
	AdmissionKubeconfig string

	dir    string
	images []builtImage
	log    func(string, ...any)
	// gpuNodes and mockGPUs: InstallOptions'.
	gpuNodes []string
	mockGPUs int
}

// InstallOptions configures PrepareInstall.
type InstallOptions struct {
	// Dir is the cluster's directory (the copy goes to Dir/repo).
	Dir string
	// RepoRoot is the repository whose deploy/ and rego/ are installed.
	RepoRoot string
	// TenantsJSON is the tenants file of step 2 ({"bulkhead": {"tenants": ...}}).
	TenantsJSON string
	// GPUNodes are the nodes the DaemonSet's installer finds a GPU driver
	// on (GPU_NODE=auto), each with MockGPUs mock H200s: the overlay's
	// gpu.toml is deploy/node/gpu.toml with the mock backend instead of
	// NVML, which these machines lack.
	GPUNodes []string
	MockGPUs int
	// Log receives one line per step.
	Log func(string, ...any)
}

// webhookNamespace, webhookDeployment and webhookSelector name the
// webhook's Deployment of deploy/webhook and its pods; nodeDaemonSet and
// nodeSelector the DaemonSet of deploy/node and its pods.
const (
	webhookNamespace  = "bulkhead-system"
	webhookDeployment = "bulkhead-webhook"
	webhookSelector   = "app.kubernetes.io/name=bulkhead-webhook"
	nodeDaemonSet     = "bulkhead-node"
	nodeSelector      = "app.kubernetes.io/name=bulkhead-node"
)

// gpuMarker is the file, in a node's namespace, whose presence the
// overlay's NVIDIA_DRIVER_PROC makes the installer take for a loaded
// NVIDIA driver (GPU_NODE=auto): /proc/driver/nvidia is the kernel's, the
// same on both nodes of one host.
const gpuMarker = "/etc/containerd/bulkhead-test-gpu-driver"

// PrepareInstall does steps 2, 3 and 3b of docs/install.md before the
// cluster starts (3b configures the API server, which reads its admission
// configuration at start): the signed bundle (deploy/policy/build.sh), the
// webhook's certificates (deploy/gen-tls.sh) and the API server's
// webhooks.kubeconfig. It also builds the images (deploy/image).
func PrepareInstall(ctx context.Context, o InstallOptions) (*Install, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if _, err := node.LookPath("bulkhead-webhook"); err != nil {
		return nil, errors.New("install: needs bulkhead-webhook (make build)")
	}
	in := &Install{Repo: filepath.Join(o.Dir, "repo"), dir: o.Dir, log: o.Log, gpuNodes: o.GPUNodes, mockGPUs: o.MockGPUs}
	for _, sub := range []string{"deploy", "rego"} {
		if err := copyTree(filepath.Join(o.RepoRoot, sub), filepath.Join(in.Repo, sub)); err != nil {
			return nil, err
		}
	}
	// Files a checkout may hold from an operator's own run are not ours.
	for _, stale := range []string{"deploy/tls", "deploy/policy/bundle.tar.gz", "deploy/policy/bundle.pem"} {
		_ = os.RemoveAll(filepath.Join(in.Repo, stale))
	}
	tenants := filepath.Join(o.Dir, "tenants.json")
	if err := os.WriteFile(tenants, []byte(o.TenantsJSON), 0o644); err != nil {
		return nil, err
	}
	key := filepath.Join(o.Dir, "bundle-signing.key")
	opa, err := node.LookPath("opa")
	if err != nil {
		return nil, errors.New("install: needs opa (make tools)")
	}
	steps := [][]string{
		{"openssl", "genrsa", "-out", key, "3072"},
		{"env", "OPA=" + opa, filepath.Join(in.Repo, "deploy/policy/build.sh"), tenants, key},
		{filepath.Join(in.Repo, "deploy/gen-tls.sh")},
	}
	for _, s := range steps {
		o.Log("install: %s", strings.Join(s, " "))
		if out, err := exec.CommandContext(ctx, s[0], s[1:]...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("install: %s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
	// Step 3b: the user the API server picks for the webhook is named
	// after its host, <service>.<namespace>.svc.
	adm := filepath.Join(o.Dir, "admission")
	if err := os.MkdirAll(adm, 0o700); err != nil {
		return nil, err
	}
	for _, f := range []string{"apiserver-client.crt", "apiserver-client.key"} {
		if err := copyFile(filepath.Join(in.Repo, "deploy/tls", f), filepath.Join(adm, f), 0o600); err != nil {
			return nil, err
		}
	}
	in.AdmissionKubeconfig = filepath.Join(adm, "webhooks.kubeconfig")
	if err := os.WriteFile(in.AdmissionKubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
users:
  - name: bulkhead-webhook.bulkhead-system.svc
    user:
      client-certificate: %s
      client-key: %s
`, filepath.Join(adm, "apiserver-client.crt"), filepath.Join(adm, "apiserver-client.key"))), 0o600); err != nil {
		return nil, err
	}
	started := time.Now()
	if in.images, err = buildImages(in.Repo, filepath.Join(o.Dir, "images"), image.Webhook, image.NodeAgent, image.Installer); err != nil {
		return nil, err
	}
	for _, b := range in.images {
		o.Log("install: built image %s (%s) in %s", b.Ref, b.Archive, time.Since(started).Round(time.Millisecond))
	}
	return in, nil
}

// Bundle and BundleKey are the signed bundle and its public key (step 2).
func (in *Install) Bundle() string    { return filepath.Join(in.Repo, "deploy/policy/bundle.tar.gz") }
func (in *Install) BundleKey() string { return filepath.Join(in.Repo, "deploy/policy/bundle.pem") }

// Apply does steps 1 and 4 of docs/install.md: import the images on every
// node, label the nodes, `kubectl apply -k` (deploy/ through the test
// overlay, which points it at the imported images and sets what an
// operator sets for this cluster: config.toml's ranges, gpu.toml's
// backend, how the installer restarts containerd), and waits until the
// node DaemonSet is rolled out (the runtimes installed, the agents
// serving) and the webhook's Deployment is available and answering.
func (in *Install) Apply(ctx context.Context, c *Cluster) error {
	in.Overlay = filepath.Join(in.dir, "overlay")
	if err := os.MkdirAll(in.Overlay, 0o755); err != nil {
		return err
	}
	started := time.Now()
	for _, w := range c.Nodes {
		for _, b := range in.images {
			if err := importImage(ctx, w, b); err != nil {
				return fmt.Errorf("install: %w", err)
			}
		}
	}
	in.log("install: imported %d image(s) on %d nodes in %s", len(in.images), len(c.Nodes), time.Since(started).Round(time.Millisecond))
	if err := in.writeOverlay(c); err != nil {
		return err
	}
	for _, name := range in.gpuNodes {
		w := c.Node(name)
		if w == nil {
			return fmt.Errorf("install: GPU node %q: not a node of the cluster", name)
		}
		if err := os.WriteFile(w.Node.HostPath(gpuMarker), []byte("test/cluster: mock H200s\n"), 0o644); err != nil {
			return err
		}
	}
	for _, args := range [][]string{
		{"label", "node", "--all", "bulkhead.dev/node=true"},
		{"apply", "-k", in.Overlay},
	} {
		in.log("install: kubectl %s", strings.Join(args, " "))
		if out, err := c.Kubectl(ctx, args...); err != nil {
			return fmt.Errorf("install: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if err := in.waitNodes(ctx, c); err != nil {
		return err
	}
	return in.waitWebhook(ctx, c)
}

// writeOverlay writes the overlay's kustomization and the node files it
// puts in ConfigMap bulkhead-node-config: deploy/node/config.toml with
// this cluster's ranges (cluster_cidrs: its pod ranges and Service ranges;
// every tier's shared services: the nodes' bridge gateways) and no
// metrics address (both nodes' agents share the host's network, and so
// :9470), and deploy/node/gpu.toml with the mock backend.
func (in *Install) writeOverlay(c *Cluster) error {
	src, err := os.ReadFile(filepath.Join(in.Repo, "deploy/node/config.toml"))
	if err != nil {
		return err
	}
	var cidrs, shared []string
	for _, p := range append(append([]string{}, c.opts.ClusterCIDRs...), ServiceCIDR, ServiceCIDR6) {
		cidrs = append(cidrs, fmt.Sprintf("%q", p))
	}
	for _, w := range c.Nodes {
		for _, subnet := range []string{w.opts.Node.Subnet, w.opts.Node.Subnet6} {
			if subnet == "" {
				continue
			}
			gw := netip.MustParsePrefix(subnet).Masked().Addr().Next()
			shared = append(shared, fmt.Sprintf("%q", netip.PrefixFrom(gw, gw.BitLen())))
		}
	}
	list := "[" + strings.Join(shared, ", ") + "]"
	conf, err := setTOML(string(src), map[string]string{
		"metrics_address": `""`,
		"cluster_cidrs":   "[" + strings.Join(cidrs, ", ") + "]",
		"untrusted":       list, "standard": list, "trusted": list,
	})
	if err != nil {
		return fmt.Errorf("install: deploy/node/config.toml: %w", err)
	}
	gpuSrc, err := os.ReadFile(filepath.Join(in.Repo, "deploy/node/gpu.toml"))
	if err != nil {
		return err
	}
	gpu, err := setTOML(string(gpuSrc), map[string]string{
		"backend": fmt.Sprintf("\"mock\"\nmock_model = \"h200\"\nmock_gpus = %d\nmock_state = \"/var/lib/bulkhead/mock-gpus.json\"", in.mockGPUs),
	})
	if err != nil {
		return fmt.Errorf("install: deploy/node/gpu.toml: %w", err)
	}
	for name, text := range map[string]string{"config.toml": conf, "gpu.toml": gpu} {
		if err := os.WriteFile(filepath.Join(in.Overlay, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	kust := template.Must(template.ParseFS(overlayFS, "overlay/kustomization.yaml"))
	return writeTemplate(filepath.Join(in.Overlay, "kustomization.yaml"), kust, map[string]any{
		"Images": in.images, "GPUMarker": "/host" + gpuMarker,
	})
}

// setTOML sets each key of values to its value in text, a TOML file: the
// one line `key = ...` that is not a comment. A key on no such line, or on
// more than one, is an error: the file has changed under the test.
func setTOML(text string, values map[string]string) (string, error) {
	lines := strings.Split(text, "\n")
	for key, value := range values {
		n := 0
		for i, l := range lines {
			if k, _, ok := strings.Cut(l, "="); ok && strings.TrimSpace(k) == key && !strings.HasPrefix(strings.TrimSpace(l), "#") {
				lines[i] = key + " = " + value
				n++
			}
		}
		if n != 1 {
			return "", fmt.Errorf("key %s: on %d lines, want 1", key, n)
		}
	}
	return strings.Join(lines, "\n"), nil
}

// waitNodes returns once the node DaemonSet is rolled out on every node:
// each installer has written the node's files and registered the
// runtimes (restarting the node's containerd), each agent serves.
func (in *Install) waitNodes(ctx context.Context, c *Cluster) error {
	started := time.Now()
	args := []string{"-n", webhookNamespace, "rollout", "status", "daemonset/" + nodeDaemonSet, "--timeout=240s"}
	in.log("install: kubectl %s", strings.Join(args, " "))
	if out, err := c.Kubectl(ctx, args...); err != nil {
		d, _ := c.Kubectl(ctx, "-n", webhookNamespace, "describe", "pods", "-l", nodeSelector)
		return fmt.Errorf("install: kubectl %s: %v\n%s\n%s\n%s", strings.Join(args, " "), err, out, d, in.NodeLogs(ctx, c, 40))
	}
	in.log("install: DaemonSet %s rolled out on %d nodes in %s", nodeDaemonSet, len(c.Nodes), time.Since(started).Round(time.Millisecond))
	return nil
}

// NodeLogs is the last lines of every DaemonSet pod's containers' logs
// (kubectl logs).
func (in *Install) NodeLogs(ctx context.Context, c *Cluster, lines int) string {
	out, _ := c.Kubectl(ctx, "-n", webhookNamespace, "logs", "-l", nodeSelector, "--prefix", "--all-containers", fmt.Sprintf("--tail=%d", lines))
	return out
}

// StopWebhook scales the webhook's Deployment to zero, as an operator (or
// an outage of every replica) would, and returns once no pod of it is
// left: the API server then finds no endpoint of its Service.
func (in *Install) StopWebhook(ctx context.Context, c *Cluster) error {
	for _, args := range [][]string{
		{"-n", webhookNamespace, "scale", "deployment", webhookDeployment, "--replicas=0"},
		{"-n", webhookNamespace, "wait", "--for=delete", "pod", "-l", webhookSelector, "--timeout=120s"},
	} {
		in.log("install: kubectl %s", strings.Join(args, " "))
		if out, err := c.Kubectl(ctx, args...); err != nil {
			return fmt.Errorf("stop the webhook: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// StartWebhook scales the webhook's Deployment back to the replicas of
// deploy/ and waits as Apply does.
func (in *Install) StartWebhook(ctx context.Context, c *Cluster) error {
	dep, err := in.renderedWebhook(ctx, c)
	if err != nil {
		return err
	}
	args := []string{"-n", webhookNamespace, "scale", "deployment", webhookDeployment, fmt.Sprintf("--replicas=%d", *dep.Spec.Replicas)}
	in.log("install: kubectl %s", strings.Join(args, " "))
	if out, err := c.Kubectl(ctx, args...); err != nil {
		return fmt.Errorf("start the webhook: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return in.waitWebhook(ctx, c)
}

// renderedWebhook is the webhook's Deployment as deploy/ renders it.
func (in *Install) renderedWebhook(ctx context.Context, c *Cluster) (*appsv1.Deployment, error) {
	out, err := c.Kubectl(ctx, "kustomize", filepath.Join(in.Repo, "deploy"))
	if err != nil {
		return nil, fmt.Errorf("install: kubectl kustomize deploy: %v\n%s", err, out)
	}
	for _, doc := range strings.Split(out, "\n---\n") {
		var d appsv1.Deployment
		if yaml.Unmarshal([]byte(doc), &d) == nil && d.Kind == "Deployment" && d.Name == webhookDeployment && d.Spec.Replicas != nil {
			return &d, nil
		}
	}
	return nil, errors.New("install: deploy/ renders no Deployment bulkhead-webhook with replicas")
}

// waitWebhook returns once every replica of the webhook's Deployment is
// available (Ready: its certificate rotator has published the caBundle)
// and the API server has the webhook's own answer to a server dry run of
// a pod in a namespace of no tenant: a refusal that names the webhook,
// not a failure to call it.
func (in *Install) waitWebhook(ctx context.Context, c *Cluster) error {
	started := time.Now()
	args := []string{"-n", webhookNamespace, "rollout", "status", "deployment/" + webhookDeployment, "--timeout=180s"}
	in.log("install: kubectl %s", strings.Join(args, " "))
	if out, err := c.Kubectl(ctx, args...); err != nil {
		return fmt.Errorf("install: kubectl %s: %v\n%s\n%s", strings.Join(args, " "), err, out, in.describeWebhook(ctx, c))
	}
	var last string
	err := waitFor(ctx, nil, "the webhook's answer through its Service", time.Minute, func(ctx context.Context) error {
		last, _ = c.KubectlStdin(ctx, Pod("webhook-probe", "default", "", nil), "create", "--dry-run=server", "-f", "-")
		if strings.Contains(last, `admission webhook "validate.bulkhead.dev" denied the request`) {
			return nil
		}
		return errors.New(strings.TrimSpace(last))
	})
	if err != nil {
		return fmt.Errorf("install: %w\n%s", err, in.describeWebhook(ctx, c))
	}
	in.log("install: webhook Deployment available and answering in %s", time.Since(started).Round(time.Millisecond))
	return nil
}

// describeWebhook is what kubectl says of the webhook's pods, and their
// logs (for failures).
func (in *Install) describeWebhook(ctx context.Context, c *Cluster) string {
	d, _ := c.Kubectl(ctx, "-n", webhookNamespace, "describe", "pods", "-l", webhookSelector)
	return d + "\n" + in.WebhookLogs(ctx, c, 40)
}

// WebhookLogs is the last lines of every webhook pod's log (kubectl logs).
func (in *Install) WebhookLogs(ctx context.Context, c *Cluster, lines int) string {
	out, _ := c.Kubectl(ctx, "-n", webhookNamespace, "logs", "-l", webhookSelector, "--prefix", "--all-containers", fmt.Sprintf("--tail=%d", lines))
	return out
}

// Uninstall follows docs/install.md's Uninstall: the webhook configuration
// first, then the workloads (the caller's namespaces), then the
// DaemonSet's `remove` on every node (its command patched as the page
// says, and rolled out), then `kubectl delete -k` (the webhook's
// Deployment and the DaemonSet with the rest) and the node label.
func (in *Install) Uninstall(ctx context.Context, c *Cluster, namespaces ...string) error {
	steps := [][]string{{"delete", "validatingwebhookconfiguration", "bulkhead"}}
	if len(namespaces) > 0 {
		steps = append(steps, append([]string{"delete", "namespace", "--wait=true"}, namespaces...))
	}
	steps = append(steps,
		[]string{"-n", webhookNamespace, "patch", "daemonset", nodeDaemonSet, "--type=json",
			"-p", `[{"op":"replace","path":"/spec/template/spec/containers/0/command/2","value":"remove"}]`},
		[]string{"-n", webhookNamespace, "rollout", "status", "daemonset/" + nodeDaemonSet, "--timeout=240s"},
		// The configuration is gone already (step 1).
		[]string{"delete", "-k", in.Overlay, "--ignore-not-found", "--wait=true"},
		[]string{"label", "node", "--all", "bulkhead.dev/node-"})
	for _, args := range steps {
		in.log("uninstall: kubectl %s", strings.Join(args, " "))
		if out, err := c.Kubectl(ctx, args...); err != nil {
			return fmt.Errorf("uninstall: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// copyTree copies regular files and directories (not symlinks) from src to dst.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case info.Mode().IsRegular():
			return copyFile(p, target, info.Mode().Perm())
		}
		return nil
	})
}
