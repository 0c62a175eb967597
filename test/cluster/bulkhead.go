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
// tells.
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
}

// InstallOptions configures PrepareInstall.
type InstallOptions struct {
	// Dir is the cluster's directory (the copy goes to Dir/repo).
	Dir string
	// RepoRoot is the repository whose deploy/ and rego/ are installed.
	RepoRoot string
	// TenantsJSON is the tenants file of step 2 ({"bulkhead": {"tenants": ...}}).
	TenantsJSON string
	// Log receives one line per step.
	Log func(string, ...any)
}

// webhookNamespace, webhookDeployment and webhookSelector name the
// webhook's Deployment of deploy/webhook and its pods.
const (
	webhookNamespace  = "bulkhead-system"
	webhookDeployment = "bulkhead-webhook"
	webhookSelector   = "app.kubernetes.io/name=bulkhead-webhook"
)

// PrepareInstall does steps 2, 3 and 3b of docs/install.md before the
// cluster starts (3b configures the API server, which reads its admission
// configuration at start): the signed bundle (deploy/policy/build.sh), the
// webhook's certificates (deploy/gen-tls.sh) and the API server's
// webhooks.kubeconfig. It also builds the webhook's image (deploy/image).
func PrepareInstall(ctx context.Context, o InstallOptions) (*Install, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if _, err := node.LookPath("bulkhead-webhook"); err != nil {
		return nil, errors.New("install: needs bulkhead-webhook (make build)")
	}
	in := &Install{Repo: filepath.Join(o.Dir, "repo"), dir: o.Dir, log: o.Log}
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
	if in.images, err = buildImages(in.Repo, filepath.Join(o.Dir, "images"), image.Webhook); err != nil {
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
// overlay, which points it at the imported images), and waits until the
// webhook's Deployment is available and the API server gets its answers.
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
	kust := template.Must(template.ParseFS(overlayFS, "overlay/kustomization.yaml"))
	if err := writeTemplate(filepath.Join(in.Overlay, "kustomization.yaml"), kust, map[string]any{"Images": in.images}); err != nil {
		return err
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
	if err := in.AgentsAsServiceAccount(ctx, c); err != nil {
		return err
	}
	return in.waitWebhook(ctx, c)
}

// AgentsAsServiceAccount restarts every node's agent with the token of the
// DaemonSet's ServiceAccount, as its agent container runs: from here on
// only deploy/'s RBAC grants the agents anything (Events, the pods,
// Services and EndpointSlices the fence learns).
func (in *Install) AgentsAsServiceAccount(ctx context.Context, c *Cluster) error {
	out, err := c.Kubectl(ctx, "kustomize", filepath.Join(in.Repo, "deploy"))
	if err != nil {
		return fmt.Errorf("install: kubectl kustomize deploy: %v\n%s", err, out)
	}
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(out, "\n---\n") {
		var d appsv1.DaemonSet
		if yaml.Unmarshal([]byte(doc), &d) == nil && d.Kind == "DaemonSet" && d.Name == "bulkhead-node" {
			ds = &d
		}
	}
	if ds == nil || ds.Spec.Template.Spec.ServiceAccountName == "" {
		return errors.New("install: deploy/ renders no DaemonSet bulkhead-node with a serviceAccountName")
	}
	sa := ds.Spec.Template.Spec.ServiceAccountName
	for _, w := range c.Nodes {
		tok, err := c.Kubectl(ctx, "-n", ds.Namespace, "create", "token", sa, "--duration=4h")
		if err != nil {
			return fmt.Errorf("install: token of %s: %v\n%s", sa, err, tok)
		}
		if err := c.writeTokenKubeconfig(w.AgentKubeconfig, "system:serviceaccount:"+ds.Namespace+":"+sa, strings.TrimSpace(tok)); err != nil {
			return err
		}
		in.log("install: node %s: the agent restarts as ServiceAccount %s/%s", w.Name, ds.Namespace, sa)
		if err := w.Node.StopAgent(ctx); err != nil {
			return fmt.Errorf("install: node %s: %w", w.Name, err)
		}
		if err := w.Node.StartAgent(ctx); err != nil {
			return fmt.Errorf("install: node %s: %w", w.Name, err)
		}
	}
	return nil
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
// first, then the workloads (the caller's namespaces), then `kubectl
// delete -k` (the webhook's Deployment with the rest) and the node label.
// Step 3 (the DaemonSet's `remove`) has no DaemonSet here (see the
// overlay).
func (in *Install) Uninstall(ctx context.Context, c *Cluster, namespaces ...string) error {
	steps := [][]string{{"delete", "validatingwebhookconfiguration", "bulkhead"}}
	if len(namespaces) > 0 {
		steps = append(steps, append([]string{"delete", "namespace", "--wait=true"}, namespaces...))
	}
	steps = append(steps,
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

// ShimConfig returns the [policy], [mig] and [netpol] TOML of a test
// node's agent: the same signed bundle and key as the webhook's ConfigMap
// (deploy/node/config.toml's [policy] names them under /etc/bulkhead), a
// mock GPU node for MIG slices (state in dir), and the eBPF fence pinned at
// pinDir. The fence's cluster is every node's pods (clusterCIDRs, not just
// this node's subnet: another node's pod the agent has not learned is an
// unknown cluster address, never the outside world) and the Services; the
// shared service of every tier is the node's own bridge gateway (subnet's
// and subnet6's first address).
//
// gpus is the node's mock H200s; with none the node has no MIG backend. A
// node with GPUs hosts the DRA kubelet plugin in its agent, registered in
// kubeletRoot's plugins_registry.
func (in *Install) ShimConfig(dir, subnet, subnet6, pinDir string, clusterCIDRs []string, gpus int, kubeletRoot string) string {
	ip, _, _ := strings.Cut(subnet, "/")
	shared := fmt.Sprintf("%q", strings.TrimSuffix(ip, ".0")+".1/32")
	if subnet6 != "" {
		shared += fmt.Sprintf(", %q", netip.MustParsePrefix(subnet6).Masked().Addr().Next().String()+"/128")
	}
	// Each node's CDI specs in its own directory, the one its containerd
	// reads (story.go, node.Options.CDISpecDir): with the default
	// /var/run/cdi the two nodes of one host shared it, and node-b's
	// garbage collection removed node-a's claim specs, which no
	// reservation of node-b's ledger held, before their pods started.
	cdi := filepath.Join(dir, "cdi")
	migConfig := fmt.Sprintf("[mig]\nbackend = \"none\"\ncdi_spec_dir = %q\n", cdi)
	if gpus > 0 {
		migConfig = fmt.Sprintf("[mig]\nbackend = \"mock\"\nmock_model = \"h200\"\nmock_gpus = %d\nmock_state = %q\ncdi_spec_dir = %q\n[dra]\nenabled = true\nregistrar_dir = %q\nplugin_dir = %q\n",
			gpus, filepath.Join(dir, "mock-gpus.json"), cdi, filepath.Join(kubeletRoot, "plugins_registry"), filepath.Join(kubeletRoot, "plugins", "mig.bulkhead.dev"))
	}
	var cidrs []string
	for _, c := range append(append([]string{}, clusterCIDRs...), ServiceCIDR, ServiceCIDR6) {
		cidrs = append(cidrs, fmt.Sprintf("%q", c))
	}
	return fmt.Sprintf(`[policy]
bundle = %q
key_file = %q
key_id = "bulkhead"
scope = "bulkhead"
decision_log = %q
%s[netpol]
enabled = true
pin_dir = %q
lock_path = %q
cluster_cidrs = [%s]
[netpol.shared_services]
untrusted = [%s]
standard = [%s]
trusted = [%s]
`, in.Bundle(), in.BundleKey(), filepath.Join(dir, "decisions.log"), migConfig,
		pinDir, filepath.Join(dir, "netpol.lock"), strings.Join(cidrs, ", "), shared, shared, shared)
}
