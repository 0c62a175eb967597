package admission

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
)

// TestListerClaimsReadsClaimsAndTemplates: the informer-backed reader finds
// a template's and a claim's spec in their namespace, and nothing else.
func TestListerClaimsReadsClaimsAndTemplates(t *testing.T) {
	claims := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	templates := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	_ = templates.Add(&resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "all-gpus", Namespace: "agents"},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: *exactly("gpu.nvidia.com", resourcev1.DeviceAllocationModeAll, 0)},
	})
	_ = claims.Add(&resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "agents"},
		Spec:       *exactly("nic.example.com", resourcev1.DeviceAllocationModeExactCount, 2),
	})
	r := ListerClaims{Claims: resourcelisters.NewResourceClaimLister(claims), Templates: resourcelisters.NewResourceClaimTemplateLister(templates)}
	tests := []struct {
		ns, name string
		template bool
		class    string
		err      string
	}{
		{ns: "agents", name: "all-gpus", template: true, class: "gpu.nvidia.com"},
		{ns: "agents", name: "shared", class: "nic.example.com"},
		{ns: "research", name: "all-gpus", template: true, err: "ResourceClaimTemplate research/all-gpus"},
		{ns: "agents", name: "all-gpus", err: "ResourceClaim agents/all-gpus"},
	}
	for _, tt := range tests {
		spec, err := r.ClaimSpec(tt.ns, tt.name, tt.template)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s/%s: err = %v, want %q", tt.ns, tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || spec.Devices.Requests[0].Exactly.DeviceClassName != tt.class {
			t.Errorf("%s/%s: spec %+v, err %v; want class %s", tt.ns, tt.name, spec, err, tt.class)
		}
	}
	if _, err := (ListerClaims{}).ClaimSpec("a", "b", true); err == nil {
		t.Error("a ListerClaims without listers read a claim")
	}
}
