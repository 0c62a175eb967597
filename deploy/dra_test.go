package deploy

import (
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// TestDeviceClassIsMIGDRAs: the DeviceClass deployed is the one mig/dra
// describes, so a claim on it selects exactly the plugin's devices.
func TestDeviceClassIsMIGDRAs(t *testing.T) {
	tr := loadTree(t)
	want := migdra.DeviceClass()
	got := mustFind[*resourcev1.DeviceClass](t, tr, want.Name)
	if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
		t.Errorf("deploy/node/deviceclass.yaml spec %+v, want mig/dra's %+v", got.Spec, want.Spec)
	}
}

// TestAgentMayRunTheKubeletPlugin: the node agent's ClusterRole grants
// what the kubelet plugin helper (ResourceSlices, the claims it prepares,
// the Node that owns the slices) and the plugin itself (the claim's pod
// and its RuntimeClass) call.
func TestAgentMayRunTheKubeletPlugin(t *testing.T) {
	tr := loadTree(t)
	crb := mustFind[*rbacv1.ClusterRoleBinding](t, tr, "bulkhead-agent")
	role := mustFind[*rbacv1.ClusterRole](t, tr, crb.RoleRef.Name)
	for _, need := range []struct{ group, resource, verb string }{
		{"resource.k8s.io", "resourceslices", "get"},
		{"resource.k8s.io", "resourceslices", "list"},
		{"resource.k8s.io", "resourceslices", "watch"},
		{"resource.k8s.io", "resourceslices", "create"},
		{"resource.k8s.io", "resourceslices", "update"},
		{"resource.k8s.io", "resourceslices", "delete"},
		{"resource.k8s.io", "resourceclaims", "get"},
		{"", "nodes", "get"},
		{"", "pods", "get"},
		{"node.k8s.io", "runtimeclasses", "get"},
	} {
		if !allows(role.Rules, need.group, need.resource, need.verb) {
			t.Errorf("ClusterRole %s does not allow %s %s.%s", role.Name, need.verb, need.resource, need.group)
		}
	}
}
