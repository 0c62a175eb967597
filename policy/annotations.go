package policy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Pod annotations under bulkhead.dev/ are requests to Bulkhead, never
// identity. The node (runtime) and the admission webhook parse them with
// ParseAnnotations, so both read a pod the same way.
const (
	// RequestAnnotationPrefix marks the annotations that are requests.
	RequestAnnotationPrefix = "bulkhead.dev/"
	// AnnotationGPUProfile names a MIG profile such as "1g.18gb", or ProfileWhole.
	AnnotationGPUProfile = RequestAnnotationPrefix + "gpu-profile"
	// AnnotationGPUCount is the number of slices (or whole GPUs); default 1.
	AnnotationGPUCount = RequestAnnotationPrefix + "gpu-count"
	// AnnotationRDMA asks for the tenant's own RDMA VF ("true"/"false").
	AnnotationRDMA = RequestAnnotationPrefix + "rdma"
	// ProfileWhole asks for an entire GPU.
	ProfileWhole = "whole"
	// MaxGPUCount bounds AnnotationGPUCount.
	MaxGPUCount = 64
)

var profilePattern = regexp.MustCompile(`^(` + regexp.QuoteMeta(ProfileWhole) + `|[1-8]g\.[0-9]+gb(\+[a-z0-9]+)?(\.[a-z0-9-]+)?)$`)

// AnnotationRequest is what a pod asks for through its annotations. A zero
// field means the annotation is absent.
type AnnotationRequest struct {
	// Profile is the GPU profile, or "" when the pod names none.
	Profile string
	// Count is the GPU count, or 0 when the pod names none.
	Count int
	// RDMA is the RDMA request; HasRDMA says whether the annotation is set.
	RDMA, HasRDMA bool
}

// ParseAnnotations reads the bulkhead.dev/ requests of a pod. Each error
// names the annotation and the rule it breaks.
func ParseAnnotations(annotations map[string]string) (AnnotationRequest, error) {
	var r AnnotationRequest
	if text, ok := annotations[AnnotationGPUCount]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(text))
		if err != nil || n < 1 || n > MaxGPUCount {
			return r, fmt.Errorf("annotation %s: must be an integer from 1 to %d, got %q", AnnotationGPUCount, MaxGPUCount, text)
		}
		r.Count = n
	}
	if text, ok := annotations[AnnotationGPUProfile]; ok {
		p := strings.TrimSpace(text)
		if !profilePattern.MatchString(p) {
			return r, fmt.Errorf("annotation %s: must be %q or a MIG profile such as \"1g.18gb\", got %q", AnnotationGPUProfile, ProfileWhole, text)
		}
		r.Profile = p
	}
	if text, ok := annotations[AnnotationRDMA]; ok {
		b, err := strconv.ParseBool(strings.TrimSpace(text))
		if err != nil {
			return r, fmt.Errorf("annotation %s: must be \"true\" or \"false\", got %q", AnnotationRDMA, text)
		}
		r.RDMA, r.HasRDMA = b, true
	}
	return r, nil
}

// IsGPUProfile reports whether p is ProfileWhole or has the shape of a MIG
// profile name ("1g.18gb", "1g.18gb+me", "1g.35gb.2x").
func IsGPUProfile(p string) bool { return profilePattern.MatchString(p) }
