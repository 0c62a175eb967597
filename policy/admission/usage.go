package admission

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// wholeGPUSlices is the number of compute slices a whole GPU counts for, as
// in the default bundle (rego/gpu.rego).
const wholeGPUSlices = 7

// ErrNotSynced is returned by PodUsage.Snapshot before the pod informer has
// listed the cluster's pods once.
var ErrNotSynced = errors.New("pod informer has not synced yet")

// PodUsage keeps, per namespace, what the cluster's live pods hold: one
// sandbox each, their GPU compute slices and their memory limits. It is fed
// by a pod informer's events and read by Reviewer through Snapshot.
// Pods that have finished (Succeeded, Failed) hold nothing.
type PodUsage struct {
	synced func() bool

	// mu guards pods and namespaces: each live pod's charge and the sum of
	// the charges per namespace.
	mu         sync.RWMutex
	pods       map[types.UID]charge
	namespaces map[string]policy.Usage
}

type charge struct {
	namespace, name string
	usage           policy.Usage
}

// NewPodUsage registers on informer (a Pod informer) and counts its pods.
// The informer must be started by the caller.
func NewPodUsage(informer cache.SharedIndexInformer) (*PodUsage, error) {
	u := &PodUsage{pods: map[types.UID]charge{}, namespaces: map[string]policy.Usage{}}
	reg, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { u.set(obj) },
		UpdateFunc: func(_, obj any) { u.set(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				u.remove(p.UID)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("admission: registering on the pod informer: %w", err)
	}
	u.synced = reg.HasSynced
	return u, nil
}

// Synced reports whether the informer's initial list has been counted.
func (u *PodUsage) Synced() bool { return u.synced() }

// Snapshot implements UsageSource.
func (u *PodUsage) Snapshot(exclude types.UID) (map[string]policy.Usage, error) {
	if !u.synced() {
		return nil, ErrNotSynced
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	out := make(map[string]policy.Usage, len(u.namespaces))
	for ns, usage := range u.namespaces {
		out[ns] = usage
	}
	if c, ok := u.pods[exclude]; ok && exclude != "" {
		out[c.namespace] = sub(out[c.namespace], c.usage)
	}
	return out, nil
}

// live returns every live pod's charge by UID, for the quota ledger.
func (u *PodUsage) live() (map[types.UID]charge, error) {
	if !u.synced() {
		return nil, ErrNotSynced
	}
	u.mu.RLock()
	defer u.mu.RUnlock()
	out := make(map[types.UID]charge, len(u.pods))
	for uid, c := range u.pods {
		out[uid] = c
	}
	return out, nil
}

func (u *PodUsage) set(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		u.remove(p.UID)
		return
	}
	c := charge{namespace: p.Namespace, name: p.Name, usage: chargeOf(p)}
	u.mu.Lock()
	defer u.mu.Unlock()
	if old, ok := u.pods[p.UID]; ok {
		// A live pod's charge never shrinks (update.go): a resize to less
		// is counted as held until the pod ends.
		c.usage = maxUsage(c.usage, old.usage)
		u.namespaces[old.namespace] = sub(u.namespaces[old.namespace], old.usage)
	}
	u.pods[p.UID] = c
	u.namespaces[c.namespace] = add(u.namespaces[c.namespace], c.usage)
}

func (u *PodUsage) remove(uid types.UID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old, ok := u.pods[uid]
	if !ok {
		return
	}
	delete(u.pods, uid)
	left := sub(u.namespaces[old.namespace], old.usage)
	if left == (policy.Usage{}) {
		delete(u.namespaces, old.namespace)
		return
	}
	u.namespaces[old.namespace] = left
}

// chargeOf is what a live pod holds. A pod whose annotations no longer
// parse (admitted before the webhook) is charged a whole GPU per
// nvidia.com/gpu limit, the most it could hold.
func chargeOf(p *corev1.Pod) policy.Usage {
	c := policy.Usage{Sandboxes: 1}
	req, err := requestOf(p.Annotations, p.Spec)
	if err != nil {
		c.MemoryBytes = podMemoryLimit(p.Spec)
		c.GPUSlices = int(effectiveLimit(p.Spec, func(c corev1.Container) int64 {
			if q, ok := limitsOf(c)[resourceGPU]; ok {
				return q.Value()
			}
			return 0
		})) * wholeGPUSlices
		return c
	}
	c.MemoryBytes = req.MemoryBytes
	if req.GPU != nil {
		c.GPUSlices = req.GPU.Count * profileSlices(req.GPU.Profile)
	}
	return c
}

// profileSlices is the number of compute slices one unit of profile uses:
// 7 for a whole GPU, N for an "Ng.*" MIG profile.
func profileSlices(profile string) int {
	if profile == policy.ProfileWhole {
		return wholeGPUSlices
	}
	n, err := strconv.Atoi(profile[:1])
	if err != nil || n < 1 {
		return wholeGPUSlices
	}
	return n
}

func add(a, b policy.Usage) policy.Usage {
	return policy.Usage{Sandboxes: a.Sandboxes + b.Sandboxes, GPUSlices: a.GPUSlices + b.GPUSlices, MemoryBytes: a.MemoryBytes + b.MemoryBytes}
}

func sub(a, b policy.Usage) policy.Usage {
	return policy.Usage{Sandboxes: a.Sandboxes - b.Sandboxes, GPUSlices: a.GPUSlices - b.GPUSlices, MemoryBytes: a.MemoryBytes - b.MemoryBytes}
}

// RuntimeClassHandlers resolves RuntimeClass names through a lister. A
// RuntimeClass the lister does not know resolves to its own name, which is
// what the kubelet would pass as handler for Bulkhead's "bulkhead" class.
type RuntimeClassHandlers struct {
	Lister nodev1listers.RuntimeClassLister
}

// Handler implements HandlerResolver.
func (h RuntimeClassHandlers) Handler(name string) (string, error) {
	rc, err := h.Lister.Get(name)
	switch {
	case apierrors.IsNotFound(err):
		return name, nil
	case err != nil:
		return "", fmt.Errorf("looking up RuntimeClass: %w", err)
	case rc.Handler == "":
		return "", fmt.Errorf("RuntimeClass %q has no handler", name)
	}
	return rc.Handler, nil
}

// Cluster holds the informers the webhook reads: pods for usage and
// RuntimeClasses for handlers.
type Cluster struct {
	factory informers.SharedInformerFactory
	// Pods is the pod informer Usage counts from.
	Pods     cache.SharedIndexInformer
	Usage    *PodUsage
	Handlers RuntimeClassHandlers
	// Claims reads the DRA claims and claim templates pods name, so that
	// what a claim asks for is judged, not refused or admitted unread.
	Claims ListerClaims
	synced []cache.InformerSynced
}

// NewCluster prepares informers on client; Start runs them.
func NewCluster(client kubernetes.Interface) (*Cluster, error) {
	if client == nil {
		return nil, errors.New("admission: NewCluster: client is required")
	}
	f := informers.NewSharedInformerFactory(client, 0)
	pods := f.Core().V1().Pods().Informer()
	if err := pods.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("admission: pod informer: %w", err)
	}
	rcs := f.Node().V1().RuntimeClasses()
	claims, templates := f.Resource().V1().ResourceClaims(), f.Resource().V1().ResourceClaimTemplates()
	usage, err := NewPodUsage(pods)
	if err != nil {
		return nil, err
	}
	return &Cluster{
		factory:  f,
		Pods:     pods,
		Usage:    usage,
		Handlers: RuntimeClassHandlers{Lister: rcs.Lister()},
		Claims:   ListerClaims{Claims: claims.Lister(), Templates: templates.Lister()},
		synced:   []cache.InformerSynced{usage.Synced, rcs.Informer().HasSynced, claims.Informer().HasSynced, templates.Informer().HasSynced},
	}, nil
}

// trimPod keeps only what chargeOf reads, so the cache of a large cluster's
// pods stays small.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{}
	out.Name, out.Namespace, out.UID = p.Name, p.Namespace, p.UID
	out.ResourceVersion = p.ResourceVersion
	for k, v := range p.Annotations {
		if strings.HasPrefix(k, policy.RequestAnnotationPrefix) {
			if out.Annotations == nil {
				out.Annotations = map[string]string{}
			}
			out.Annotations[k] = v
		}
	}
	out.Status.Phase = p.Status.Phase
	trim := func(cs []corev1.Container) []corev1.Container {
		out := make([]corev1.Container, len(cs))
		for i, c := range cs {
			out[i] = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy}
		}
		return out
	}
	out.Spec.Resources = p.Spec.Resources // the pod-level limit, which requestOf charges
	out.Spec.Containers = trim(p.Spec.Containers)
	out.Spec.InitContainers = trim(p.Spec.InitContainers)
	return out, nil
}

// Start runs the informers until ctx ends and waits for their first sync.
func (c *Cluster) Start(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("admission: informers did not sync: %w", context.Cause(ctx))
	}
	return nil
}

// Ready fails until every informer has synced.
func (c *Cluster) Ready() error {
	for _, s := range c.synced {
		if !s() {
			return ErrNotSynced
		}
	}
	return nil
}
