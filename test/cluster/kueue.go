package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// KueueVersion is the Kueue release test/scripts/kueue.sh installs (make
// bench-quota): its manager in TOOLS_DIR/bin/kueue, its CRDs and webhook
// configurations in TOOLS_DIR/kueue/KueueVersion.
const KueueVersion = "v0.17.0"

// Kueue's names the comparison relies on (sigs.k8s.io/kueue
// pkg/controller/constants and pkg/controller/jobs/pod/constants).
const (
	// KueueQueueLabel names a pod's LocalQueue: a pod with it is Kueue's.
	KueueQueueLabel = "kueue.x-k8s.io/queue-name"
	// KueueGate is the scheduling gate Kueue's pod webhook puts on a pod
	// it manages and lifts when it admits the pod's Workload.
	KueueGate = "kueue.x-k8s.io/admission"
)

// kueueMetricsCerts is where Kueue's manager reads its metrics serving
// certificate when its own certificate management is off: cmd/kueue
// hard-codes the path and refuses to start without the files, even with
// the metrics server disabled. The only path a Kueue outside the cluster's
// directory needs; StartKueue creates it only where it is absent and Stop
// removes it.
const kueueMetricsCerts = "/etc/kueue/metrics/certs"

// KueueOptions configures StartKueue.
type KueueOptions struct {
	// Namespaces are those whose pods Kueue manages (its
	// managedJobsNamespaceSelector, and the pod webhooks' namespaceSelector,
	// so that no other namespace's pods wait on it); at least one.
	Namespaces []string
}

// Kueue is Kueue's manager (cmd/kueue) running as a host process against a
// cluster's API server, with the "pod" integration only: a pod labelled
// KueueQueueLabel in one of the namespaces is created gated (KueueGate),
// one Workload per pod is queued in its LocalQueue, and the gate is lifted
// when its ClusterQueue has quota for it.
//
// It runs as the cluster's admin, with its own serving certificate from
// the cluster's CA (internalCertManagement off), and its webhooks are
// configured by url on loopback with that CA: how it is packaged
// (Deployment, Service, cert rotation, its RBAC) is not what the
// comparison measures.
type Kueue struct {
	// Dir holds its configuration, certificates and log.
	Dir string
	// WebhookURL is the base URL of its webhook server.
	WebhookURL string

	proc        *process
	madeEtcDirs []string
}

// KueueShareDir finds the manifests kueue.sh installs beside the binary:
// TOOLS_DIR/kueue/KueueVersion, looked up next to each of node.BinDirs.
func KueueShareDir() (string, error) {
	for _, bin := range node.BinDirs() {
		d := filepath.Join(filepath.Dir(bin), "kueue", KueueVersion)
		if fileExists(filepath.Join(d, "webhook", "manifests.yaml")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("needs Kueue %s's manifests (make bench-quota: test/scripts/kueue.sh)", KueueVersion)
}

// KueueRequirements reports what this machine lacks to run Kueue, or nil.
func KueueRequirements() error {
	if _, err := node.LookPath("kueue"); err != nil {
		return fmt.Errorf("needs kueue %s (make bench-quota: test/scripts/kueue.sh)", KueueVersion)
	}
	if _, err := KueueShareDir(); err != nil {
		return err
	}
	if fileExists("/etc/kueue") {
		return errors.New("/etc/kueue exists: Kueue's metrics certificates would overwrite another install's")
	}
	return nil
}

var kueueConfig = template.Must(template.New("kueue").Parse(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:{{.Health}}
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: {{.Webhook}}
  certDir: {{.CertDir}}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
managedJobsNamespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values: [{{.Namespaces}}]
integrations:
  frameworks: ["pod"]
featureGates:
  # An aggregated API server of its own (pending workloads); not needed.
  VisibilityOnDemand: false
# As Kueue's release manifests set them (config/components/manager/
# controller_manager_config.yaml); the binary's defaults are one reconcile
# at a time and 20 requests a second.
controller:
  groupKindConcurrency:
    Pod: 5
    Workload.kueue.x-k8s.io: 5
    LocalQueue.kueue.x-k8s.io: 1
    Cohort.kueue.x-k8s.io: 1
    ClusterQueue.kueue.x-k8s.io: 1
    ResourceFlavor.kueue.x-k8s.io: 1
clientConnection:
  qps: 50
  burst: 100
`))

// StartKueue installs Kueue's CRDs, starts its manager, waits for it to be
// ready, and configures its webhooks: those of the pod integration (for
// opts.Namespaces, and only pods that name a LocalQueue) and those of its
// own objects. The cluster's Stop stops it (OnStop, while the API server
// still answers).
func StartKueue(ctx context.Context, c *Cluster, opts KueueOptions) (_ *Kueue, retErr error) {
	if len(opts.Namespaces) == 0 {
		return nil, errors.New("kueue: KueueOptions.Namespaces: at least one namespace")
	}
	if err := KueueRequirements(); err != nil {
		return nil, fmt.Errorf("kueue: %w", err)
	}
	bin, _ := node.LookPath("kueue")
	share, _ := KueueShareDir()
	k := &Kueue{Dir: filepath.Join(c.dir, "kueue")}
	c.OnStop(k.Stop)
	defer func() {
		if retErr != nil {
			k.Stop()
		}
	}()
	certDir := filepath.Join(k.Dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}

	// CRDs first: the manager's caches wait for them. Server-side, since
	// the Workload CRD is larger than client-side apply's annotation.
	if out, err := c.Kubectl(ctx, "apply", "--server-side", "-f", filepath.Join(share, "crd")); err != nil {
		return nil, fmt.Errorf("kueue: install CRDs: %v\n%s", err, out)
	}
	if out, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "-f", filepath.Join(share, "crd")); err != nil {
		return nil, fmt.Errorf("kueue: CRDs not established: %v\n%s", err, out)
	}
	if out, err := c.Kubectl(ctx, "create", "namespace", "kueue-system"); err != nil {
		return nil, fmt.Errorf("kueue: namespace kueue-system: %v\n%s", err, out)
	}

	// Its serving certificate, from the cluster's CA, for the address the
	// API server calls it at; the same files as its metrics certificate.
	cert, key, err := c.pki.issue("kueue-webhook", "kueue-webhook", nil, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	for _, f := range [][2]string{{cert, "tls.crt"}, {key, "tls.key"}} {
		if err := copyFile(f[0], filepath.Join(certDir, f[1]), 0o600); err != nil {
			return nil, err
		}
	}
	for d := kueueMetricsCerts; d != "/etc"; d = filepath.Dir(d) {
		if !fileExists(d) {
			k.madeEtcDirs = append(k.madeEtcDirs, d)
		}
	}
	if err := os.MkdirAll(kueueMetricsCerts, 0o700); err != nil {
		return nil, err
	}
	for _, f := range [][2]string{{cert, "tls.crt"}, {key, "tls.key"}} {
		if err := copyFile(f[0], filepath.Join(kueueMetricsCerts, f[1]), 0o600); err != nil {
			return nil, err
		}
	}

	webhookPort, err := freePort()
	if err != nil {
		return nil, err
	}
	healthPort, err := freePort()
	if err != nil {
		return nil, err
	}
	k.WebhookURL = fmt.Sprintf("https://127.0.0.1:%d", webhookPort)
	conf := filepath.Join(k.Dir, "config.yaml")
	quoted := make([]string, len(opts.Namespaces))
	for i, ns := range opts.Namespaces {
		quoted[i] = fmt.Sprintf("%q", ns)
	}
	if err := writeTemplate(conf, kueueConfig, map[string]any{
		"Health": healthPort, "Webhook": webhookPort, "CertDir": certDir, "Namespaces": strings.Join(quoted, ", "),
	}); err != nil {
		return nil, err
	}
	c.bin["kueue"] = bin
	p, err := c.run("kueue", "--config="+conf, "--kubeconfig="+c.Kubeconfig, "--zap-log-level=info")
	if err != nil {
		return nil, err
	}
	k.proc = p
	if err := waitFor(ctx, p, "kueue /readyz", 2*time.Minute, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	}); err != nil {
		return nil, err
	}

	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	manifests, err := os.ReadFile(filepath.Join(share, "webhook", "manifests.yaml"))
	if err != nil {
		return nil, err
	}
	mutating, validating, err := kueueWebhooks(manifests, k.WebhookURL, ca, opts.Namespaces)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	adm := client.AdmissionregistrationV1()
	if _, err := adm.MutatingWebhookConfigurations().Create(ctx, mutating, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("kueue: %s: %w", mutating.Name, err)
	}
	if _, err := adm.ValidatingWebhookConfigurations().Create(ctx, validating, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("kueue: %s: %w", validating.Name, err)
	}
	return k, nil
}

// kueueWebhooks reads Kueue's webhook configurations (its module's
// config/components/webhook/manifests.yaml) and keeps the webhooks of pods
// and of Kueue's own objects, each called at base (a URL) with caBundle:
// pods of namespaces only, and only those that name a LocalQueue, so that
// no other pod pays a call to Kueue.
func kueueWebhooks(manifests []byte, base string, caBundle []byte, namespaces []string) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	var mutating *admissionregistrationv1.MutatingWebhookConfiguration
	var validating *admissionregistrationv1.ValidatingWebhookConfiguration
	podSelectors := func(rules []admissionregistrationv1.RuleWithOperations) (ns, obj *metav1.LabelSelector, keep bool) {
		for _, r := range rules {
			switch {
			case slices.Contains(r.APIGroups, "kueue.x-k8s.io"):
				return nil, nil, true
			case slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "pods"):
				return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
						Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: namespaces,
					}}}, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
						Key: KueueQueueLabel, Operator: metav1.LabelSelectorOpExists,
					}}}, true
			}
		}
		return nil, nil, false
	}
	clientConfig := func(cc admissionregistrationv1.WebhookClientConfig) (admissionregistrationv1.WebhookClientConfig, error) {
		if cc.Service == nil || cc.Service.Path == nil {
			return cc, errors.New("a webhook without a service path")
		}
		url := base + *cc.Service.Path
		return admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caBundle}, nil
	}
	for _, doc := range strings.Split(string(manifests), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, nil, fmt.Errorf("kueue webhook manifests: %w", err)
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			var in admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.Unmarshal([]byte(doc), &in); err != nil {
				return nil, nil, fmt.Errorf("kueue webhook manifests: %w", err)
			}
			mutating = &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-mutating"}}
			for _, w := range in.Webhooks {
				ns, obj, keep := podSelectors(w.Rules)
				if !keep {
					continue
				}
				cc, err := clientConfig(w.ClientConfig)
				if err != nil {
					return nil, nil, fmt.Errorf("kueue webhook %s: %w", w.Name, err)
				}
				w.ClientConfig, w.NamespaceSelector, w.ObjectSelector = cc, ns, obj
				mutating.Webhooks = append(mutating.Webhooks, w)
			}
		case "ValidatingWebhookConfiguration":
			var in admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.Unmarshal([]byte(doc), &in); err != nil {
				return nil, nil, fmt.Errorf("kueue webhook manifests: %w", err)
			}
			validating = &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating"}}
			for _, w := range in.Webhooks {
				ns, obj, keep := podSelectors(w.Rules)
				if !keep {
					continue
				}
				cc, err := clientConfig(w.ClientConfig)
				if err != nil {
					return nil, nil, fmt.Errorf("kueue webhook %s: %w", w.Name, err)
				}
				w.ClientConfig, w.NamespaceSelector, w.ObjectSelector = cc, ns, obj
				validating.Webhooks = append(validating.Webhooks, w)
			}
		}
	}
	if mutating == nil || validating == nil || len(mutating.Webhooks) == 0 || len(validating.Webhooks) == 0 {
		return nil, nil, errors.New("kueue webhook manifests: no mutating or no validating webhook of pods or Kueue's objects")
	}
	return mutating, validating, nil
}

// KueueQueues is a ResourceFlavor, a ClusterQueue name of cohort cohort
// that covers cpu, memory and pods with nominal quota pods (and far more
// cpu and memory than the cluster has, so that pods bind), and a LocalQueue
// name in each namespace that feeds it.
func KueueQueues(name, cohort string, pods int, namespaces ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: %s
spec:
  cohortName: %s
  namespaceSelector: {}
  queueingStrategy: BestEffortFIFO
  resourceGroups:
    - coveredResources: ["cpu", "memory", "pods"]
      flavors:
        - name: default-flavor
          resources:
            - {name: cpu, nominalQuota: "100"}
            - {name: memory, nominalQuota: 100Gi}
            - {name: pods, nominalQuota: %d}
`, name, cohort, pods)
	for _, ns := range namespaces {
		fmt.Fprintf(&b, `---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: %s
  namespace: %s
spec:
  clusterQueue: %s
`, name, ns, name)
	}
	return b.String()
}

// Stop stops the manager and removes the metrics certificate directory it
// created (idempotent). Its webhook configurations stay: the cluster they
// belong to is being stopped with it.
func (k *Kueue) Stop() {
	if k.proc != nil {
		k.proc.stop(10 * time.Second)
		k.proc = nil
	}
	if len(k.madeEtcDirs) > 0 {
		// The outermost directory this Kueue made, with all below it.
		_ = os.RemoveAll(k.madeEtcDirs[len(k.madeEtcDirs)-1])
		k.madeEtcDirs = nil
	}
}
