package admission

import (
	"context"
	"fmt"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// TestDecisionSeriesAreBounded: requests of 5,000 made-up kinds add one
// "other" series per result, not one series per kind; the reviewed kinds
// keep their names.
func TestDecisionSeriesAreBounded(t *testing.T) {
	m := NewMetrics()
	rev, err := NewReviewer(Options{Decider: staticDecider{decision: policy.Decision{Allow: true}}, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	requests := []*admissionv1.AdmissionRequest{}
	for i := range 5000 {
		requests = append(requests, &admissionv1.AdmissionRequest{
			UID:       types.UID(fmt.Sprintf("uid-%d", i)),
			Kind:      metav1.GroupVersionKind{Group: "example.com", Version: "v1", Kind: fmt.Sprintf("MadeUp%d", i)},
			Operation: admissionv1.Create,
			Namespace: "agents",
		})
	}
	// DELETE is allowed without a look at the object: a made-up kind is
	// then "allowed", every CREATE of one an "error".
	for i := range 100 {
		requests = append(requests, &admissionv1.AdmissionRequest{
			UID:       types.UID(fmt.Sprintf("del-%d", i)),
			Kind:      metav1.GroupVersionKind{Group: "example.com", Version: "v1", Kind: fmt.Sprintf("Gone%d", i)},
			Operation: admissionv1.Delete,
		})
	}
	for _, k := range append(SupportedKinds(), ClaimKinds()...) {
		requests = append(requests, &admissionv1.AdmissionRequest{
			UID:       "uid-" + types.UID(k.Kind),
			Kind:      metav1.GroupVersionKind{Group: k.Group, Version: k.Version, Kind: k.Kind},
			Operation: admissionv1.Delete,
		})
	}
	for _, req := range requests {
		rev.Review(ctx, req)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "bulkhead_webhook_decisions_total" {
			continue
		}
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got[labels["result"]+"/"+labels["kind"]] = metric.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"error/" + KindOther: 5000, "allowed/" + KindOther: 100}
	for _, k := range append(SupportedKinds(), ClaimKinds()...) {
		want["allowed/"+k.Kind] = 1
	}
	if len(got) != len(want) {
		t.Errorf("%d decision series, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("decisions{result/kind=%s} = %v, want %v", k, got[k], v)
		}
	}
}
