// Package deploy holds Bulkhead's Kubernetes manifests (a kustomize tree);
// its tests decode every manifest strictly with the k8s.io/api types and
// check that the pieces refer to each other correctly.
package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

const (
	namespace   = "bulkhead-system"
	handlerName = "bulkhead"
	// quotaNamespace holds the webhook's quota ledgers and nothing else
	// but quotaRole and its binding.
	quotaNamespace = "bulkhead-quota"
	quotaRole      = "bulkhead-webhook-quota"
)

// kustomization is the subset of kustomize's Kustomization these manifests
// use; decoding is strict, so a typo or an unused feature fails the test.
type kustomization struct {
	APIVersion       string      `json:"apiVersion"`
	Kind             string      `json:"kind"`
	Resources        []string    `json:"resources"`
	GeneratorOptions *genOptions `json:"generatorOptions,omitempty"`
	SecretGenerator  []generator `json:"secretGenerator,omitempty"`
	ConfigMapGen     []generator `json:"configMapGenerator,omitempty"`
	Replacements     []struct {
		Source struct {
			Kind      string `json:"kind"`
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
			FieldPath string `json:"fieldPath"`
		} `json:"source"`
		Targets []struct {
			Select struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"select"`
			FieldPaths []string `json:"fieldPaths"`
		} `json:"targets"`
	} `json:"replacements,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewTag  string `json:"newTag"`
		NewName string `json:"newName,omitempty"`
	} `json:"images,omitempty"`
}

type genOptions struct {
	DisableNameSuffixHash bool              `json:"disableNameSuffixHash"`
	Labels                map[string]string `json:"labels,omitempty"`
}

type generator struct {
	Name      string   `json:"name"`
	Namespace string   `json:"namespace"`
	Type      string   `json:"type,omitempty"`
	Files     []string `json:"files"`
}

// fileKeys maps each generator file entry ("key=path" or "path") to its key.
func (g generator) fileKeys() map[string]string {
	out := map[string]string{}
	for _, f := range g.Files {
		key, path, ok := strings.Cut(f, "=")
		if !ok {
			key, path = filepath.Base(f), f
		}
		out[key] = path
	}
	return out
}

// tree is every object of the kustomize tree, decoded strictly.
type tree struct {
	objects    []runtime.Object
	generators map[string]generator // by name
	kusts      map[string]kustomization
}

func decodeStrict(t *testing.T, name string, data []byte) []runtime.Object {
	t.Helper()
	s := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	var out []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, _, err := s.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: strict decode: %v", name, err)
		}
		out = append(out, obj)
	}
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

// loadTree walks the kustomizations from deploy/ and decodes every resource.
func loadTree(t *testing.T) *tree {
	t.Helper()
	tr := &tree{generators: map[string]generator{}, kusts: map[string]kustomization{}}
	var walk func(dir string)
	walk = func(dir string) {
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := yaml.UnmarshalStrict(data, &k); err != nil {
			t.Fatalf("%s/kustomization.yaml: %v", dir, err)
		}
		if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
			t.Errorf("%s/kustomization.yaml: apiVersion/kind %s/%s", dir, k.APIVersion, k.Kind)
		}
		hasGenerators := len(k.SecretGenerator)+len(k.ConfigMapGen) > 0
		if hasGenerators && (k.GeneratorOptions == nil || !k.GeneratorOptions.DisableNameSuffixHash) {
			t.Errorf("%s/kustomization.yaml: generated names must be fixed (disableNameSuffixHash): the webhook and the installer reload them in place", dir)
		}
		tr.kusts[dir] = k
		for _, g := range append(slices.Clone(k.SecretGenerator), k.ConfigMapGen...) {
			if _, dup := tr.generators[g.Name]; dup {
				t.Errorf("generator %s defined twice", g.Name)
			}
			for key, path := range g.fileKeys() {
				if _, err := os.Stat(filepath.Join(dir, path)); err != nil && !generatedPerCluster(path) {
					t.Errorf("%s: generator %s key %s: %v", dir, g.Name, key, err)
				}
			}
			tr.generators[g.Name] = g
		}
		for _, res := range k.Resources {
			p := filepath.Join(dir, res)
			st, err := os.Stat(p)
			if err != nil {
				t.Fatalf("%s: resource %s: %v", dir, res, err)
			}
			if st.IsDir() {
				walk(p)
				continue
			}
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			tr.objects = append(tr.objects, decodeStrict(t, p, data)...)
		}
	}
	walk(".")
	return tr
}

// generatedPerCluster reports whether a generator input is made by
// gen-tls.sh or policy/build.sh (and ignored by git) rather than committed.
func generatedPerCluster(path string) bool {
	return strings.HasPrefix(path, "tls/") || path == "policy/bundle.tar.gz" || path == "policy/bundle.pem"
}

func find[T runtime.Object](tr *tree, name string) (T, bool) {
	var zero T
	for _, o := range tr.objects {
		if v, ok := o.(T); ok {
			if m, ok := any(v).(interface{ GetName() string }); ok && m.GetName() == name {
				return v, true
			}
		}
	}
	return zero, false
}

func mustFind[T runtime.Object](t *testing.T, tr *tree, name string) T {
	t.Helper()
	v, ok := find[T](tr, name)
	if !ok {
		var zero T
		t.Fatalf("no %T named %q in the kustomize tree", zero, name)
	}
	return v
}

// separateRoots are kustomizations applied on their own, not through
// deploy/kustomization.yaml: monitoring needs the Prometheus Operator's
// CRDs, which a cluster may not have (monitoring_test.go checks it).
var separateRoots = []string{"monitoring"}

// TestEveryManifestIsReferenced: no YAML file in deploy/ is left out of the
// kustomize tree or a separate root (it would silently never be applied).
func TestEveryManifestIsReferenced(t *testing.T) {
	tr := loadTree(t)
	kusts := maps.Clone(tr.kusts)
	for _, dir := range separateRoots {
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := yaml.UnmarshalStrict(data, &k); err != nil {
			t.Fatalf("%s/kustomization.yaml: %v", dir, err)
		}
		kusts[dir] = k
	}
	referenced := map[string]bool{}
	for dir, k := range kusts {
		referenced[filepath.Join(dir, "kustomization.yaml")] = true
		for _, r := range k.Resources {
			referenced[filepath.Join(dir, r)] = true
		}
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == chartRoot {
			// Helm's, not kustomize's: chart_test.go holds it to this tree.
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(path, ".yaml") && !referenced[path] {
			t.Errorf("%s is not listed in any kustomization.yaml", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNamespacedObjectsLiveInBulkheadSystem: every namespaced object names
// the namespace the tree creates, but for the webhook's right to the quota
// ledgers, which lives in the ledgers' own namespace (quotaNamespace),
// apart from everything else of Bulkhead.
func TestNamespacedObjectsLiveInBulkheadSystem(t *testing.T) {
	tr := loadTree(t)
	mustFind[*corev1.Namespace](t, tr, namespace)
	mustFind[*corev1.Namespace](t, tr, quotaNamespace)
	for _, o := range tr.objects {
		m, ok := o.(interface {
			GetNamespace() string
			GetName() string
		})
		if !ok {
			t.Fatalf("%T has no metadata", o)
		}
		switch o.(type) {
		case *corev1.Namespace, *nodev1.RuntimeClass, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *admissionregistrationv1.ValidatingWebhookConfiguration,
			*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding, *resourcev1.DeviceClass:
			if m.GetNamespace() != "" {
				t.Errorf("cluster-scoped %T %s has namespace %q", o, m.GetName(), m.GetNamespace())
			}
		case *rbacv1.Role, *rbacv1.RoleBinding:
			want := namespace
			if m.GetName() == quotaRole {
				want = quotaNamespace
			}
			if m.GetNamespace() != want {
				t.Errorf("%T %s: namespace %q, want %q", o, m.GetName(), m.GetNamespace(), want)
			}
		default:
			if m.GetNamespace() != namespace {
				t.Errorf("%T %s: namespace %q, want %q", o, m.GetName(), m.GetNamespace(), namespace)
			}
		}
	}
	for name, g := range tr.generators {
		if g.Namespace != namespace {
			t.Errorf("generator %s: namespace %q, want %q", name, g.Namespace, namespace)
		}
	}
}

// TestWebhookCrossReferences follows the API server's path to the webhook:
// configuration -> Service -> Deployment pods -> container, and the rights
// and files the container needs.
func TestWebhookCrossReferences(t *testing.T) {
	tr := loadTree(t)
	vwc := mustFind[*admissionregistrationv1.ValidatingWebhookConfiguration](t, tr, "bulkhead")
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
	}
	wh := vwc.Webhooks[0]
	svcRef := wh.ClientConfig.Service
	if svcRef == nil || wh.ClientConfig.URL != nil {
		t.Fatal("webhook must reach the in-cluster Service, not a URL")
	}
	if svcRef.Path == nil || *svcRef.Path != admission.PathValidate {
		t.Errorf("webhook path = %v, want %s", svcRef.Path, admission.PathValidate)
	}
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy = %v, want Fail", wh.FailurePolicy)
	}
	if wh.TimeoutSeconds == nil || *wh.TimeoutSeconds < 1 || *wh.TimeoutSeconds > 10 {
		t.Errorf("timeoutSeconds = %v, want 1..10", wh.TimeoutSeconds)
	}
	if wh.SideEffects == nil || *wh.SideEffects != admissionregistrationv1.SideEffectClassNoneOnDryRun {
		t.Errorf("sideEffects = %v, want NoneOnDryRun (quota reservations are written, except on dry runs)", wh.SideEffects)
	}
	if !slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("admissionReviewVersions = %v, want [v1] (the handler refuses others)", wh.AdmissionReviewVersions)
	}

	// The namespace selector exempts kube-system and Bulkhead's own
	// namespace (no deadlock) and nothing else.
	sel, err := metav1LabelSelector(wh)
	if err != nil {
		t.Fatal(err)
	}
	for ns, want := range map[string]bool{"kube-system": false, namespace: false, "agents": true, "default": true} {
		if got := sel.Matches(labels.Set{"kubernetes.io/metadata.name": ns}); got != want {
			t.Errorf("namespaceSelector matches %s = %v, want %v", ns, got, want)
		}
	}

	// The rules are checked by TestWebhookRulesCoverReviewedResources.

	// Service -> Deployment.
	if svcRef.Namespace != namespace {
		t.Errorf("webhook service namespace %q", svcRef.Namespace)
	}
	svc := mustFind[*corev1.Service](t, tr, svcRef.Name)
	var port *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if svcRef.Port != nil && svc.Spec.Ports[i].Port == *svcRef.Port {
			port = &svc.Spec.Ports[i]
		}
	}
	if port == nil {
		t.Fatalf("Service %s has no port %v", svc.Name, svcRef.Port)
	}
	dep := mustFind[*appsv1.Deployment](t, tr, "bulkhead-webhook")
	podLabels := labels.Set(dep.Spec.Template.Labels)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not select the Deployment's pods %v", svc.Spec.Selector, podLabels)
	}
	if s, err := metav1SelectorOf(dep.Spec.Selector); err != nil || !s.Matches(podLabels) {
		t.Errorf("Deployment selector does not match its template: %v", err)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if !hasPort(c, port.TargetPort.StrVal) {
		t.Errorf("Service targetPort %q is not a port of container %s", port.TargetPort.StrVal, c.Name)
	}
	for _, sp := range svc.Spec.Ports {
		if sp.TargetPort.StrVal != "" && !hasPort(c, sp.TargetPort.StrVal) {
			t.Errorf("Service port %s targets unknown container port %q", sp.Name, sp.TargetPort.StrVal)
		}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Error("failurePolicy Fail needs at least 2 webhook replicas")
	}

	// The container's flags parse with the binary's own parser, and every
	// file they name is mounted from the right Secret or ConfigMap key.
	cfg, err := admission.ParseFlags(c.Args, io.Discard)
	if err != nil {
		t.Fatalf("container args %v: %v", c.Args, err)
	}
	for flag, path := range map[string]string{"--tls-cert": cfg.TLSCert, "--tls-key": cfg.TLSKey, "--bundle": cfg.Bundle, "--key": cfg.Key, "--client-ca": cfg.ClientCA} {
		if path == "" && (flag == "--tls-cert" || flag == "--tls-key") && cfg.CertSecret != "" {
			continue // the rotator's Secret, webhook_certs_test.go
		}
		gen, key := mountedFrom(t, dep.Spec.Template.Spec, c, path)
		g, ok := tr.generators[gen]
		if !ok {
			t.Errorf("%s %s: mounted from %q, which no generator makes", flag, path, gen)
			continue
		}
		if _, ok := g.fileKeys()[key]; !ok {
			t.Errorf("%s %s: key %q is not in generator %s", flag, path, key, gen)
		}
	}
	if cfg.InsecureSkipVerification {
		t.Error("the webhook must verify the bundle's signature")
	}
	node := nodeConfig(t)
	if cfg.KeyID != node.Policy.KeyID || cfg.Scope != node.Policy.Scope {
		t.Errorf("webhook key id/scope %q/%q differ from the nodes' %q/%q", cfg.KeyID, cfg.Scope, node.Policy.KeyID, node.Policy.Scope)
	}
	probes := map[string]string{admission.PathReadyz: "", admission.PathHealthz: ""}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatal("webhook container needs HTTP readiness and liveness probes")
		}
		if _, ok := probes[p.HTTPGet.Path]; !ok {
			t.Errorf("probe path %s is not served", p.HTTPGet.Path)
		}
		if !hasPort(c, p.HTTPGet.Port.StrVal) {
			t.Errorf("probe port %q is not a container port", p.HTTPGet.Port.StrVal)
		}
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("webhook container should run with a read-only root file system")
	}

	// RBAC: the informers list and watch pods and RuntimeClasses.
	sa := mustFind[*corev1.ServiceAccount](t, tr, dep.Spec.Template.Spec.ServiceAccountName)
	crb := mustFind[*rbacv1.ClusterRoleBinding](t, tr, "bulkhead-webhook")
	if !slices.ContainsFunc(crb.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == sa.Name && s.Namespace == sa.Namespace
	}) {
		t.Errorf("ClusterRoleBinding %s does not bind ServiceAccount %s/%s", crb.Name, sa.Namespace, sa.Name)
	}
	role := mustFind[*rbacv1.ClusterRole](t, tr, crb.RoleRef.Name)
	for _, need := range []struct{ group, resource string }{{"", "pods"}, {"node.k8s.io", "runtimeclasses"}} {
		for _, verb := range []string{"list", "watch"} {
			if !allows(role.Rules, need.group, need.resource, verb) {
				t.Errorf("ClusterRole %s does not allow %s %s.%s", role.Name, verb, need.resource, need.group)
			}
		}
	}
	mustFind[*policyv1PDB](t, tr, "bulkhead-webhook")
}

// webhookOperation is one operation on one resource (or subresource,
// "pods/ephemeralcontainers") that the API server may send to the webhook.
type webhookOperation struct {
	gvr schema.GroupVersionResource
	op  admissionregistrationv1.OperationType
}

func (w webhookOperation) String() string {
	return string(w.op) + " " + w.gvr.String()
}

// TestWebhookRulesCoverReviewedResources: the shipped
// ValidatingWebhookConfiguration sends the webhook CREATE and UPDATE of
// pods and of every workload kind the handler reads, UPDATE of
// pods/ephemeralcontainers (kubectl debug) and pods/resize (in-place
// resize, issue 24), CREATE of DRA claims and claim templates, and nothing
// else: a resource missing here is admitted unjudged, one too many is
// refused by the handler as an unsupported kind.
func TestWebhookRulesCoverReviewedResources(t *testing.T) {
	tr := loadTree(t)
	vwc := mustFind[*admissionregistrationv1.ValidatingWebhookConfiguration](t, tr, "bulkhead")
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
	}
	rules := vwc.Webhooks[0].Rules

	plural := map[string]string{"Pod": "pods", "Deployment": "deployments", "ReplicaSet": "replicasets",
		"StatefulSet": "statefulsets", "DaemonSet": "daemonsets", "Job": "jobs", "CronJob": "cronjobs"}
	want := map[webhookOperation]bool{}
	for _, k := range admission.SupportedKinds() {
		res, ok := plural[k.Kind]
		if !ok {
			t.Fatalf("kind %s is supported by the handler but has no resource name in this test", k)
		}
		for _, op := range []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update} {
			want[webhookOperation{schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: res}, op}] = true
		}
	}
	// Spelled out as well, in case SupportedKinds ever loses the pod.
	pods := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	want[webhookOperation{pods, admissionregistrationv1.Create}] = true
	want[webhookOperation{pods, admissionregistrationv1.Update}] = true
	debug := schema.GroupVersionResource{Version: "v1", Resource: "pods/" + admission.SubresourceEphemeralContainers}
	want[webhookOperation{debug, admissionregistrationv1.Update}] = true
	resize := schema.GroupVersionResource{Version: "v1", Resource: "pods/" + admission.SubresourceResize}
	want[webhookOperation{resize, admissionregistrationv1.Update}] = true
	claimPlural := map[string]string{"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}
	for _, k := range admission.ClaimKinds() {
		res, ok := claimPlural[k.Kind]
		if !ok {
			t.Fatalf("claim kind %s is judged by the handler but has no resource name in this test", k)
		}
		want[webhookOperation{schema.GroupVersionResource{Group: k.Group, Version: k.Version, Resource: res}, admissionregistrationv1.Create}] = true
	}
	// Spelled out as well: the resize and the claims of issue 24.
	for _, w := range []webhookOperation{
		{schema.GroupVersionResource{Version: "v1", Resource: "pods/resize"}, admissionregistrationv1.Update},
		{schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}, admissionregistrationv1.Create},
		{schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"}, admissionregistrationv1.Create},
	} {
		if !want[w] {
			t.Errorf("%s is not among the operations the handler judges", w)
		}
	}

	for w := range want {
		if !slices.ContainsFunc(rules, func(r admissionregistrationv1.RuleWithOperations) bool { return ruleMatches(r, w) }) {
			t.Errorf("no rule sends %s to the webhook", w)
		}
	}
	// Nothing beyond: every operation and resource a rule names is wanted.
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, v := range r.APIVersions {
				for _, res := range r.Resources {
					for _, op := range r.Operations {
						w := webhookOperation{schema.GroupVersionResource{Group: g, Version: v, Resource: res}, op}
						if !want[w] {
							t.Errorf("rule %v sends %s, which the handler does not judge", r.Resources, w)
						}
					}
				}
			}
		}
		if r.Scope == nil || *r.Scope != admissionregistrationv1.NamespacedScope {
			t.Errorf("rule %v: scope %v, want Namespaced", r.Resources, r.Scope)
		}
	}
}

// ruleMatches reports whether r sends w to the webhook, with the API
// server's wildcards ("*" for groups, versions, operations and resources,
// "*/*" and "pods/*" for subresources).
func ruleMatches(r admissionregistrationv1.RuleWithOperations, w webhookOperation) bool {
	has := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	if !has(r.APIGroups, w.gvr.Group) || !has(r.APIVersions, w.gvr.Version) {
		return false
	}
	if !slices.Contains(r.Operations, w.op) && !slices.Contains(r.Operations, admissionregistrationv1.OperationAll) {
		return false
	}
	res, sub, isSub := strings.Cut(w.gvr.Resource, "/")
	for _, pattern := range r.Resources {
		pr, psub, psIsSub := strings.Cut(pattern, "/")
		switch {
		case pattern == w.gvr.Resource,
			pattern == "*" && !isSub,
			pattern == "*/*",
			psIsSub && isSub && (pr == res || pr == "*") && (psub == sub || psub == "*"):
			return true
		}
	}
	return false
}

// TestNodeCrossReferences: RuntimeClass -> nodes the DaemonSet installs on,
// and the files the installer copies.
func TestNodeCrossReferences(t *testing.T) {
	tr := loadTree(t)
	rc := mustFind[*nodev1.RuntimeClass](t, tr, "bulkhead")
	if rc.Handler != handlerName {
		t.Errorf("RuntimeClass handler = %q, want %q (containerd runtime name)", rc.Handler, handlerName)
	}
	if rc.Overhead == nil || rc.Overhead.PodFixed.Memory().IsZero() || rc.Overhead.PodFixed.Cpu().IsZero() {
		t.Error("RuntimeClass needs a pod overhead for gVisor's Sentry and Gofer")
	}
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	if rc.Scheduling == nil || len(rc.Scheduling.NodeSelector) == 0 {
		t.Fatal("RuntimeClass needs a node selector")
	}
	if !labels.SelectorFromSet(ds.Spec.Template.Spec.NodeSelector).Matches(labels.Set(rc.Scheduling.NodeSelector)) {
		t.Errorf("RuntimeClass schedules onto %v, but the DaemonSet installs only on %v", rc.Scheduling.NodeSelector, ds.Spec.Template.Spec.NodeSelector)
	}
	if s, err := metav1SelectorOf(ds.Spec.Selector); err != nil || !s.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("DaemonSet selector does not match its template: %v", err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("the installer needs hostPID to restart the host's containerd")
	}
	mustFind[*corev1.ServiceAccount](t, tr, spec.ServiceAccountName)
	c := spec.Containers[0]
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("the installer must be privileged to write the host's containerd config")
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	// Every file the installer reads is mounted from a generated key.
	files := []string{c.Command[len(c.Command)-2], env["CONFIG_SRC"], env["POLICY_SRC"] + "/bundle.tar.gz", env["POLICY_KEY_SRC"] + "/bundle.pem"}
	for _, path := range files {
		gen, key := mountedFrom(t, spec, c, path)
		g, ok := tr.generators[gen]
		if !ok {
			t.Errorf("%s: mounted from %q, which no generator makes", path, gen)
			continue
		}
		if _, ok := g.fileKeys()[key]; !ok {
			t.Errorf("%s: key %q is not in generator %s", path, key, gen)
		}
	}
	hostMounted := false
	for _, v := range spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == "/" {
			for _, m := range c.VolumeMounts {
				hostMounted = hostMounted || (m.Name == v.Name && m.MountPath == env["HOST_ROOT"])
			}
		}
	}
	if !hostMounted {
		t.Errorf("the host's / is not mounted at HOST_ROOT=%q", env["HOST_ROOT"])
	}
	// The installer writes the files where config.toml tells the shim to look.
	node := nodeConfig(t)
	script, err := os.ReadFile("node/install.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{node.Policy.Bundle, node.Policy.KeyFile, "/etc/bulkhead/config.toml", node.RunscPath} {
		if !bytes.Contains(script, []byte(p)) {
			t.Errorf("install.sh never writes %s, which config.toml names", p)
		}
	}
}

// nodeConfig is node/config.toml as the agent and the shims read it
// (unknown keys refused, every key validated).
func nodeConfig(t *testing.T) config.Config {
	t.Helper()
	c, err := config.Load("node/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy.KeyID == "" || c.Policy.Scope == "" || c.Policy.Bundle == "" || c.Policy.KeyFile == "" {
		t.Errorf("node/config.toml: [policy] must set bundle, key_file, key_id and scope: %+v", c.Policy)
	}
	return c
}

// TestKustomizeBuild renders the tree with `kubectl kustomize` (when
// kubectl is installed), decodes the output strictly and checks what only
// the build shows: generated objects, no caBundle to put back, image tags.
func TestKustomizeBuild(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl is not installed: the rendered tree is not checked (the source manifests are)")
	}
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	// Stand-ins for the per-cluster files gen-tls.sh and build.sh write.
	caPEM := "-----BEGIN CERTIFICATE-----\nTUlJQ0FURVNU\n-----END CERTIFICATE-----\n"
	for path, content := range map[string]string{
		"tls/tls.crt": "cert", "tls/tls.key": "key", "tls/ca.crt": caPEM, "tls/client-ca.crt": caPEM,
		"policy/bundle.tar.gz": "\x1f\x8b\x08\x00binary", "policy/bundle.pem": "pub",
	} {
		p := filepath.Join(dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	objs := decodeStrict(t, "kustomize output", out)
	tr := &tree{objects: objs}
	vwc := mustFind[*admissionregistrationv1.ValidatingWebhookConfiguration](t, tr, "bulkhead")
	if got := vwc.Webhooks[0].ClientConfig.CABundle; len(got) != 0 {
		t.Errorf("caBundle = %q: the certificate rotator writes it, and each apply would put this one back", got)
	}
	secret := mustFind[*corev1.Secret](t, tr, "bulkhead-webhook-tls")
	if secret.Type != corev1.SecretTypeTLS || string(secret.Data["tls.crt"]) != "cert" {
		t.Errorf("TLS secret: type %s, keys %v", secret.Type, keys(secret.Data))
	}
	cm := mustFind[*corev1.ConfigMap](t, tr, "bulkhead-policy")
	if len(cm.BinaryData["bundle.tar.gz"]) == 0 || len(cm.Data) != 0 || len(cm.BinaryData) != 1 {
		t.Errorf("policy ConfigMap: binaryData %v, data %v; want the bundle alone", keys(cm.BinaryData), cm.Data)
	}
	key := mustFind[*corev1.ConfigMap](t, tr, policyKeyConfigMap)
	if key.Data["bundle.pem"] != "pub" || len(key.Data) != 1 || len(key.BinaryData) != 0 {
		t.Errorf("policy key ConfigMap: binaryData %v, data %v; want bundle.pem alone", keys(key.BinaryData), key.Data)
	}
	for _, name := range []string{"bulkhead-node-config", "bulkhead-node-installer"} {
		mustFind[*corev1.ConfigMap](t, tr, name)
	}
	dep := mustFind[*appsv1.Deployment](t, tr, "bulkhead-webhook")
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	for _, img := range []string{dep.Spec.Template.Spec.Containers[0].Image, ds.Spec.Template.Spec.Containers[0].Image} {
		if !strings.Contains(img, ":") {
			t.Errorf("image %q has no tag after kustomize", img)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func hasPort(c corev1.Container, name string) bool {
	return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
}

// mountedFrom returns the Secret or ConfigMap and key that provide path in
// container c. A volume that lists items mounts those alone, each at its
// path.
func mountedFrom(t *testing.T, spec corev1.PodSpec, c corev1.Container, path string) (source, key string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			switch {
			case v.Secret != nil:
				return v.Secret.SecretName, itemKey(v.Secret.Items, rel)
			case v.ConfigMap != nil:
				return v.ConfigMap.Name, itemKey(v.ConfigMap.Items, rel)
			}
		}
	}
	t.Errorf("container %s: %s is on no Secret or ConfigMap volume", c.Name, path)
	return "", ""
}

// itemKey is the key a volume with these items mounts at path rel: rel
// itself without items, "" when no item is at rel (nothing is mounted there).
func itemKey(items []corev1.KeyToPath, rel string) string {
	if len(items) == 0 {
		return rel
	}
	for _, it := range items {
		if it.Path == rel {
			return it.Key
		}
	}
	return ""
}

func allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	return slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb)
	})
}

type policyv1PDB = policyv1.PodDisruptionBudget

func metav1SelectorOf(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

func metav1LabelSelector(wh admissionregistrationv1.ValidatingWebhook) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(wh.NamespaceSelector)
}

// TestAgentSeesHostPaths: every host path the agent opens by the name the
// host gives it is mounted in the agent container at that same path, from
// that host directory. containerd reports a pod's network namespace as
// /var/run/netns/<name> unless netns_mounts_under_state_dir is set, and
// the agent enters it to find the pod's host veth: an image without a
// /var/run -> /run link must mount it there too, or every fenced pod is
// refused.
func TestAgentSeesHostPaths(t *testing.T) {
	tr := loadTree(t)
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	spec := ds.Spec.Template.Spec
	var agent *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "agent" {
			agent = &spec.Containers[i]
		}
	}
	if agent == nil {
		t.Fatal("DaemonSet bulkhead-node has no agent container")
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	node := nodeConfig(t)
	for _, tc := range []struct {
		path, host, why string
	}{
		{"/var/run/netns/cni-0", "/run/netns", "containerd's default netns path (netns_mounts_under_state_dir = false)"},
		{"/run/netns/cni-0", "/run/netns", "the same directory through /run"},
		{node.ContainerdState + "/netns/cni-0", node.ContainerdState, "netns_mounts_under_state_dir = true"},
		{node.Netpol.PinDir + "/endpoints", "/sys/fs/bpf", "netpol.pin_dir"},
		{node.Agent.Socket, "/run/bulkhead", "agent.socket, which the shims dial on the host"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			best := ""
			var from string
			for _, m := range agent.VolumeMounts {
				mp := strings.TrimSuffix(m.MountPath, "/")
				if (tc.path == mp || strings.HasPrefix(tc.path, mp+"/")) && len(mp) > len(best) {
					best, from = mp, hostPaths[m.Name]
				}
			}
			if best == "" {
				t.Fatalf("%s (%s) is on no host volume of the agent container", tc.path, tc.why)
			}
			if host := from + strings.TrimPrefix(tc.path, best); !strings.HasPrefix(host, tc.host+"/") && host != tc.host {
				t.Errorf("%s (%s) is mounted from the host's %s, want under %s", tc.path, tc.why, host, tc.host)
			}
		})
	}
}
