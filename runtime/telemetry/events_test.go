package telemetry

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

// eventsOn polls until ns holds want events (the broadcaster sends in the
// background) and returns them.
func eventsOn(t *testing.T, client *fake.Clientset, ns string, want int) []corev1.Event {
	t.Helper()
	var got []corev1.Event
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) {
			l, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			got = l.Items
			return len(got) >= want, nil
		})
	if err != nil {
		t.Fatalf("%d events in %s, want %d: %v", len(got), ns, want, err)
	}
	return got
}

func TestRefused(t *testing.T) {
	client := fake.NewClientset()
	e := NewEventsForClient(client, "node-7")
	defer e.Close()
	pod := Pod{Namespace: "team-a", Name: "trainer-0", UID: "0f3c5a9e-1111-4222-8333-944445555666"}
	msgs := []string{
		"bulkhead refused pod team-a/trainer-0 (tenant acme): [gpu.profile] profile 7g.141gb is not allowed",
		"bulkhead refused pod team-a/trainer-0 (tenant acme): [quota.memory] over the tenant's memory",
	}
	for _, msg := range msgs {
		e.Refused(pod, msg)
	}
	got := eventsOn(t, client, "team-a", len(msgs))
	if len(got) != len(msgs) {
		t.Fatalf("%d events, want one per refusal (%d): %+v", len(got), len(msgs), got)
	}
	seen := map[string]bool{}
	for _, ev := range got {
		o := ev.InvolvedObject
		if o.Kind != "Pod" || o.APIVersion != "v1" || o.Namespace != pod.Namespace || o.Name != pod.Name || string(o.UID) != pod.UID {
			t.Errorf("involvedObject %+v, want pod %+v", o, pod)
		}
		if ev.Type != corev1.EventTypeWarning || ev.Reason != ReasonRefused {
			t.Errorf("type %q reason %q, want Warning %s", ev.Type, ev.Reason, ReasonRefused)
		}
		if ev.Source.Component != EventComponent || ev.Source.Host != "node-7" {
			t.Errorf("source %+v, want %s on node-7", ev.Source, EventComponent)
		}
		if ev.Count != 1 {
			t.Errorf("count %d, want 1", ev.Count)
		}
		seen[ev.Message] = true
	}
	for _, msg := range msgs {
		if !seen[msg] {
			t.Errorf("no event with message %q", msg)
		}
	}
}

func TestNewEvents(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	e, err := NewEvents("", "node-7")
	if err != nil || e != nil {
		t.Fatalf("NewEvents without a kubeconfig or a cluster: %v, %v; want nil, nil", e, err)
	}
	e.Refused(Pod{Namespace: "ns", Name: "p"}, "refused") // a nil *Events does nothing
	e.Close()

	if _, err := NewEvents("", ""); err == nil {
		t.Error("NewEvents without a node name succeeded")
	}
	missing := filepath.Join(t.TempDir(), "kubeconfig")
	if _, err := NewEvents(missing, "node-7"); err == nil {
		t.Errorf("NewEvents with a missing kubeconfig %s succeeded", missing)
	}

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	err = os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	e, err = NewEvents(kubeconfig, "node-7")
	if err != nil || e == nil {
		t.Fatalf("NewEvents(%s): %v, %v; want a recorder", kubeconfig, e, err)
	}
	e.Close()
}
