package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Issue 36, items 1 and 3: no Bulkhead identity can rewrite what the nodes
// trust, and the node agent writes only its own node's ResourceSlices. The
// static side (deploy/rbac_test.go) reads the manifests; this asks the API
// server, with deploy/'s RBAC and ValidatingAdmissionPolicy installed, what
// each ServiceAccount may really do.

// quotaNamespace holds the webhook's quota ledgers (deploy/namespace.yaml).
const quotaNamespace = "bulkhead-quota"

// rbacNamespaces are where each account's rights are listed: Bulkhead's
// own, the ledgers', a tenant's (every cluster-wide right shows there
// too) and kube-system.
var rbacNamespaces = []string{webhookNamespace, quotaNamespace, "agents", "kube-system"}

// clusterWide marks the rights an account holds in every namespace.
const clusterWide = "*"

// wantRights is, for each ServiceAccount of bulkhead-system, every right
// beyond what any ServiceAccount of another namespace holds, as "verb
// resource[.group][/name]", by namespace (clusterWide: in each of
// rbacNamespaces). A ServiceAccount not named here fails the test.
var wantRights = map[string]map[string][]string{
	"bulkhead-webhook": {
		clusterWide: {
			"get pods", "list pods", "watch pods",
			"get runtimeclasses.node.k8s.io", "list runtimeclasses.node.k8s.io", "watch runtimeclasses.node.k8s.io",
			"get resourceclaims.resource.k8s.io", "list resourceclaims.resource.k8s.io", "watch resourceclaims.resource.k8s.io",
			"get resourceclaimtemplates.resource.k8s.io", "list resourceclaimtemplates.resource.k8s.io", "watch resourceclaimtemplates.resource.k8s.io",
			// The certificate rotator's caBundle, of its own configuration.
			"get validatingwebhookconfigurations.admissionregistration.k8s.io/bulkhead",
			"list validatingwebhookconfigurations.admissionregistration.k8s.io/bulkhead",
			"watch validatingwebhookconfigurations.admissionregistration.k8s.io/bulkhead",
			"update validatingwebhookconfigurations.admissionregistration.k8s.io/bulkhead",
		},
		// The rotator's Secret: create has no name to match (RBAC cannot
		// limit it), the rest by name.
		webhookNamespace: {
			"create secrets",
			"get secrets/bulkhead-webhook-cert", "list secrets/bulkhead-webhook-cert",
			"watch secrets/bulkhead-webhook-cert", "update secrets/bulkhead-webhook-cert",
		},
		// The quota ledgers, in a namespace that holds nothing else.
		quotaNamespace: {"get configmaps", "list configmaps", "create configmaps", "update configmaps"},
	},
	"bulkhead-node": {
		clusterWide: {
			"create events", "patch events",
			// The fence's cluster view; pods list/watch is the scale
			// issue's (#38) to take down to a published tenant-address view.
			"list pods", "watch pods", "get pods",
			"list services", "watch services",
			"list nodes", "watch nodes", "get nodes",
			"list endpointslices.discovery.k8s.io", "watch endpointslices.discovery.k8s.io",
			// Bounded to the token's own node and driver by the
			// ValidatingAdmissionPolicy bulkhead-node-resourceslices.
			"get resourceslices.resource.k8s.io", "list resourceslices.resource.k8s.io", "watch resourceslices.resource.k8s.io",
			"create resourceslices.resource.k8s.io", "update resourceslices.resource.k8s.io", "delete resourceslices.resource.k8s.io",
			"get resourceclaims.resource.k8s.io",
			"get runtimeclasses.node.k8s.io",
		},
	},
	// Made by the controller manager; Bulkhead binds nothing to it.
	"default": {},
}

// trustedObjects are what every node trusts: no Bulkhead identity may
// create, update, patch or delete them (namespace "" for cluster-scoped).
var trustedObjects = []struct{ resource, namespace, name string }{
	{"configmaps", webhookNamespace, "bulkhead-policy"},
	{"configmaps", webhookNamespace, "bulkhead-policy-key"},
	{"configmaps", webhookNamespace, "bulkhead-node-config"},
	{"configmaps", webhookNamespace, "bulkhead-node-installer"},
	{"daemonsets.apps", webhookNamespace, nodeDaemonSet},
	{"validatingadmissionpolicies.admissionregistration.k8s.io", "", resourceSlicePolicy},
	{"validatingadmissionpolicybindings.admissionregistration.k8s.io", "", resourceSlicePolicy},
}

const resourceSlicePolicy = "bulkhead-node-resourceslices"

// canIRow is one line of `kubectl auth can-i --list`: a resource (or none,
// for non-resource URLs), then three bracketed lists.
var canIRow = regexp.MustCompile(`^(\S*)\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$`)

// parseCanIList expands `kubectl auth can-i --list` into one "verb
// resource[/name]" (or "verb URL") per right.
func parseCanIList(out string) (map[string]bool, error) {
	rights := map[string]bool{}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		// kubectl's warnings (a list the authorizers say may be
		// incomplete) come on stderr, in the same output.
		if !strings.HasPrefix(l, "Warning:") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "Resources") {
		return nil, fmt.Errorf("not the output of kubectl auth can-i --list:\n%s", out)
	}
	for _, l := range lines[1:] {
		m := canIRow.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("line %q: not a rule", l)
		}
		resource, urls, names, verbs := m[1], strings.Fields(m[2]), strings.Fields(m[3]), strings.Fields(m[4])
		for _, v := range verbs {
			if resource == "" {
				for _, u := range urls {
					rights[v+" "+u] = true
				}
				continue
			}
			if len(names) == 0 {
				rights[v+" "+resource] = true
			}
			for _, n := range names {
				rights[v+" "+resource+"/"+n] = true
			}
		}
	}
	return rights, nil
}

func TestParseCanIList(t *testing.T) {
	out := `Resources                                                    Non-Resource URLs   Resource Names            Verbs
selfsubjectreviews.authentication.k8s.io                     []                  []                        [create]
configmaps                                                   []                  []                        [get list create update]
secrets                                                      []                  [bulkhead-webhook-cert]   [get list watch update]
                                                             [/api/*]            []                        [get]
`
	got, err := parseCanIList(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"create selfsubjectreviews.authentication.k8s.io", "get configmaps", "list configmaps", "create configmaps", "update configmaps",
		"get secrets/bulkhead-webhook-cert", "list secrets/bulkhead-webhook-cert", "watch secrets/bulkhead-webhook-cert", "update secrets/bulkhead-webhook-cert", "get /api/*"}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("parsed %v, want %v", slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want)))
	}
	if got, err := parseCanIList("Warning: the list may be incomplete: webhook authorizer does not support user rule resolution\n" + out); err != nil || len(got) != len(want) {
		t.Errorf("with a warning first: %v, %v", got, err)
	}
	if _, err := parseCanIList("error: unknown flag"); err == nil {
		t.Error("parsed an error message")
	}
}

// testRBAC is 13-rbac-each-identity-owns-its-objects.
func testRBAC(ctx context.Context, t *testing.T, c *Cluster) {
	kubectl := func(args ...string) (string, error) { return c.Kubectl(ctx, args...) }
	out, err := kubectl("-n", webhookNamespace, "get", "serviceaccounts", "-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}")
	if err != nil {
		t.Fatalf("kubectl get serviceaccounts: %v\n%s", err, out)
	}
	accounts := strings.Fields(out)
	for _, name := range []string{"bulkhead-webhook", "bulkhead-node"} {
		if !slices.Contains(accounts, name) {
			t.Errorf("ServiceAccount %s/%s is not installed", webhookNamespace, name)
		}
	}

	// What any ServiceAccount holds (system:serviceaccounts,
	// system:authenticated): an account of a namespace no binding names.
	baseline := map[string]map[string]bool{}
	for _, ns := range rbacNamespaces {
		out, err := kubectl("auth", "can-i", "--list", "-n", ns, "--as=system:serviceaccount:bulkhead-rbac-nobody:nobody")
		if err != nil {
			t.Fatalf("kubectl auth can-i --list: %v\n%s", err, out)
		}
		if baseline[ns], err = parseCanIList(out); err != nil {
			t.Fatal(err)
		}
		t.Logf("$ kubectl auth can-i --list -n %s --as=system:serviceaccount:bulkhead-rbac-nobody:nobody   (every ServiceAccount's)\n%s", ns, out)
	}

	for _, sa := range accounts {
		want, known := wantRights[sa]
		if !known {
			t.Errorf("ServiceAccount %s/%s: unknown to this test; say what it may do in wantRights", webhookNamespace, sa)
			continue
		}
		user := "system:serviceaccount:" + webhookNamespace + ":" + sa
		for _, ns := range rbacNamespaces {
			out, err := kubectl("auth", "can-i", "--list", "-n", ns, "--as="+user)
			if err != nil {
				t.Fatalf("kubectl auth can-i --list: %v\n%s", err, out)
			}
			t.Logf("$ kubectl auth can-i --list -n %s --as=%s\n%s", ns, user, out)
			rights, err := parseCanIList(out)
			if err != nil {
				t.Fatal(err)
			}
			var extra []string
			for r := range rights {
				if !baseline[ns][r] {
					extra = append(extra, r)
				}
			}
			expected := append(slices.Clone(want[clusterWide]), want[ns]...)
			slices.Sort(extra)
			slices.Sort(expected)
			if !slices.Equal(extra, expected) {
				t.Errorf("%s in namespace %s holds, beyond every ServiceAccount's rights:\n  %s\nwant exactly:\n  %s\nmore than wanted: %v\nmissing: %v",
					sa, ns, strings.Join(extra, "\n  "), strings.Join(expected, "\n  "), minus(extra, expected), minus(expected, extra))
			}
		}
		// The objects every node trusts, one verb at a time (create has no
		// name: the API server asks RBAC without one, once per resource).
		asked := map[string]bool{}
		for _, o := range trustedObjects {
			for _, verb := range []string{"create", "update", "patch", "delete"} {
				target := o.resource + "/" + o.name
				if verb == "create" {
					target = o.resource
				}
				if asked[verb+" "+target+" "+o.namespace] {
					continue
				}
				asked[verb+" "+target+" "+o.namespace] = true
				args := []string{"auth", "can-i", verb, target, "--as=" + user, "-n", o.namespace}
				if o.namespace == "" {
					// Cluster-scoped: no namespace, or kubectl warns.
					args = append(args[:len(args)-2], "--all-namespaces")
				}
				out, _ := kubectl(args...)
				if strings.TrimSpace(out) != "no" {
					t.Errorf("kubectl %s: %q, want no", strings.Join(args, " "), strings.TrimSpace(out))
				}
			}
		}
	}

	testResourceSlicePolicy(ctx, t, c)
}

// labelled is the object of kubectl's JSON output with the label
// bulkhead.dev/test=rbac added.
func labelled(out string, err error) (string, error) {
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(out), &obj); err != nil {
		return "", err
	}
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		return "", fmt.Errorf("no metadata in %s", out)
	}
	l, _ := meta["labels"].(map[string]any)
	if l == nil {
		l = map[string]any{}
	}
	l["bulkhead.dev/test"] = "rbac"
	meta["labels"] = l
	b, err := json.Marshal(obj)
	return string(b), err
}

func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// testResourceSlicePolicy: the node agent's account writes ResourceSlices
// of driver mig.bulkhead.dev on the node its token is bound to, and no
// other. NodeB runs no DRA plugin (no GPU), so slices made for it here are
// the test's alone; NodeA's are its agent's, published through this very
// policy (10-dra-mig-claims-on-the-gpu-node ran before). Asked three ways:
// impersonating the agent's account with the node-name extra a bound token
// carries, with a real token the API server binds to the agent pod of
// NodeB (kubectl create token --bound-object-kind Pod), and with a token
// bound to no pod.
func testResourceSlicePolicy(ctx context.Context, t *testing.T, c *Cluster) {
	kubectl := func(args ...string) (string, error) { return c.Kubectl(ctx, args...) }
	agent := "system:serviceaccount:" + webhookNamespace + ":bulkhead-node"
	as := func(node string) []string {
		args := []string{"--as=" + agent}
		if node != "" {
			args = append(args, "--as-user-extra=authentication.kubernetes.io/node-name="+node)
		}
		return args
	}
	slice := func(name, node, driver string) string {
		spec := "  nodeName: " + node + "\n"
		if node == "" {
			spec = "  allNodes: true\n"
		}
		return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: %s
spec:
  driver: %s
%s  pool:
    name: bulkhead-rbac-test
    generation: 1
    resourceSliceCount: 1
`, name, driver, spec)
	}
	t.Cleanup(func() {
		_, _ = c.Kubectl(context.Background(), "delete", "resourceslices", "-l", "bulkhead.dev/test=rbac", "--ignore-not-found")
		for _, n := range []string{"rbac-own", "rbac-token", "rbac-other-driver"} {
			_, _ = c.Kubectl(context.Background(), "delete", "resourceslice", n, "--ignore-not-found")
		}
	})
	// The policy's refusals, by what they name.
	const (
		otherNode   = "may write only that node's ResourceSlices"
		otherDriver = "may write only ResourceSlices of driver mig.bulkhead.dev"
		noNode      = "only with a token bound to a pod on a node"
	)
	refused := func(what, why, out string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy '"+resourceSlicePolicy+"'") || !strings.Contains(out, "denied request") ||
			!strings.Contains(out, why) {
			t.Errorf("%s: %v, want the policy's refusal (%s):\n%s", what, err, why, out)
			return
		}
		t.Logf("%s: refused: %s", what, strings.TrimSpace(out))
	}
	allowed := func(what, out string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want it allowed:\n%s", what, err, out)
		}
	}

	// A slice of NodeA, the real one its agent published.
	out, err := kubectl("get", "resourceslices", "--field-selector", "spec.nodeName="+NodeA+",spec.driver=mig.bulkhead.dev", "-o", "jsonpath={.items[0].metadata.name}")
	nodeASlice := strings.TrimSpace(out)
	if err != nil || nodeASlice == "" {
		t.Fatalf("no ResourceSlice of mig.bulkhead.dev on %s (its agent publishes one through the policy): %v: %s", NodeA, err, out)
	}

	// Impersonated, with the extra of a token bound to NodeB.
	out, err = c.KubectlStdin(ctx, slice("rbac-other-node", NodeA, "mig.bulkhead.dev"), append(as(NodeB), "create", "-f", "-")...)
	refused("the agent of "+NodeB+" creates a slice of "+NodeA, otherNode, out, err)
	out, err = kubectl(append(as(NodeB), "delete", "resourceslice", nodeASlice)...)
	refused("the agent of "+NodeB+" deletes "+NodeA+"'s slice "+nodeASlice, otherNode, out, err)
	// An update (PUT: the agent's account may update, not patch) of
	// NodeA's slice, labelled.
	if edited, err := labelled(kubectl("get", "resourceslice", nodeASlice, "-o", "json")); err != nil {
		t.Errorf("get %s: %v", nodeASlice, err)
	} else {
		out, err = c.KubectlStdin(ctx, edited, append(as(NodeB), "replace", "-f", "-")...)
		refused("the agent of "+NodeB+" updates "+NodeA+"'s slice "+nodeASlice, otherNode, out, err)
	}
	out, err = c.KubectlStdin(ctx, slice("rbac-all-nodes", "", "mig.bulkhead.dev"), append(as(NodeB), "create", "-f", "-")...)
	refused("the agent of "+NodeB+" creates a slice of all nodes", otherNode, out, err)
	out, err = c.KubectlStdin(ctx, slice("rbac-driver", NodeB, "gpu.example.com"), append(as(NodeB), "create", "-f", "-")...)
	refused("the agent of "+NodeB+" creates a slice of its node for driver gpu.example.com", otherDriver, out, err)
	out, err = c.KubectlStdin(ctx, slice("rbac-no-node", NodeB, "mig.bulkhead.dev"), append(as(""), "create", "-f", "-")...)
	refused("the agent's account without a node creates a slice of "+NodeB, noNode, out, err)
	// Another driver's slice on NodeB (made by the admin, whom the policy
	// does not match): the agent of NodeB may not delete it.
	out, err = c.KubectlStdin(ctx, slice("rbac-other-driver", NodeB, "gpu.example.com"), "create", "-f", "-")
	allowed("the admin creates a slice of driver gpu.example.com on "+NodeB, out, err)
	out, err = kubectl(append(as(NodeB), "delete", "resourceslice", "rbac-other-driver")...)
	refused("the agent of "+NodeB+" deletes a slice of driver gpu.example.com", otherDriver, out, err)
	// Its own node's slice of its own driver: created, updated, deleted.
	out, err = c.KubectlStdin(ctx, slice("rbac-own", NodeB, "mig.bulkhead.dev"), append(as(NodeB), "create", "-f", "-")...)
	allowed("the agent of "+NodeB+" creates a slice of "+NodeB, out, err)
	if own, err := labelled(kubectl("get", "resourceslice", "rbac-own", "-o", "json")); err != nil {
		t.Errorf("get rbac-own: %v", err)
	} else {
		out, err = c.KubectlStdin(ctx, own, append(as(NodeB), "replace", "-f", "-")...)
		allowed("the agent of "+NodeB+" updates its slice", out, err)
	}
	out, err = kubectl(append(as(NodeB), "delete", "resourceslice", "rbac-own")...)
	allowed("the agent of "+NodeB+" deletes its slice", out, err)

	// Real tokens: one the API server binds to NodeB's agent pod (as the
	// kubelet's projected agent-token is), and one bound to no pod.
	out, err = kubectl("-n", webhookNamespace, "get", "pods", "-l", nodeSelector, "--field-selector", "spec.nodeName="+NodeB, "-o", "jsonpath={.items[0].metadata.name}")
	pod := strings.TrimSpace(out)
	if err != nil || pod == "" {
		t.Fatalf("no node DaemonSet pod on %s: %v: %s", NodeB, err, out)
	}
	for _, tc := range []struct {
		name  string
		bound bool
	}{{"bound", true}, {"unbound", false}} {
		args := []string{"-n", webhookNamespace, "create", "token", "bulkhead-node", "--duration=10m"}
		if tc.bound {
			args = append(args, "--bound-object-kind=Pod", "--bound-object-name="+pod)
		}
		token, err := kubectl(args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v: %s", strings.Join(args, " "), err, token)
		}
		kc, err := c.TokenKubeconfig("rbac-agent-"+tc.name, "bulkhead-node", strings.TrimSpace(token))
		if err != nil {
			t.Fatal(err)
		}
		withToken := func(stdin string, args ...string) (string, error) {
			cmd := exec.CommandContext(ctx, c.bin["kubectl"], args...)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
			cmd.Dir = c.dir
			if stdin != "" {
				cmd.Stdin = strings.NewReader(stdin)
			}
			b, err := cmd.CombinedOutput()
			return string(b), err
		}
		who, err := withToken("", "auth", "whoami")
		t.Logf("$ kubectl auth whoami   (token of bulkhead-node, %s)\n%s", tc.name, who)
		if err != nil {
			t.Errorf("auth whoami with the %s token: %v", tc.name, err)
		}
		names := regexp.MustCompile(`authentication\.kubernetes\.io/node-name\s+\[` + NodeB + `\]`).MatchString(who)
		if tc.bound != names {
			t.Errorf("the %s token's user has the extra node-name [%s]: %v, want %v", tc.name, NodeB, names, tc.bound)
		}
		out, err = withToken(slice("rbac-token", NodeB, "mig.bulkhead.dev"), "create", "-f", "-")
		if tc.bound {
			allowed("a token bound to "+pod+" creates a slice of "+NodeB, out, err)
			out, err = withToken("", "delete", "resourceslice", "rbac-token")
			allowed("a token bound to "+pod+" deletes its slice", out, err)
			out, err = withToken(slice("rbac-token-other", NodeA, "mig.bulkhead.dev"), "create", "-f", "-")
			refused("a token bound to "+pod+" creates a slice of "+NodeA, otherNode, out, err)
		} else {
			refused("a token bound to no pod creates a slice of "+NodeB, noNode, out, err)
		}
	}
	// Nothing of the test's is left, and NodeA's slice is still there.
	if out, err := kubectl("get", "resourceslice", nodeASlice, "-o", "name"); err != nil {
		t.Errorf("%s's slice %s is gone: %v: %s", NodeA, nodeASlice, err, out)
	}
}
