package admission

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

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

// TestCertificateExpiry: the expiry gauge is the notAfter of the pair the
// webhook serves, follows a rotated Secret at the next scrape, and stays
// on the served certificate when the new files do not load.
func TestCertificateExpiry(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	first := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)
	ca.issueUntil(t, dir, 100, first)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics()
	m.WatchCertificate(certs)
	renewed := first.Add(90 * 24 * time.Hour)
	for _, step := range []struct {
		name   string
		rotate func()
		want   time.Time
	}{
		{name: "loaded", rotate: func() {}, want: first},
		{name: "rotated", rotate: func() { ca.issueUntil(t, dir, 101, renewed) }, want: renewed},
		{name: "broken key keeps the served certificate", rotate: func() {
			ca.issueUntil(t, dir, 102, renewed.Add(time.Hour))
			if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, want: renewed},
		{name: "expired certificate", rotate: func() { ca.issueUntil(t, dir, 103, first.Add(-60*24*time.Hour)) }, want: first.Add(-60 * 24 * time.Hour)},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.rotate()
			got := gatherGauge(t, m, "bulkhead_webhook_certificate_expiry_timestamp_seconds")
			if want := float64(step.want.Unix()); got != want {
				t.Errorf("expiry = %v, want %v (%s)", time.Unix(int64(got), 0).UTC(), step.want.UTC(), step.name)
			}
			if !certs.NotAfter().Equal(step.want) {
				t.Errorf("NotAfter() = %v, want %v", certs.NotAfter(), step.want)
			}
		})
	}
}

// gatherGauge is the value of the one series of the gauge name.
func gatherGauge(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			if len(f.GetMetric()) != 1 {
				t.Fatalf("%s: %d series, want 1", name, len(f.GetMetric()))
			}
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s is not registered", name)
	return 0
}
