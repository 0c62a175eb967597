package deploy

// The Helm chart (chart/bulkhead) and the kustomize tree are one source:
// the chart renders, with its default values, exactly the objects
// `kubectl kustomize deploy/` builds (less the two made from per-cluster
// files), and the tests below fail on any difference. They run the helm
// and kubectl that `make tools` builds into TOOLS_DIR.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/bulkhead-runtime/bulkhead/policy/admission"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

const (
	// chartRoot holds Helm charts, which no kustomization lists.
	chartRoot = "chart"
	chartDir  = chartRoot + "/bulkhead"
)

// helmOnlyLabels are the labels the chart adds to every object's metadata
// beside deploy/'s own (templates/_helpers.tpl, bulkhead.helmLabels): the
// only difference the drift check allows.
var helmOnlyLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by"}

// perClusterObjects are what deploy/ generates from files gen-tls.sh and
// policy/build.sh write for one cluster; the chart takes them from values
// (or the cluster) instead, so they are not compared.
var perClusterObjects = []objectKey{
	{Kind: "Secret", Namespace: namespace, Name: "bulkhead-webhook-tls"},
	{Kind: "ConfigMap", Namespace: namespace, Name: "bulkhead-policy"},
	{Kind: "ConfigMap", Namespace: namespace, Name: policyKeyConfigMap},
}

// toolsBin returns TOOLS_DIR/bin/name, skipping the test when make tools
// has not built it.
func toolsBin(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("TOOLS_DIR")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(home, ".cache", "bulkhead", "tools")
	}
	p := filepath.Join(dir, "bin", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s is not in TOOLS_DIR (%s): `make tools` builds it; the chart is not checked", name, filepath.Dir(p))
	}
	return p
}

// runHelm runs TOOLS_DIR's helm with its own homes (no repositories, no
// plugins, nothing of the user's) and returns stdout, or stderr in the error.
func runHelm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	helm := toolsBin(t, "helm")
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// objectKey names one object of a rendered set.
type objectKey struct {
	Kind, Namespace, Name string
}

func (k objectKey) String() string {
	if k.Namespace == "" {
		return k.Kind + " " + k.Name
	}
	return k.Kind + " " + k.Namespace + "/" + k.Name
}

// object is one rendered object: typed when client-go's scheme knows its
// kind (decoded strictly), and as a map for comparison either way. The map
// of a typed object is its typed form converted back, so that equal values
// written differently ("0.1" and "100m", 0755 and 493) compare equal.
type object struct {
	key   objectKey
	typed runtime.Object // nil for CRD kinds (ServiceMonitor, Certificate, ...)
	u     map[string]any
}

// decodeObjects decodes a multi-document YAML stream of rendered objects.
func decodeObjects(t *testing.T, name string, data []byte) []object {
	t.Helper()
	s := json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		json.SerializerOptions{Yaml: true, Strict: true})
	var out []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var u map[string]any
		if err := yaml.Unmarshal(doc, &u); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, doc)
		}
		if len(u) == 0 {
			continue
		}
		o := object{u: u}
		gvk := schemaGVK(u)
		if scheme.Scheme.Recognizes(gvk) {
			typed, _, err := s.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: strict decode: %v\n%s", name, err, doc)
			}
			o.typed = typed
			if o.u, err = runtime.DefaultUnstructuredConverter.ToUnstructured(typed); err != nil {
				t.Fatal(err)
			}
			o.u["apiVersion"], o.u["kind"] = gvk.GroupVersion().String(), gvk.Kind
		}
		meta, _ := o.u["metadata"].(map[string]any)
		ns, _ := meta["namespace"].(string)
		n, _ := meta["name"].(string)
		o.key = objectKey{Kind: gvk.Kind, Namespace: ns, Name: n}
		out = append(out, o)
	}
	return out
}

// renderChart runs helm template on the chart with args (--set ...,
// --api-versions ...) and decodes what it renders.
func renderChart(t *testing.T, args ...string) []object {
	t.Helper()
	out, err := runHelm(t, append([]string{"template", "bulkhead", chartDir}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, "helm template", out)
}

// kustomizeBuild builds the kustomization in dir (relative to deploy/)
// with TOOLS_DIR's kubectl, after writing stand-ins for the per-cluster
// files its generators read, and drops the objects made from them.
func kustomizeBuild(t *testing.T, dir string) []object {
	t.Helper()
	kubectl := toolsBin(t, "kubectl")
	tmp := t.TempDir()
	if err := os.CopyFS(tmp, os.DirFS(".")); err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{
		"tls/tls.crt": "cert", "tls/tls.key": "key", "tls/ca.crt": "ca", "tls/client-ca.crt": "client-ca",
		"policy/bundle.tar.gz": "bundle", "policy/bundle.pem": "pub",
	} {
		p := filepath.Join(tmp, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectl, "kustomize", filepath.Join(tmp, dir)).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	return slices.DeleteFunc(decodeObjects(t, "kubectl kustomize "+dir, out), func(o object) bool {
		return slices.Contains(perClusterObjects, o.key)
	})
}

// driftReport lists every difference between the kustomize build and the
// chart's render: an object only one side has, and each field path where
// an object pair differs. Allowed: helmOnlyLabels on the chart's side.
func driftReport(kustomized, charted []object) []string {
	side := func(objs []object, chart bool) map[objectKey]map[string]any {
		out := map[objectKey]map[string]any{}
		for _, o := range objs {
			u := deepCopyMap(o.u)
			if meta, ok := u["metadata"].(map[string]any); ok && chart {
				if l, ok := meta["labels"].(map[string]any); ok {
					for _, k := range helmOnlyLabels {
						delete(l, k)
					}
				}
			}
			out[o.key] = u
		}
		return out
	}
	k, c := side(kustomized, false), side(charted, true)
	var report []string
	for _, key := range slices.SortedFunc(maps.Keys(k), compareKeys) {
		if _, ok := c[key]; !ok {
			report = append(report, fmt.Sprintf("%s: in deploy/ but not rendered by the chart", key))
			continue
		}
		for _, d := range diffValues("", k[key], c[key]) {
			report = append(report, fmt.Sprintf("%s: %s", key, d))
		}
	}
	for _, key := range slices.SortedFunc(maps.Keys(c), compareKeys) {
		if _, ok := k[key]; !ok {
			report = append(report, fmt.Sprintf("%s: rendered by the chart but not in deploy/", key))
		}
	}
	return report
}

func compareKeys(a, b objectKey) int { return strings.Compare(a.String(), b.String()) }

// diffValues lists the paths where a (deploy/) and b (the chart) differ.
func diffValues(path string, a, b any) []string {
	am, aIsMap := a.(map[string]any)
	bm, bIsMap := b.(map[string]any)
	if aIsMap && bIsMap {
		var out []string
		keys := slices.Collect(maps.Keys(am))
		for k := range bm {
			if _, ok := am[k]; !ok {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			out = append(out, diffValues(path+"."+k, am[k], bm[k])...)
		}
		return out
	}
	as, aIsList := a.([]any)
	bs, bIsList := b.([]any)
	if aIsList && bIsList && len(as) == len(bs) {
		var out []string
		for i := range as {
			out = append(out, diffValues(fmt.Sprintf("%s[%d]", path, i), as[i], bs[i])...)
		}
		return out
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	return []string{fmt.Sprintf("%s: deploy/ has %s, the chart %s", strings.TrimPrefix(path, "."), short(a), short(b))}
}

func short(v any) string {
	if v == nil {
		return "nothing"
	}
	s := fmt.Sprintf("%#v", v)
	if str, ok := v.(string); ok {
		s = fmt.Sprintf("%q", str)
	}
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

func deepCopyMap(m map[string]any) map[string]any {
	return runtime.DeepCopyJSONValue(m).(map[string]any)
}

// TestChartMatchesKustomize is the drift check: deploy/ and the chart are
// edited by hand, and a change made to one and not the other fails here.
// With monitoring on (and the Prometheus Operator's API served) the chart
// also renders deploy/monitoring.
func TestChartMatchesKustomize(t *testing.T) {
	operatorAPIs := "--api-versions=monitoring.coreos.com/v1/ServiceMonitor,monitoring.coreos.com/v1/PrometheusRule"
	for _, tc := range []struct {
		name  string
		args  []string
		roots []string // kustomizations under deploy/
	}{
		{name: "defaults", roots: []string{"."}},
		{name: "monitoring", args: []string{"--set", "monitoring.enabled=true", operatorAPIs}, roots: []string{".", "monitoring"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var kustomized []object
			for _, root := range tc.roots {
				kustomized = append(kustomized, kustomizeBuild(t, root)...)
			}
			charted := renderChart(t, tc.args...)
			for _, d := range driftReport(kustomized, charted) {
				t.Error(d)
			}
		})
	}
}

// TestChartDriftCheckCanFail: each change below, made to one side only, is
// reported, so a passing TestChartMatchesKustomize means something.
func TestChartDriftCheckCanFail(t *testing.T) {
	charted := renderChart(t)
	// What deploy/ would hold if it matched the chart: the render less
	// Helm's own labels.
	base := copyObjects(charted)
	for _, o := range base {
		labels, _ := o.u["metadata"].(map[string]any)["labels"].(map[string]any)
		for _, k := range helmOnlyLabels {
			delete(labels, k)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(objs []object) []object
		want   string
	}{
		{"replicas", func(objs []object) []object {
			withObject(objs, "Deployment", "bulkhead-webhook", func(u map[string]any) { u["spec"].(map[string]any)["replicas"] = int64(3) })
			return objs
		}, "Deployment bulkhead-system/bulkhead-webhook: spec.replicas"},
		{"a webhook flag", func(objs []object) []object {
			withObject(objs, "Deployment", "bulkhead-webhook", func(u map[string]any) {
				c := u["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
				c["args"] = append(c["args"].([]any), "--http2")
			})
			return objs
		}, "spec.template.spec.containers[0].args"},
		{"a label", func(objs []object) []object {
			withObject(objs, "ClusterRole", "bulkhead-agent", func(u map[string]any) {
				u["metadata"].(map[string]any)["labels"].(map[string]any)["extra"] = "x"
			})
			return objs
		}, "ClusterRole bulkhead-agent: metadata.labels.extra"},
		{"a missing object", func(objs []object) []object {
			return slices.DeleteFunc(objs, func(o object) bool { return o.key.Kind == "PodDisruptionBudget" })
		}, "PodDisruptionBudget bulkhead-system/bulkhead-webhook: in deploy/ but not rendered"},
		{"config.toml", func(objs []object) []object {
			withObject(objs, "ConfigMap", "bulkhead-node-config", func(u map[string]any) {
				d := u["data"].(map[string]any)
				d["config.toml"] = strings.Replace(d["config.toml"].(string), `platform = "systrap"`, `platform = "ptrace"`, 1)
			})
			return objs
		}, "ConfigMap bulkhead-system/bulkhead-node-config: data.config.toml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := tc.change(copyObjects(charted))
			report := driftReport(base, changed)
			if !slices.ContainsFunc(report, func(s string) bool { return strings.Contains(s, tc.want) }) {
				t.Errorf("drift report %q does not name %q", report, tc.want)
			}
		})
	}
	if r := driftReport(base, charted); len(r) != 0 {
		t.Errorf("a render compared with itself: %q", r)
	}
}

func copyObjects(objs []object) []object {
	out := make([]object, len(objs))
	for i, o := range objs {
		out[i] = object{key: o.key, u: deepCopyMap(o.u)}
	}
	return out
}

func withObject(objs []object, kind, name string, change func(map[string]any)) {
	for _, o := range objs {
		if o.key.Kind == kind && o.key.Name == name {
			change(o.u)
			return
		}
	}
	panic(kind + " " + name + " not rendered")
}

// TestChartLint: helm lint --strict (warnings fail) with each value set.
func TestChartLint(t *testing.T) {
	for _, tc := range chartValueSets {
		// helm lint has no --api-versions: the value set "operator objects
		// always" lints the Prometheus Operator's objects.
		args := slices.DeleteFunc(slices.Clone(tc.args), func(a string) bool { return strings.HasPrefix(a, "--api-versions") })
		t.Run(tc.name, func(t *testing.T) {
			out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestChartPackage: make chart's package step, into a scratch directory.
func TestChartPackage(t *testing.T) {
	dir := t.TempDir()
	if out, err := runHelm(t, "package", chartDir, "--destination", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "bulkhead-*.tgz")); len(m) != 1 {
		t.Errorf("helm package wrote %v, want one bulkhead-<version>.tgz", m)
	}
}

// chartValueSets are the value sets TestChartLint and TestChartTemplate
// render; each check reads what the value set should have changed.
var chartValueSets = []struct {
	name  string
	args  []string
	check func(t *testing.T, objs []object)
}{
	{
		name: "defaults",
		check: func(t *testing.T, objs []object) {
			for _, o := range objs {
				if slices.Contains(perClusterObjects, o.key) {
					t.Errorf("%s rendered with no key or bundle given", o.key)
				}
				if o.key.Kind == "ServiceMonitor" || o.key.Kind == "Certificate" {
					t.Errorf("%s rendered by default", o.key)
				}
			}
			if cb := webhookConfig(t, objs).Webhooks[0].ClientConfig.CABundle; len(cb) != 0 {
				t.Errorf("caBundle %q without a CA given or read", cb)
			}
			dep := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook")
			if img := dep.Spec.Template.Spec.Containers[0].Image; img != "bulkhead-webhook:dev" {
				t.Errorf("webhook image %q, want the appVersion's tag", img)
			}
			// Both forms of a node's config.toml load with the agent's own
			// loader; a GPU node's drives its GPUs through NVML and DRA.
			if c := renderedNodeConfig(t, objs, false); c.MIG.Backend != "none" {
				t.Errorf("config.toml without gpu.toml: mig.backend %q", c.MIG.Backend)
			}
			if c := renderedNodeConfig(t, objs, true); c.MIG.Backend != "nvml" || !c.DRA.Enabled {
				t.Errorf("a GPU node's config.toml: mig.backend %q, dra.enabled %v", c.MIG.Backend, c.DRA.Enabled)
			}
			if got := installerEnv(t, objs)["GPU_NODE"]; got != "auto" {
				t.Errorf("GPU_NODE=%q, want auto", got)
			}
		},
	},
	{
		name: "files from gen-tls.sh, CA bundle given",
		args: []string{"--set", "tls.mode=secret", "--set", "tls.caBundle=" + base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\n"))},
		check: func(t *testing.T, objs []object) {
			if cb := string(webhookConfig(t, objs).Webhooks[0].ClientConfig.CABundle); cb != "-----BEGIN CERTIFICATE-----\n" {
				t.Errorf("caBundle %q, want tls.caBundle decoded", cb)
			}
			dep := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook")
			spec := dep.Spec.Template.Spec
			cfg, err := admission.ParseFlags(spec.Containers[0].Args, io.Discard)
			if err != nil {
				t.Fatalf("args %v: %v", spec.Containers[0].Args, err)
			}
			if cfg.CertSecret != "" {
				t.Errorf("--cert-secret=%s with the certificate from files", cfg.CertSecret)
			}
			for _, path := range []string{cfg.TLSCert, cfg.TLSKey, cfg.ClientCA} {
				if src, _ := mountedFrom(t, spec, spec.Containers[0], path); src != "bulkhead-webhook-tls" {
					t.Errorf("%s mounted from %q, want the Secret bulkhead-webhook-tls", path, src)
				}
			}
			for _, o := range objs {
				if strings.HasSuffix(o.key.Name, "-certs") {
					t.Errorf("%s rendered without the rotator", o.key)
				}
			}
		},
	},
	{
		name: "files from gen-tls.sh, no CA in reach",
		args: []string{"--set", "tls.mode=secret"},
		check: func(t *testing.T, objs []object) {
			// helm template reads no Secret: the caBundle is left out
			// rather than the render failing.
			if cb := webhookConfig(t, objs).Webhooks[0].ClientConfig.CABundle; len(cb) != 0 {
				t.Errorf("caBundle %q with no CA given or read", cb)
			}
		},
	},
	{
		name: "cert-manager",
		args: []string{"--set", "tls.mode=certManager", "--set", "tls.clientAuth.caSecretName=apiserver-client-ca"},
		check: func(t *testing.T, objs []object) {
			vwc := webhookConfig(t, objs)
			if got := vwc.Annotations["cert-manager.io/inject-ca-from"]; got != namespace+"/bulkhead-webhook" {
				t.Errorf("inject-ca-from = %q", got)
			}
			cert := unstructuredObject(t, objs, "Certificate", "bulkhead-webhook")
			if got := lookupString(cert, "spec", "secretName"); got != "bulkhead-webhook-tls" {
				t.Errorf("Certificate secretName %q", got)
			}
			dns, _ := lookup(cert, "spec", "dnsNames")
			if !slices.Contains(dns.([]any), any("bulkhead-webhook."+namespace+".svc")) {
				t.Errorf("Certificate dnsNames %v lack the Service the API server dials", dns)
			}
			if got := lookupString(cert, "spec", "issuerRef", "name"); got != "bulkhead-webhook-ca" {
				t.Errorf("Certificate issuer %q, want the chart's own CA", got)
			}
			for _, name := range []string{"bulkhead-selfsigned", "bulkhead-webhook-ca"} {
				unstructuredObject(t, objs, "Issuer", name)
			}
			// Every file the webhook's flags name is mounted from the Secret
			// cert-manager writes or the client CA's.
			dep := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook")
			spec := dep.Spec.Template.Spec
			c := spec.Containers[0]
			cfg, err := admission.ParseFlags(c.Args, io.Discard)
			if err != nil {
				t.Fatalf("args %v: %v", c.Args, err)
			}
			for _, f := range []struct{ path, source, key string }{
				{cfg.TLSCert, "bulkhead-webhook-tls", "tls.crt"},
				{cfg.TLSKey, "bulkhead-webhook-tls", "tls.key"},
				{cfg.ClientCA, "apiserver-client-ca", "client-ca.crt"},
			} {
				if src, key := mountedFrom(t, spec, c, f.path); src != f.source || key != f.key {
					t.Errorf("%s is mounted from %s key %s, want %s key %s", f.path, src, key, f.source, f.key)
				}
			}
		},
	},
	{
		name: "cert-manager with an issuer",
		args: []string{"--set", "tls.mode=certManager", "--set", "tls.clientAuth.enabled=false",
			"--set", "tls.certManager.issuerRef.name=corp-ca", "--set", "tls.certManager.issuerRef.kind=ClusterIssuer"},
		check: func(t *testing.T, objs []object) {
			cert := unstructuredObject(t, objs, "Certificate", "bulkhead-webhook")
			if got := lookupString(cert, "spec", "issuerRef", "kind") + "/" + lookupString(cert, "spec", "issuerRef", "name"); got != "ClusterIssuer/corp-ca" {
				t.Errorf("Certificate issuer %s, want ClusterIssuer/corp-ca", got)
			}
			for _, o := range objs {
				if o.key.Kind == "Issuer" {
					t.Errorf("%s rendered though an issuer is given", o.key)
				}
			}
			c := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook").Spec.Template.Spec.Containers[0]
			if cfg, err := admission.ParseFlags(c.Args, io.Discard); err != nil || cfg.ClientCA != "" {
				t.Errorf("client authentication off, but --client-ca is %q (%v)", cfg.ClientCA, err)
			}
		},
	},
	{
		name: "certificates the webhook rotates, a client CA of its own",
		args: []string{"--set", "tls.clientAuth.caSecretName=apiserver-client-ca", "--set", "tls.rotate.certLifetime=48h",
			"--set", "tls.rotate.secretName=webhook-ca"},
		check: func(t *testing.T, objs []object) {
			vwc := webhookConfig(t, objs)
			if len(vwc.Webhooks[0].ClientConfig.CABundle) != 0 {
				t.Error("caBundle rendered: the webhook keeps it")
			}
			dep := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook")
			spec := dep.Spec.Template.Spec
			cfg, err := admission.ParseFlags(spec.Containers[0].Args, io.Discard)
			if err != nil {
				t.Fatalf("args %v: %v", spec.Containers[0].Args, err)
			}
			if cfg.CertSecret != namespace+"/webhook-ca" || cfg.WebhookConfig != vwc.Name || cfg.CertLifetime.Hours() != 48 {
				t.Errorf("rotator flags: secret %q, webhook config %q (want %q), lifetime %v", cfg.CertSecret, cfg.WebhookConfig, vwc.Name, cfg.CertLifetime)
			}
			if src, key := mountedFrom(t, spec, spec.Containers[0], cfg.ClientCA); src != "apiserver-client-ca" || key != "client-ca.crt" {
				t.Errorf("--client-ca mounted from %s key %s", src, key)
			}
			for _, v := range spec.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "bulkhead-webhook-tls" {
					t.Error("Secret bulkhead-webhook-tls mounted, but nothing reads it: a pod would wait for it")
				}
			}
			// The rotator's rights: its Secret and the webhook configuration,
			// bound to the webhook's account.
			role := mustObject[*rbacv1.Role](t, objs, "bulkhead-webhook-certs")
			for _, verb := range []string{"get", "update", "create"} {
				if !allows(role.Rules, "", "secrets", verb) {
					t.Errorf("Role %s does not allow %s secrets", role.Name, verb)
				}
			}
			for _, r := range role.Rules {
				if slices.Contains(r.Verbs, "get") && !slices.Equal(r.ResourceNames, []string{"webhook-ca"}) {
					t.Errorf("Role %s reads Secrets %v, want webhook-ca alone", role.Name, r.ResourceNames)
				}
			}
			cr := mustObject[*rbacv1.ClusterRole](t, objs, "bulkhead-webhook-certs")
			if !allows(cr.Rules, "admissionregistration.k8s.io", "validatingwebhookconfigurations", "update") || !slices.Contains(cr.Rules[0].ResourceNames, vwc.Name) {
				t.Errorf("ClusterRole %s does not allow updating %s: %v", cr.Name, vwc.Name, cr.Rules)
			}
			for _, name := range []string{"bulkhead-webhook-certs"} {
				rb := mustObject[*rbacv1.RoleBinding](t, objs, name)
				crb := mustObject[*rbacv1.ClusterRoleBinding](t, objs, name)
				for _, s := range append(rb.Subjects, crb.Subjects...) {
					if s.Name != spec.ServiceAccountName || s.Namespace != namespace {
						t.Errorf("%s binds %s/%s, not the webhook's account", name, s.Namespace, s.Name)
					}
				}
			}
		},
	},
	{
		name: "monitoring with the Prometheus Operator",
		args: []string{"--set", "monitoring.enabled=true", "--api-versions=monitoring.coreos.com/v1/ServiceMonitor,monitoring.coreos.com/v1/PrometheusRule"},
		check: func(t *testing.T, objs []object) {
			for _, k := range []objectKey{
				{"ServiceMonitor", namespace, "bulkhead-webhook"}, {"ServiceMonitor", namespace, "bulkhead-node"},
				{"PrometheusRule", namespace, "bulkhead"}, {"Service", namespace, "bulkhead-node-metrics"},
				{"ConfigMap", namespace, "bulkhead-dashboard"},
			} {
				if !slices.ContainsFunc(objs, func(o object) bool { return o.key == k }) {
					t.Errorf("%s not rendered", k)
				}
			}
			// Prometheus's own template braces reach the rule verbatim.
			rule := unstructuredObject(t, objs, "PrometheusRule", "bulkhead")
			if s, _ := yaml.Marshal(rule); !bytes.Contains(s, []byte("{{ $labels.pod }}")) {
				t.Error("the PrometheusRule's annotations lost Prometheus's {{ $labels.pod }}")
			}
		},
	},
	{
		name: "monitoring without the Prometheus Operator",
		args: []string{"--set", "monitoring.enabled=true"},
		check: func(t *testing.T, objs []object) {
			for _, o := range objs {
				if o.key.Kind == "ServiceMonitor" || o.key.Kind == "PrometheusRule" {
					t.Errorf("%s rendered, but monitoring.coreos.com/v1 is not served", o.key)
				}
			}
			mustObject[*corev1.Service](t, objs, "bulkhead-node-metrics")
			mustObject[*corev1.ConfigMap](t, objs, "bulkhead-dashboard")
		},
	},
	{
		name: "monitoring, operator objects always",
		args: []string{"--set", "monitoring.enabled=true", "--set", "monitoring.prometheusOperator=always", "--set", "monitoring.dashboard=false"},
		check: func(t *testing.T, objs []object) {
			unstructuredObject(t, objs, "ServiceMonitor", "bulkhead-node")
			unstructuredObject(t, objs, "PrometheusRule", "bulkhead")
			if _, ok := findObject[*corev1.ConfigMap](objs, "bulkhead-dashboard"); ok {
				t.Error("dashboard rendered with monitoring.dashboard=false")
			}
		},
	},
	{
		name: "GPU nodes everywhere, mock MIG, no DRA",
		args: []string{"--set", "node.gpu.nodes=true", "--set", "node.gpu.mig.backend=mock", "--set", "node.gpu.dra.enabled=false"},
		check: func(t *testing.T, objs []object) {
			c := renderedNodeConfig(t, objs, true)
			if c.MIG.Backend != "mock" || c.DRA.Enabled {
				t.Errorf("a GPU node's config.toml: mig.backend %q, dra.enabled %v", c.MIG.Backend, c.DRA.Enabled)
			}
			if got := installerEnv(t, objs)["GPU_NODE"]; got != "true" {
				t.Errorf("GPU_NODE=%q, want true", got)
			}
		},
	},
	{
		name: "node network and policy key",
		args: []string{"--set", "node.netpol.clusterCIDRs={10.0.0.0/16,10.1.0.0/16}", "--set", "node.netpol.sharedServices.untrusted={10.1.0.10/32}",
			"--set", "policy.keyID=prod", "--set", "policy.scope=prod-scope"},
		check: func(t *testing.T, objs []object) {
			c := renderedNodeConfig(t, objs, false)
			if !slices.Equal(c.Netpol.ClusterCIDRs, []string{"10.0.0.0/16", "10.1.0.0/16"}) || !slices.Equal(c.Netpol.SharedServices["untrusted"], []string{"10.1.0.10/32"}) {
				t.Errorf("config.toml netpol: %v, %v", c.Netpol.ClusterCIDRs, c.Netpol.SharedServices)
			}
			wc := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook").Spec.Template.Spec.Containers[0]
			cfg, err := admission.ParseFlags(wc.Args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.KeyID != c.Policy.KeyID || cfg.Scope != c.Policy.Scope || cfg.KeyID != "prod" || cfg.Scope != "prod-scope" {
				t.Errorf("key id/scope: webhook %q/%q, nodes %q/%q, want prod/prod-scope", cfg.KeyID, cfg.Scope, c.Policy.KeyID, c.Policy.Scope)
			}
		},
	},
	{
		name: "images by digest",
		args: []string{"--set", "images.nodeAgent.digest=sha256:" + strings.Repeat("ab", 32), "--set", "images.webhook.repository=registry.example/bulkhead-webhook",
			"--set", "images.webhook.tag=v1.2.3", "--set", "images.nodeInstaller.tag=v1.2.3", "--set", "images.pullPolicy=Always"},
		check: func(t *testing.T, objs []object) {
			ds := mustObject[*appsv1.DaemonSet](t, objs, "bulkhead-node")
			want := map[string]string{"agent": "bulkhead-node-agent@sha256:" + strings.Repeat("ab", 32), "install": "bulkhead-node-installer:v1.2.3"}
			for _, c := range ds.Spec.Template.Spec.Containers {
				if c.Image != want[c.Name] || c.ImagePullPolicy != corev1.PullAlways {
					t.Errorf("%s: image %q pull %q, want %q Always", c.Name, c.Image, c.ImagePullPolicy, want[c.Name])
				}
			}
			if img := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook").Spec.Template.Spec.Containers[0].Image; img != "registry.example/bulkhead-webhook:v1.2.3" {
				t.Errorf("webhook image %q", img)
			}
		},
	},
	{
		name: "policy bundle given",
		args: []string{"--set", "policy.bundle=" + base64.StdEncoding.EncodeToString([]byte("\x1f\x8bbundle")), "--set", "policy.publicKey=-----BEGIN PUBLIC KEY-----\n"},
		check: func(t *testing.T, objs []object) {
			cm := mustObject[*corev1.ConfigMap](t, objs, "bulkhead-policy")
			if string(cm.BinaryData["bundle.tar.gz"]) != "\x1f\x8bbundle" || len(cm.BinaryData) != 1 || len(cm.Data) != 0 {
				t.Errorf("policy ConfigMap: binaryData %q, data %q; want the bundle alone", cm.BinaryData, cm.Data)
			}
			key := mustObject[*corev1.ConfigMap](t, objs, policyKeyConfigMap)
			if key.Data["bundle.pem"] != "-----BEGIN PUBLIC KEY-----\n" || len(key.Data) != 1 || len(key.BinaryData) != 0 {
				t.Errorf("policy key ConfigMap: binaryData %q, data %q; want bundle.pem alone", key.BinaryData, key.Data)
			}
		},
	},
	{
		name: "another namespace, one replica, fail open",
		args: []string{"--set", "namespace=sandbox-system", "--set", "webhook.quotaLedgerNamespace=sandbox-quota",
			"--set", "webhook.replicas=1", "--set", "webhook.failurePolicy=Ignore"},
		check: func(t *testing.T, objs []object) {
			for _, o := range objs {
				inQuota := o.key.Name == quotaRole && (o.key.Kind == "Role" || o.key.Kind == "RoleBinding")
				if o.key.Namespace != "" && o.key.Namespace != "sandbox-system" && !(inQuota && o.key.Namespace == "sandbox-quota") {
					t.Errorf("%s outside namespace sandbox-system", o.key)
				}
				if inQuota && o.key.Namespace != "sandbox-quota" {
					t.Errorf("%s outside the ledgers' namespace sandbox-quota", o.key)
				}
			}
			mustObject[*corev1.Namespace](t, objs, "sandbox-system")
			mustObject[*corev1.Namespace](t, objs, "sandbox-quota")
			vap := mustObject[*admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "bulkhead-node-resourceslices")
			if want := `request.userInfo.username == "system:serviceaccount:sandbox-system:bulkhead-node"`; vap.Spec.MatchConditions[0].Expression != want {
				t.Errorf("ResourceSlice policy matches %q, want %q", vap.Spec.MatchConditions[0].Expression, want)
			}
			wh := webhookConfig(t, objs).Webhooks[0]
			if wh.ClientConfig.Service.Namespace != "sandbox-system" || wh.FailurePolicy == nil || *wh.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("webhook: service namespace %q, failurePolicy %v", wh.ClientConfig.Service.Namespace, wh.FailurePolicy)
			}
			if !slices.Contains(wh.NamespaceSelector.MatchExpressions[0].Values, "sandbox-system") {
				t.Errorf("the webhook does not exempt its own namespace: %v", wh.NamespaceSelector)
			}
			dep := mustObject[*appsv1.Deployment](t, objs, "bulkhead-webhook")
			cfg, err := admission.ParseFlags(dep.Spec.Template.Spec.Containers[0].Args, io.Discard)
			if err != nil || cfg.QuotaNamespace != "sandbox-quota" || *dep.Spec.Replicas != 1 {
				t.Errorf("webhook: quota ledger namespace %q (%v), replicas %d", cfg.QuotaNamespace, err, *dep.Spec.Replicas)
			}
		},
	},
}

// TestChartTemplate renders each value set (with no key, certificate or
// bundle in reach: helm template reads no cluster) and checks it.
func TestChartTemplate(t *testing.T) {
	for _, tc := range chartValueSets {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, renderChart(t, tc.args...))
		})
	}
}

// TestChartSchemaRejects: values.schema.json refuses each bad value, and
// helm's message names the field.
func TestChartSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // in the error
	}{
		{"replicas not a number", []string{"--set", "webhook.replicas=two"}, []string{"replicas"}},
		{"no replicas", []string{"--set", "webhook.replicas=0"}, []string{"replicas"}},
		{"unknown failurePolicy", []string{"--set", "webhook.failurePolicy=Sometimes"}, []string{"failurePolicy"}},
		{"unknown TLS mode", []string{"--set", "tls.mode=acme"}, []string{"mode"}},
		{"misspelt key", []string{"--set", "webhook.replica=3"}, []string{"replica"}},
		{"unknown MIG backend", []string{"--set", "node.gpu.mig.backend=none"}, []string{"backend"}},
		{"GPU nodes neither auto nor true nor false", []string{"--set", "node.gpu.nodes=sometimes"}, []string{"nodes"}},
		{"cert-manager without the client CA", []string{"--set", "tls.mode=certManager"}, []string{"caSecretName"}},
		{"rotation with a CA bundle", []string{"--set", "tls.caBundle=YQ=="}, []string{"caBundle"}},
		{"lifetime not a duration", []string{"--set", "tls.rotate.caLifetime=a year"}, []string{"caLifetime"}},
		{"bundle without its key", []string{"--set", "policy.bundle=YQ=="}, []string{"publicKey"}},
		{"digest not a digest", []string{"--set", "images.node.digest=latest"}, []string{"digest"}},
		{"not a CIDR", []string{"--set", "node.netpol.clusterCIDRs={everywhere}"}, []string{"clusterCIDRs"}},
		{"ledger namespace not a namespace", []string{"--set", "webhook.quotaLedgerNamespace=Quota_Ledgers"}, []string{"quotaLedgerNamespace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runHelm(t, append([]string{"template", "bulkhead", chartDir}, tc.args...)...)
			if err == nil {
				t.Fatalf("helm template %v succeeded", tc.args)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not name %q: %v", w, err)
				}
			}
			if !strings.Contains(err.Error(), "schema") {
				t.Errorf("refused, but not by the values schema: %v", err)
			}
		})
	}
}

// TestChartRefusesLedgersBesideTrust: the quota ledgers may not share the
// namespace of Bulkhead's own objects, where the webhook would then write
// every ConfigMap (the bundle, its key, the nodes' config and installer).
func TestChartRefusesLedgersBesideTrust(t *testing.T) {
	_, err := runHelm(t, "template", "bulkhead", chartDir, "--set", "webhook.quotaLedgerNamespace="+namespace)
	if err == nil || !strings.Contains(err.Error(), "webhook.quotaLedgerNamespace") || !strings.Contains(err.Error(), "a namespace of their own") {
		t.Fatalf("helm template with the ledgers in %s: %v, want a refusal that names webhook.quotaLedgerNamespace", namespace, err)
	}
}

func findObject[T runtime.Object](objs []object, name string) (T, bool) {
	for _, o := range objs {
		if v, ok := o.typed.(T); ok && o.key.Name == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}

func mustObject[T runtime.Object](t *testing.T, objs []object, name string) T {
	t.Helper()
	v, ok := findObject[T](objs, name)
	if !ok {
		t.Fatalf("no %T named %q rendered", v, name)
	}
	return v
}

func unstructuredObject(t *testing.T, objs []object, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.key.Kind == kind && o.key.Name == name {
			return o.u
		}
	}
	t.Fatalf("no %s named %q rendered", kind, name)
	return nil
}

func lookupString(m map[string]any, path ...string) string {
	v, _ := lookup(m, path...)
	s, _ := v.(string)
	return s
}

func webhookConfig(t *testing.T, objs []object) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	vwc := mustObject[*admissionregistrationv1.ValidatingWebhookConfiguration](t, objs, "bulkhead")
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
	}
	return vwc
}

// renderedNodeConfig loads the rendered config.toml, on a GPU node with
// gpu.toml appended as install.sh appends it, with the agent's own loader
// (unknown keys refused, every key validated).
func renderedNodeConfig(t *testing.T, objs []object, gpuNode bool) config.Config {
	t.Helper()
	cm := mustObject[*corev1.ConfigMap](t, objs, "bulkhead-node-config")
	data := cm.Data["config.toml"]
	if gpuNode {
		data += "\n" + cm.Data["gpu.toml"]
	}
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(p)
	if err != nil {
		t.Fatalf("rendered config.toml: %v", err)
	}
	return c
}

// installerEnv is the environment of the DaemonSet's install container.
func installerEnv(t *testing.T, objs []object) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, c := range mustObject[*appsv1.DaemonSet](t, objs, "bulkhead-node").Spec.Template.Spec.Containers {
		if c.Name == "install" {
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			return env
		}
	}
	t.Fatal("the DaemonSet has no install container")
	return nil
}

// schemaGVK reads an object's apiVersion and kind.
func schemaGVK(u map[string]any) schema.GroupVersionKind {
	apiVersion, _ := u["apiVersion"].(string)
	kind, _ := u["kind"].(string)
	return schema.FromAPIVersionAndKind(apiVersion, kind)
}
