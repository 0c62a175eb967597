package telemetry

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// Event identity: what `kubectl describe pod` shows in its Events table.
const (
	// EventComponent is the events' source component.
	EventComponent = "bulkhead-agent"
	// ReasonRefused is the reason of the Warning event on a refused pod.
	ReasonRefused = "BulkheadRefused"
)

// Pod names the pod an event is about.
type Pod struct {
	Namespace, Name string
	// UID is the pod's metadata.uid (the kubelet's
	// io.kubernetes.pod.uid); "" names the pod by name only.
	UID string
}

// Events records Kubernetes Events on pods the node refused. A nil *Events
// records nothing: the agent runs without an API server to talk to.
type Events struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// NewEvents connects to the API server with the kubeconfig at path, or,
// when path is "", with the pod's in-cluster config if
// KUBERNETES_SERVICE_HOST is set. Without either it returns a nil *Events,
// whose methods do nothing, and no error. node is the node's name, the
// events' source host.
func NewEvents(kubeconfig, node string) (*Events, error) {
	if node == "" {
		return nil, errors.New("telemetry: events: node name is empty")
	}
	cfg, err := RESTConfig(kubeconfig)
	if err != nil || cfg == nil {
		return nil, err
	}
	cfg = rest.AddUserAgent(cfg, EventComponent)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("telemetry: events: %w", err)
	}
	return NewEventsForClient(client, node), nil
}

// NewEventsForClient records events through client, with node as the
// events' source host.
//
// It uses the core/v1 recorder (tools/record), not events.k8s.io/v1's: its
// EventSource names the component and the node as they are, and its
// correlator keys on the message, so two different refusals of one pod are
// two events. (events/v1's recorder sets the instance from os.Hostname and
// folds every event of one pod and reason into a series that keeps the
// first message.) One refusal is one event, within the correlator's limits:
// a refusal repeated word for word raises the count of its event; past
// 10 different refusals of one pod in ten minutes they are combined into
// one event with a count; past a burst of 25 events on one pod (then one
// per five minutes) the rest are dropped.
func NewEventsForClient(client kubernetes.Interface, node string) *Events {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return &Events{
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: EventComponent, Host: node}),
	}
}

// Refused records a Warning event, reason ReasonRefused, on pod, its
// message the refusal's text. It does not wait for the API server: events
// are sent in the background, and dropped, logged, if the server refuses
// them.
func (e *Events) Refused(pod Pod, message string) {
	if e == nil {
		return
	}
	ref := &corev1.ObjectReference{
		APIVersion: "v1",
		Kind:       "Pod",
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		UID:        types.UID(pod.UID),
	}
	e.recorder.Event(ref, corev1.EventTypeWarning, ReasonRefused, message)
}

// Close stops sending events; those not yet sent may be lost.
func (e *Events) Close() {
	if e != nil {
		e.broadcaster.Shutdown()
	}
}
