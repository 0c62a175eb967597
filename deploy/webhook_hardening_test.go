package deploy

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

// TestWebhookNetworkPolicy: the webhook's pods are selected by an ingress
// policy; the webhook port is reachable only from address blocks (the API
// server's, docs/install.md), never from every pod; no rule admits every
// source or every port; and the container really requires a client
// certificate of the API server.
func TestWebhookNetworkPolicy(t *testing.T) {
	tr := loadTree(t)
	np := mustFind[*networkingv1.NetworkPolicy](t, tr, "bulkhead-webhook")
	dep := mustFind[*appsv1.Deployment](t, tr, "bulkhead-webhook")
	sel, err := metav1SelectorOf(&np.Spec.PodSelector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Fatalf("NetworkPolicy selector %v does not select the webhook's pods (%v)", np.Spec.PodSelector, err)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Error("NetworkPolicy must restrict ingress")
	}
	c := dep.Spec.Template.Spec.Containers[0]
	webhookPortSeen := false
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 {
			t.Errorf("ingress rule %d admits every source", i)
		}
		if len(rule.Ports) == 0 {
			t.Errorf("ingress rule %d admits every port", i)
		}
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.Type != intstr.String || !hasPort(c, p.Port.StrVal) {
				t.Errorf("ingress rule %d: port %v is not a named port of the webhook container", i, p.Port)
				continue
			}
			if p.Port.StrVal != "webhook" {
				continue
			}
			webhookPortSeen = true
			for _, from := range rule.From {
				if from.IPBlock == nil || from.PodSelector != nil || from.NamespaceSelector != nil {
					t.Errorf("ingress rule %d: the webhook port is open to %+v; only the API server's addresses belong here", i, from)
				}
				if from.IPBlock != nil && (from.IPBlock.CIDR == "0.0.0.0/0" || from.IPBlock.CIDR == "::/0") {
					t.Errorf("ingress rule %d: the webhook port is open to the world", i)
				}
			}
		}
	}
	if !webhookPortSeen {
		t.Error("no ingress rule lets the API server reach the webhook port")
	}
	cfg, err := admission.ParseFlags(c.Args, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClientCA == "" || len(cfg.ClientNames) == 0 {
		t.Errorf("webhook args: --client-ca %q, --client-name %v: the API server's certificate must be required", cfg.ClientCA, cfg.ClientNames)
	}
}

// TestWebhookQuotaLedgerRights: the webhook may read and write ConfigMaps
// in the namespace its --quota-ledger-namespace names, and only there; that
// namespace is one of its own, created by the tree, apart from Bulkhead's
// (whose ConfigMaps the nodes trust), and holds nothing but that right.
func TestWebhookQuotaLedgerRights(t *testing.T) {
	tr := loadTree(t)
	dep := mustFind[*appsv1.Deployment](t, tr, "bulkhead-webhook")
	cfg, err := admission.ParseFlags(dep.Spec.Template.Spec.Containers[0].Args, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QuotaNamespace != quotaNamespace {
		t.Fatalf("--quota-ledger-namespace %q, want %q (the ledgers' own namespace: quotas must hold across replicas)", cfg.QuotaNamespace, quotaNamespace)
	}
	if def := admission.DefaultQuotaNamespace; def != cfg.QuotaNamespace {
		t.Errorf("the webhook's default ledger namespace %q is not deploy/'s %q", def, cfg.QuotaNamespace)
	}
	mustFind[*corev1.Namespace](t, tr, cfg.QuotaNamespace)
	rb := mustFind[*rbacv1.RoleBinding](t, tr, quotaRole)
	if rb.Namespace != cfg.QuotaNamespace || !slices.ContainsFunc(rb.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == dep.Spec.Template.Spec.ServiceAccountName && s.Namespace == namespace
	}) {
		t.Errorf("RoleBinding %s/%s does not bind the webhook's ServiceAccount", rb.Namespace, rb.Name)
	}
	if rb.RoleRef.Kind != "Role" {
		t.Errorf("RoleBinding %s/%s binds a %s: the ledgers' rights are a Role of their namespace", rb.Namespace, rb.Name, rb.RoleRef.Kind)
	}
	role := mustFind[*rbacv1.Role](t, tr, rb.RoleRef.Name)
	if role.Namespace != cfg.QuotaNamespace {
		t.Errorf("Role %s lives in %q, not the ledgers' namespace %q", role.Name, role.Namespace, cfg.QuotaNamespace)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create", "update"}}}
	if !equality.Semantic.DeepEqual(role.Rules, want) {
		t.Errorf("Role %s: rules %+v, want exactly %+v", role.Name, role.Rules, want)
	}
	for _, o := range tr.objects {
		m := o.(interface {
			GetNamespace() string
			GetName() string
		})
		if m.GetNamespace() == cfg.QuotaNamespace && m.GetName() != quotaRole {
			t.Errorf("%T %s lives in the ledgers' namespace %s, where the webhook may write every ConfigMap", o, m.GetName(), cfg.QuotaNamespace)
		}
	}
	for _, g := range tr.generators {
		if g.Namespace == cfg.QuotaNamespace {
			t.Errorf("generator %s writes into the ledgers' namespace %s", g.Name, cfg.QuotaNamespace)
		}
	}
	cr := mustFind[*rbacv1.ClusterRole](t, tr, "bulkhead-webhook")
	for _, rule := range cr.Rules {
		for _, v := range rule.Verbs {
			if v != "get" && v != "list" && v != "watch" {
				t.Errorf("ClusterRole %s allows %s on %v: the webhook writes only its ledgers and its certificate", cr.Name, v, rule.Resources)
			}
		}
	}
}
