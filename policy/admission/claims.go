package admission

import (
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
)

// ListerClaims is a ClaimReader over informer caches of resource.k8s.io/v1
// ResourceClaims and ResourceClaimTemplates (for example
// informers.SharedInformerFactory.Resource().V1()). It reads the spec as
// the cache holds it: a template created in the same instant as its pod may
// not be there yet, and the claim is then judged unread (refused below
// trusted), which the pod's controller retries.
type ListerClaims struct {
	// Claims lists ResourceClaims; required.
	Claims resourcelisters.ResourceClaimLister
	// Templates lists ResourceClaimTemplates; required.
	Templates resourcelisters.ResourceClaimTemplateLister
}

// ClaimSpec implements ClaimReader.
func (l ListerClaims) ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error) {
	if l.Claims == nil || l.Templates == nil {
		return nil, errors.New("admission: ListerClaims needs both listers")
	}
	if template {
		t, err := l.Templates.ResourceClaimTemplates(namespace).Get(name)
		if err != nil {
			return nil, fmt.Errorf("ResourceClaimTemplate %s/%s: %w", namespace, name, err)
		}
		return &t.Spec.Spec, nil
	}
	c, err := l.Claims.ResourceClaims(namespace).Get(name)
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return &c.Spec, nil
}
