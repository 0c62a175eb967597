package cluster

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// overlayFS is the test overlay of deploy/ (overlay/kustomization.yaml says
// what it changes and why).
//
//go:embed overlay/*.yaml
var overlayFS embed.FS

// Install is Bulkhead installed on a cluster the way docs/install.md tells
// an operator, from a copy of the repository's deploy/ and rego/ in the
// cluster's directory (deploy/tls and deploy/policy are per cluster).
type Install struct {
	// Repo is the copy: Repo/deploy, Repo/rego.
	Repo string
	// Overlay is the kustomization applied: deploy/ with the test overlay.
	Overlay string
	// AdmissionKubeconfig is docs/install.md step 3b's webhooks.kubeconfig:
	// the API server's client certificate for the webhook.
	AdmissionKubeconfig string
	// Address and Port are where the webhook listens: a link of this
	// install's own (Link), since an EndpointSlice may not name loopback.
	Address string
	Port    int
	Link    string

	dir        string
	probe      string
	webhookBin string
	webhook    *process
	log        func(string, ...any)
}

// InstallOptions configures PrepareInstall.
type InstallOptions struct {
	// Dir is the cluster's directory (the copy goes to Dir/repo).
	Dir string
	// RepoRoot is the repository whose deploy/ and rego/ are installed.
	RepoRoot string
	// TenantsJSON is the tenants file of step 2 ({"bulkhead": {"tenants": ...}}).
	TenantsJSON string
	// Link names the link the webhook listens on (at most 15 bytes; an
	// empty bridge, since this kernel has no dummy links) and Address its
	// IPv4 address.
	Link, Address string
	// Log receives one line per step.
	Log func(string, ...any)
}

// PrepareInstall does steps 2, 3 and 3b of docs/install.md before the
// cluster starts (3b configures the API server, which reads its admission
// configuration at start): the signed bundle (deploy/policy/build.sh), the
// webhook's certificates (deploy/gen-tls.sh) and the API server's
// webhooks.kubeconfig. It also brings up the webhook's link.
func PrepareInstall(ctx context.Context, o InstallOptions) (*Install, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.Link == "" || len(o.Link) > 15 {
		return nil, fmt.Errorf("install: Link %q: must be 1 to 15 bytes", o.Link)
	}
	webhookBin, err := node.LookPath("bulkhead-webhook")
	if err != nil {
		return nil, errors.New("install: needs bulkhead-webhook (make build)")
	}
	in := &Install{Repo: filepath.Join(o.Dir, "repo"), dir: o.Dir, Address: o.Address, Link: o.Link, webhookBin: webhookBin, log: o.Log}
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
	for _, args := range [][]string{
		{"link", "add", o.Link, "type", "bridge"},
		{"addr", "add", o.Address + "/32", "dev", o.Link},
		{"link", "set", o.Link, "up"},
	} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			in.removeLink()
			return nil, fmt.Errorf("install: ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if in.Port, err = freePort(); err != nil {
		return nil, err
	}
	return in, nil
}

// Bundle and BundleKey are the signed bundle and its public key (step 2).
func (in *Install) Bundle() string    { return filepath.Join(in.Repo, "deploy/policy/bundle.tar.gz") }
func (in *Install) BundleKey() string { return filepath.Join(in.Repo, "deploy/policy/bundle.pem") }

func (in *Install) removeLink() { _ = exec.Command("ip", "link", "del", in.Link).Run() }

// Close stops the webhook and removes its link (idempotent; Stop of the
// cluster does it too once Apply ran).
func (in *Install) Close() { in.StopWebhook(); in.removeLink() }

// Apply does steps 1 and 4 of docs/install.md: label the node, `kubectl
// apply -k` (deploy/ through the test overlay), and starts the webhook.
func (in *Install) Apply(ctx context.Context, c *Cluster) error {
	c.OnStop(in.Close)
	in.Overlay = filepath.Join(in.dir, "overlay")
	if err := os.MkdirAll(in.Overlay, 0o755); err != nil {
		return err
	}
	kust, err := overlayFS.ReadFile("overlay/kustomization.yaml")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(in.Overlay, "kustomization.yaml"), kust, 0o644); err != nil {
		return err
	}
	slice := template.Must(template.ParseFS(overlayFS, "overlay/endpointslice.yaml"))
	if err := writeTemplate(filepath.Join(in.Overlay, "endpointslice.yaml"), slice, map[string]any{"Address": in.Address, "Port": in.Port}); err != nil {
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
	return in.StartWebhook(ctx, c)
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

// StartWebhook runs ./bin/bulkhead-webhook as the Deployment would: its
// arguments from the rendered Deployment of deploy/, its mounted files from
// the applied Secret and ConfigMap, the bulkhead-webhook ServiceAccount's
// token; only the listen addresses differ. It waits for /readyz.
func (in *Install) StartWebhook(ctx context.Context, c *Cluster) error {
	out, err := c.Kubectl(ctx, "kustomize", filepath.Join(in.Repo, "deploy"))
	if err != nil {
		return fmt.Errorf("install: kubectl kustomize deploy: %v\n%s", err, out)
	}
	var dep *appsv1.Deployment
	for _, doc := range strings.Split(out, "\n---\n") {
		var d appsv1.Deployment
		if yaml.Unmarshal([]byte(doc), &d) == nil && d.Kind == "Deployment" && d.Name == "bulkhead-webhook" {
			dep = &d
		}
	}
	if dep == nil || len(dep.Spec.Template.Spec.Containers) != 1 {
		return errors.New("install: deploy/ renders no Deployment bulkhead-webhook with one container")
	}
	ctr := dep.Spec.Template.Spec.Containers[0]
	files := filepath.Join(in.dir, "webhook-files")
	_ = os.RemoveAll(files)
	// Each mount's volume, read back from the cluster.
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		local := filepath.Join(files, m.Name)
		if err := os.MkdirAll(local, 0o700); err != nil {
			return err
		}
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if err := in.fetchVolume(ctx, c, dep.Namespace, v, local); err != nil {
				return err
			}
		}
		mounts[m.MountPath] = local
	}
	probePort, err := freePort()
	if err != nil {
		return err
	}
	in.probe = fmt.Sprintf("127.0.0.1:%d", probePort)
	var args []string
	for _, a := range ctr.Args {
		switch {
		case strings.HasPrefix(a, "--listen="):
			a = fmt.Sprintf("--listen=%s:%d", in.Address, in.Port)
		case strings.HasPrefix(a, "--probe-listen="):
			a = "--probe-listen=" + in.probe
		default:
			for mp, local := range mounts {
				if k, v, ok := strings.Cut(a, "="); ok && (v == mp || strings.HasPrefix(v, mp+"/")) {
					a = k + "=" + local + strings.TrimPrefix(v, mp)
				}
			}
		}
		args = append(args, a)
	}
	tok, err := c.Kubectl(ctx, "-n", dep.Namespace, "create", "token", dep.Spec.Template.Spec.ServiceAccountName, "--duration=4h")
	if err != nil {
		return fmt.Errorf("install: token of %s: %v\n%s", dep.Spec.Template.Spec.ServiceAccountName, err, tok)
	}
	kc, err := c.TokenKubeconfig("bulkhead-webhook", "system:serviceaccount:"+dep.Namespace+":"+dep.Spec.Template.Spec.ServiceAccountName, strings.TrimSpace(tok))
	if err != nil {
		return err
	}
	args = append(args, "--kubeconfig="+kc)
	c.bin["bulkhead-webhook"] = in.webhookBin
	in.log("install: bulkhead-webhook %s", strings.Join(args, " "))
	p, err := c.run("bulkhead-webhook", args...)
	if err != nil {
		return err
	}
	in.webhook = p
	return waitFor(ctx, p, "bulkhead-webhook /readyz", 2*time.Minute, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.probe+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

// StopWebhook stops the webhook process, if it runs.
func (in *Install) StopWebhook() {
	if in.webhook != nil {
		in.webhook.stop(10 * time.Second)
		in.webhook = nil
	}
}

// fetchVolume writes a Secret's or ConfigMap's keys as files under dir,
// as the kubelet would mount them.
func (in *Install) fetchVolume(ctx context.Context, c *Cluster, ns string, v corev1.Volume, dir string) error {
	var kind, name string
	switch {
	case v.Secret != nil:
		kind, name = "secret", v.Secret.SecretName
	case v.ConfigMap != nil:
		kind, name = "configmap", v.ConfigMap.Name
	default:
		return fmt.Errorf("install: volume %s: only Secret and ConfigMap volumes can be read back", v.Name)
	}
	out, err := c.Kubectl(ctx, "-n", ns, "get", kind, name, "-o", "json")
	if err != nil {
		return fmt.Errorf("install: kubectl get %s %s: %v\n%s", kind, name, err, out)
	}
	var obj struct {
		Data       map[string]string `json:"data"`
		BinaryData map[string]string `json:"binaryData"`
	}
	if err := json.Unmarshal([]byte(out), &obj); err != nil {
		return fmt.Errorf("install: %s %s: %w", kind, name, err)
	}
	write := func(k string, b []byte) error { return os.WriteFile(filepath.Join(dir, k), b, 0o600) }
	for k, val := range obj.Data {
		b := []byte(val)
		if kind == "secret" {
			if b, err = base64.StdEncoding.DecodeString(val); err != nil {
				return fmt.Errorf("install: secret %s key %s: %w", name, k, err)
			}
		}
		if err := write(k, b); err != nil {
			return err
		}
	}
	for k, val := range obj.BinaryData {
		b, err := base64.StdEncoding.DecodeString(val)
		if err != nil {
			return fmt.Errorf("install: configmap %s key %s: %w", name, k, err)
		}
		if err := write(k, b); err != nil {
			return err
		}
	}
	return nil
}

// Uninstall follows docs/install.md's Uninstall: the webhook configuration
// first, then the workloads (the caller's namespaces), then `kubectl
// delete -k` and the node label. Step 3 (the DaemonSet's `remove`) has no
// DaemonSet here (see the overlay); the webhook process and its link go
// last.
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
	in.StopWebhook()
	in.removeLink()
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
