package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// The objects every node trusts, which no Bulkhead identity may write: one
// compromised component (the webhook, one node's agent) must not become
// every node's root. test/cluster's 13-rbac-each-identity-owns-its-objects
// asks the API server the same of the installed tree.

// policyKeyConfigMap holds the public key that verifies the policy bundle,
// apart from the bundle's own ConfigMap.
const policyKeyConfigMap = "bulkhead-policy-key"

// guarded is one object (or, with name "", every object of a resource in
// the namespace, or cluster-wide with namespace "") that no Bulkhead
// ServiceAccount may create, update, patch or delete.
type guarded struct {
	group, resource, namespace, name string
	why                              string
}

var guardedObjects = []guarded{
	{"", "configmaps", namespace, "bulkhead-policy", "the signed policy bundle every node enforces"},
	{"", "configmaps", namespace, policyKeyConfigMap, "the key that verifies the bundle"},
	{"", "configmaps", namespace, "bulkhead-node-config", "every node's config.toml"},
	{"", "configmaps", namespace, "bulkhead-node-installer", "the script the privileged installer runs with the host's / mounted"},
	// Not the Secrets of bulkhead-system: the webhook alone reads them, and
	// its rotator must create its own on the first start (create cannot be
	// limited by name; webhook/rbac.yaml).
	{"apps", "daemonsets", namespace, "bulkhead-node", "the privileged node DaemonSet"},
	{"apps", "deployments", namespace, "bulkhead-webhook", "the webhook"},
	{"", "pods", namespace, "", "a pod of the privileged namespace, which the webhook never judges"},
	{"", "serviceaccounts", namespace, "", "the identities themselves"},
	{"", "serviceaccounts/token", namespace, "", "tokens of the other identities"},
	{"", "namespaces", "", namespace, "Bulkhead's namespace"},
	{"admissionregistration.k8s.io", "validatingadmissionpolicies", "", "bulkhead-node-resourceslices", "the bound on the agents' ResourceSlices"},
	{"admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "bulkhead-node-resourceslices", "the bound on the agents' ResourceSlices"},
	{"rbac.authorization.k8s.io", "roles", "", "", "rights"},
	{"rbac.authorization.k8s.io", "rolebindings", "", "", "rights"},
	{"rbac.authorization.k8s.io", "clusterroles", "", "", "rights"},
	{"rbac.authorization.k8s.io", "clusterrolebindings", "", "", "rights"},
}

// writeVerbs change an object.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// grant is one rule as it reaches a ServiceAccount: cluster-wide through a
// ClusterRoleBinding (namespace ""), or in one namespace.
type grant struct {
	rule      rbacv1.PolicyRule
	namespace string
	via       string
}

// grantsOf returns every rule bound to the ServiceAccount sa in the tree.
func grantsOf(t *testing.T, tr *tree, sa *corev1.ServiceAccount) []grant {
	t.Helper()
	binds := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa.Name && s.Namespace == sa.Namespace
		})
	}
	rulesOf := func(ref rbacv1.RoleRef, ns string) []rbacv1.PolicyRule {
		if ref.Kind == "ClusterRole" {
			return mustFind[*rbacv1.ClusterRole](t, tr, ref.Name).Rules
		}
		for _, o := range tr.objects {
			if r, ok := o.(*rbacv1.Role); ok && r.Name == ref.Name && r.Namespace == ns {
				return r.Rules
			}
		}
		t.Fatalf("no Role %s/%s in the tree", ns, ref.Name)
		return nil
	}
	var out []grant
	for _, o := range tr.objects {
		switch b := o.(type) {
		case *rbacv1.ClusterRoleBinding:
			if binds(b.Subjects) {
				for _, r := range rulesOf(b.RoleRef, "") {
					out = append(out, grant{r, "", "ClusterRoleBinding " + b.Name})
				}
			}
		case *rbacv1.RoleBinding:
			if binds(b.Subjects) {
				for _, r := range rulesOf(b.RoleRef, b.Namespace) {
					out = append(out, grant{r, b.Namespace, "RoleBinding " + b.Namespace + "/" + b.Name})
				}
			}
		}
	}
	return out
}

// reaches reports whether g allows verb on the guarded object o, as RBAC
// decides: a create carries no name, so a rule with resourceNames never
// allows it, and a rule without them allows it on any name.
func (g grant) reaches(o guarded, verb string) bool {
	r := g.rule
	any := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	if !any(r.APIGroups, o.group) || !any(r.Resources, o.resource) || !any(r.Verbs, verb) {
		return false
	}
	if g.namespace != "" && g.namespace != o.namespace {
		return false
	}
	if len(r.ResourceNames) == 0 {
		return true
	}
	return verb != "create" && (o.name == "" || slices.Contains(r.ResourceNames, o.name))
}

// TestNoBulkheadIdentityWritesTrust: no ServiceAccount of the tree may
// create, update, patch or delete an object the nodes trust (the bundle,
// its key, the nodes' config and installer, the DaemonSet, the
// ResourceSlice policy, rights). Before the quota ledgers had a namespace
// of their own, the webhook's Role granted create and update on every
// ConfigMap of bulkhead-system, and this failed on each of them.
func TestNoBulkheadIdentityWritesTrust(t *testing.T) {
	tr := loadTree(t)
	var accounts []*corev1.ServiceAccount
	for _, o := range tr.objects {
		if sa, ok := o.(*corev1.ServiceAccount); ok {
			accounts = append(accounts, sa)
		}
	}
	if len(accounts) < 2 {
		t.Fatalf("%d ServiceAccounts in the tree, want the webhook's and the nodes'", len(accounts))
	}
	for _, sa := range accounts {
		grants := grantsOf(t, tr, sa)
		if len(grants) == 0 {
			t.Errorf("ServiceAccount %s is bound to nothing: is the test reading the tree?", sa.Name)
		}
		for _, o := range guardedObjects {
			for _, verb := range writeVerbs {
				for _, g := range grants {
					if g.reaches(o, verb) {
						t.Errorf("ServiceAccount %s may %s %s (%s), through %s: %+v", sa.Name, verb, o, o.why, g.via, g.rule)
					}
				}
			}
		}
	}
}

func (o guarded) String() string {
	name := o.name
	if name == "" {
		name = "*"
	}
	res := o.resource
	if o.group != "" {
		res += "." + o.group
	}
	if o.namespace == "" {
		return res + "/" + name
	}
	return fmt.Sprintf("%s/%s in %s", res, name, o.namespace)
}

// TestGrantReaches holds the matcher above to RBAC's rules, so that
// TestNoBulkheadIdentityWritesTrust can fail.
func TestGrantReaches(t *testing.T) {
	cm := guarded{"", "configmaps", namespace, "bulkhead-policy", ""}
	for _, tc := range []struct {
		g    grant
		verb string
		want bool
	}{
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}, namespace: namespace}, "update", true},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}}, namespace: namespace}, "create", true},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}, namespace: quotaNamespace}, "update", false},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}}, "update", true},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}, "delete", true},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update"}, ResourceNames: []string{"other"}}, namespace: namespace}, "update", false},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update", "create"}, ResourceNames: []string{"bulkhead-policy"}}, namespace: namespace}, "update", true},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"update", "create"}, ResourceNames: []string{"bulkhead-policy"}}, namespace: namespace}, "create", false},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}}, "update", false},
		{grant{rule: rbacv1.PolicyRule{APIGroups: []string{"apps"}, Resources: []string{"configmaps"}, Verbs: []string{"update"}}}, "update", false},
	} {
		if got := tc.g.reaches(cm, tc.verb); got != tc.want {
			t.Errorf("%+v in %q, %s: %v, want %v", tc.g.rule, tc.g.namespace, tc.verb, got, tc.want)
		}
	}
}

// TestPolicyKeyInItsOwnObject: the key that verifies the bundle comes from
// a ConfigMap of its own, to the webhook (--key) and to the installer
// (POLICY_KEY_SRC), and nothing mounts a key from the bundle's ConfigMap:
// whoever may write the bundle's object may not also choose its key.
func TestPolicyKeyInItsOwnObject(t *testing.T) {
	tr := loadTree(t)
	g, ok := tr.generators[policyKeyConfigMap]
	if !ok || !slices.Equal(keys(g.fileKeys()), []string{"bundle.pem"}) {
		t.Errorf("generator %s: %+v, want the key bundle.pem alone", policyKeyConfigMap, g)
	}
	if g, ok := tr.generators["bulkhead-policy"]; !ok || !slices.Equal(keys(g.fileKeys()), []string{"bundle.tar.gz"}) {
		t.Errorf("generator bulkhead-policy: %+v, want the bundle alone (its key lives in %s)", g, policyKeyConfigMap)
	}
	dep := mustFind[*appsv1.Deployment](t, tr, "bulkhead-webhook")
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	c := dep.Spec.Template.Spec.Containers[0]
	var key string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--key="); ok {
			key = v
		}
	}
	if src, k := mountedFrom(t, dep.Spec.Template.Spec, c, key); src != policyKeyConfigMap || k != "bundle.pem" {
		t.Errorf("webhook --key=%s: mounted from %s key %q, want %s key bundle.pem", key, src, k, policyKeyConfigMap)
	}
	inst := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range inst.Env {
		env[e.Name] = e.Value
	}
	if src, k := mountedFrom(t, ds.Spec.Template.Spec, inst, env["POLICY_KEY_SRC"]+"/bundle.pem"); src != policyKeyConfigMap || k != "bundle.pem" {
		t.Errorf("installer POLICY_KEY_SRC=%s: bundle.pem mounted from %s key %q, want %s", env["POLICY_KEY_SRC"], src, k, policyKeyConfigMap)
	}
	for _, spec := range []corev1.PodSpec{dep.Spec.Template.Spec, ds.Spec.Template.Spec} {
		for _, v := range spec.Volumes {
			if v.ConfigMap == nil || v.ConfigMap.Name != "bulkhead-policy" {
				continue
			}
			// Items, so that a bundle.pem left in the bundle's ConfigMap (as
			// releases before the split wrote it) is never mounted.
			if len(v.ConfigMap.Items) != 1 || v.ConfigMap.Items[0].Key != "bundle.tar.gz" {
				t.Errorf("volume %s mounts %v of bulkhead-policy, want the item bundle.tar.gz alone", v.Name, v.ConfigMap.Items)
			}
		}
	}
}

// TestResourceSlicePolicy: the node agent may write every ResourceSlice as
// far as RBAC goes (a slice's name is generated), so a
// ValidatingAdmissionPolicy bounds the agent's account to its own node's
// slices of Bulkhead's driver, failing closed and denying. What the CEL
// decides is tested on a real API server (test/cluster, 13-...).
func TestResourceSlicePolicy(t *testing.T) {
	tr := loadTree(t)
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	user := "system:serviceaccount:" + namespace + ":" + ds.Spec.Template.Spec.ServiceAccountName
	vap := mustFind[*admissionregistrationv1.ValidatingAdmissionPolicy](t, tr, "bulkhead-node-resourceslices")
	if vap.Spec.FailurePolicy == nil || *vap.Spec.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", vap.Spec.FailurePolicy)
	}
	mc := vap.Spec.MatchConstraints
	if mc == nil || len(mc.ResourceRules) != 1 {
		t.Fatalf("matchConstraints %+v, want one rule on resourceslices", mc)
	}
	rr := mc.ResourceRules[0]
	if !slices.Equal(rr.APIGroups, []string{"resource.k8s.io"}) || !slices.Equal(rr.Resources, []string{"resourceslices"}) ||
		!slices.Equal(rr.APIVersions, []string{"*"}) {
		t.Errorf("rule %+v, want resourceslices.resource.k8s.io of every version", rr)
	}
	for _, op := range []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete} {
		if !slices.Contains(rr.Operations, op) {
			t.Errorf("rule %+v does not match %s", rr, op)
		}
	}
	if len(vap.Spec.MatchConditions) != 1 || vap.Spec.MatchConditions[0].Expression != `request.userInfo.username == "`+user+`"` {
		t.Errorf("matchConditions %+v, want the one that matches %s", vap.Spec.MatchConditions, user)
	}
	var all strings.Builder
	for _, v := range vap.Spec.Variables {
		all.WriteString(v.Expression + "\n")
	}
	for _, v := range vap.Spec.Validations {
		all.WriteString(v.Expression + "\n")
	}
	for _, must := range []string{"'authentication.kubernetes.io/node-name'", "oldObject", `variables.nodeName != ""`,
		`s.spec.?nodeName.orValue("") == variables.nodeName`, `s.spec.driver == "` + migdra.DriverName + `"`} {
		if !strings.Contains(all.String(), must) {
			t.Errorf("the policy's expressions never say %s:\n%s", must, all.String())
		}
	}
	b := mustFind[*admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, tr, vap.Name)
	if b.Spec.PolicyName != vap.Name || !slices.Equal(b.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) ||
		b.Spec.ParamRef != nil || b.Spec.MatchResources != nil {
		t.Errorf("binding %+v, want policy %s, [Deny], every resource it matches", b.Spec, vap.Name)
	}
	// The agent's ClusterRole is why the policy exists: if it no longer
	// writes slices, this test should say so rather than pass vacuously.
	sa := mustFind[*corev1.ServiceAccount](t, tr, ds.Spec.Template.Spec.ServiceAccountName)
	writes := false
	for _, g := range grantsOf(t, tr, sa) {
		for _, verb := range []string{"create", "update", "delete"} {
			writes = writes || g.reaches(guarded{"resource.k8s.io", "resourceslices", "", "any", ""}, verb)
		}
	}
	if !writes {
		t.Error("the node agent writes no ResourceSlice: drop the policy with the right")
	}
}
