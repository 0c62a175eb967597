package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/containerd/log"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

// The cluster watch keeps the fence's remote pods (netpol.Manager.SetRemote)
// equal to the API server's view of the pods of other nodes, so that a pod
// of the same tenant on another node is that tenant's, not an unknown
// cluster address (issue 26).
//
//   - Which pods: every pod not on this node (field selector spec.nodeName
//     and spec.hostNetwork, checked again here), not Succeeded or Failed,
//     not being deleted, with addresses in status.podIPs, both families. A
//     Pending pod with addresses is included: its init containers already
//     use the network.
//   - A pod being deleted (deletionTimestamp set) loses its addresses at
//     once, not when it is gone: its node frees them when the pod stops,
//     which may be before the API server removes the pod, and a new pod may
//     have one before this node hears of it. Removing them when the deletion
//     starts closes that window, at the price of the pod's cross-node
//     traffic during its grace period (unknown addresses: dropped).
//   - Which tenant: the loaded policy's, asked per namespace
//     (policy.NamespaceTenants), never a rule restated here. A namespace of
//     no tenant maps its pods to nothing.
//   - An address two pods claim with different tenants (a lagging status)
//     maps to nothing: an address never keeps an old tenant, it is unknown
//     for a moment instead.
//   - Until the first full list is in the fence, nothing is mapped: the
//     watch starts by clearing what an earlier agent left (an address may
//     have been reused while no agent watched). An address the fence does not
//     know is dropped for every tier (netpol rule 14). While the API server
//     is lost, the entries stay as last seen (existing flows keep their
//     verdicts) and new addresses are unknown; ClusterSync says so.
//
// Every event marks the view dirty; one loop recomputes the wanted set from
// the informer's store and writes the difference (UpsertRemote,
// DeleteRemote), and rewrites the whole set (SetRemote) after the first
// sync, every clusterResync and when the policy changes.

// clusterResync is how often the whole set is written again: it repairs an
// entry a pod of this node took over and then left (netpol: a local pod
// wins), and retries what failed.
const clusterResync = 30 * time.Second

// policyPoll is how often the watch looks for a new policy, which may move
// a namespace to another tenant.
const policyPoll = time.Second

// remoteFence is the part of the fence the cluster watch keeps:
// *netpol.Manager.
type remoteFence interface {
	SetRemote(ctx context.Context, pods []netpol.RemotePod) error
	UpsertRemote(ctx context.Context, pod netpol.RemotePod) error
	DeleteRemote(ctx context.Context, addr netip.Addr) error
}

// tenantResolver maps namespaces to tenants: *policy.NamespaceTenants.
type tenantResolver interface {
	Tenant(ctx context.Context, namespace string) (string, error)
	Refresh() bool
}

// ClusterSync is what the agent knows of the other nodes' pods (the node
// status reports it).
type ClusterSync = node.ClusterSync

// clusterWatch keeps the fence's remote pods from a Pod informer.
type clusterWatch struct {
	node     string
	fence    remoteFence
	tenants  tenantResolver
	informer cache.SharedIndexInformer
	// dirty asks the loop for a pass; it holds at most one request.
	dirty chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// applied is what this watch last wrote to the fence, by address.
	applied     map[netip.Addr]netpol.RemotePod
	synced      bool
	connected   bool
	lastContact time.Time
	lastApplied time.Time
	lastErr     error
}

// newClusterWatch watches client's pods of nodes other than node.
func newClusterWatch(client kubernetes.Interface, node string, fence remoteFence, tenants tenantResolver) *clusterWatch {
	w := &clusterWatch{node: node, fence: fence, tenants: tenants, dirty: make(chan struct{}, 1), applied: map[netip.Addr]netpol.RemotePod{}}
	sel := fields.AndSelectors(
		fields.OneTermNotEqualSelector("spec.nodeName", node),
		fields.OneTermEqualSelector("spec.hostNetwork", "false"),
	).String()
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			o.FieldSelector = sel
			l, err := pods.List(ctx, o)
			w.contact(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			wi, err := pods.Watch(ctx, o)
			w.contact(err)
			return wi, err
		},
	}
	w.informer = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), &corev1.Pod{},
		cache.SharedIndexInformerOptions{ObjectDescription: "pods of other nodes"})
	_ = w.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		w.contact(fmt.Errorf("watch pods: %w", err))
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	mark := func(any) { w.contact(nil); w.markDirty() }
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, obj any) { mark(obj) },
		DeleteFunc: mark,
	})
	return w
}

// startCluster starts the cluster watch when the agent reaches an API
// server (agent.kubeconfig, or in-cluster) and holds a fence and a policy
// engine; otherwise it does nothing and the fence knows no remote pod.
func (a *Agent) startCluster(ctx context.Context) {
	fence := a.pipeline.Node().Fence()
	if fence == nil || a.engine == nil {
		return
	}
	cfg, err := telemetry.RESTConfig(a.cfg.Agent.Kubeconfig)
	if err != nil {
		log.G(ctx).WithError(err).Warn("the fence learns no pod of another node: the API server is not reachable as agent.kubeconfig says")
		return
	}
	if cfg == nil {
		return
	}
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(cfg, telemetry.EventComponent))
	if err != nil {
		log.G(ctx).WithError(err).Warn("the fence learns no pod of another node")
		return
	}
	w := newClusterWatch(client, nodeName(a.cfg.Agent.NodeName), fence, policy.NewNamespaceTenants(a.engine))
	a.cluster = w
	go w.run(ctx)
}

// ClusterSync reports the cluster watch; Watching is false without one.
func (a *Agent) ClusterSync() ClusterSync {
	if a.cluster == nil {
		return ClusterSync{}
	}
	return a.cluster.status()
}

// nodeName is this node's name: agent.node_name, else $NODE_NAME (the
// DaemonSet sets it from spec.nodeName), else the host name.
func nodeName(configured string) string {
	if configured != "" {
		return configured
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

func (w *clusterWatch) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// contact records an answer of the API server, or its failure.
func (w *clusterWatch) contact(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.connected = err == nil
	if err == nil {
		w.lastContact = time.Now()
		return
	}
	w.lastErr = err
}

// Synced reports whether the first full list of pods is in the fence.
func (w *clusterWatch) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced
}

func (w *clusterWatch) status() ClusterSync {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := ClusterSync{Watching: true, Synced: w.synced, Connected: w.connected, LastContact: w.lastContact,
		LastApplied: w.lastApplied, RemoteAddresses: len(w.applied)}
	if w.lastErr != nil {
		s.LastError = w.lastErr.Error()
	}
	return s
}

// run keeps the fence until ctx ends.
func (w *clusterWatch) run(ctx context.Context) {
	// Entries an earlier agent left may name an address reused since:
	// none is trusted until this watch has listed the pods.
	for {
		err := w.fence.SetRemote(ctx, nil)
		if err == nil {
			break
		}
		w.failed(ctx, fmt.Errorf("clearing the remote pods of an earlier agent: %w", err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	go w.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		return
	}
	w.tenants.Refresh()
	resync := time.NewTicker(clusterResync)
	defer resync.Stop()
	poll := time.NewTicker(policyPoll)
	defer poll.Stop()
	full := true
	for {
		if err := w.apply(ctx, full); err != nil {
			w.failed(ctx, err)
		}
		full = false
	wait:
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.dirty:
				break wait
			case <-resync.C:
				full = true
				break wait
			case <-poll.C:
				if w.tenants.Refresh() {
					full = true
					break wait
				}
			}
		}
	}
}

func (w *clusterWatch) failed(ctx context.Context, err error) {
	log.G(ctx).WithError(err).Warn("cluster watch: the fence's remote pods")
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

// apply writes the informer's view to the fence: all of it when full, else
// what changed since the last pass. An address the fence refuses
// (netpol.ErrAddressHeld: a pod of this node has it) counts as applied and
// is tried again at the next full pass.
func (w *clusterWatch) apply(ctx context.Context, full bool) error {
	want, err := w.wanted(ctx)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	held := func(err error) bool {
		if errors.Is(err, netpol.ErrAddressHeld) {
			log.G(ctx).WithError(err).Debug("cluster watch: a remote pod's address is held on this node")
			return true
		}
		return false
	}
	w.mu.Lock()
	applied := maps.Clone(w.applied)
	w.mu.Unlock()
	if full {
		pods := slices.SortedFunc(maps.Values(want), func(a, b netpol.RemotePod) int { return a.Addr.Compare(b.Addr) })
		if err := w.fence.SetRemote(ctx, pods); err != nil && !held(err) {
			return errors.Join(append(errs, err)...)
		}
		applied = want
	} else {
		for _, a := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
			p := want[a]
			if cur, ok := applied[a]; ok && cur == p {
				continue
			}
			if err := w.fence.UpsertRemote(ctx, p); err != nil && !held(err) {
				errs = append(errs, err)
				continue
			}
			applied[a] = p
		}
		for a := range applied {
			if _, ok := want[a]; ok {
				continue
			}
			if err := w.fence.DeleteRemote(ctx, a); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(applied, a)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applied = applied
	// Synced once a full pass is in the fence: a pod whose tenant could not
	// be resolved is unknown there (fail closed) and named in the error.
	w.synced = w.synced || full
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	w.lastApplied = time.Now()
	return nil
}

// wanted is the set of remote pods the informer's store describes. A pod
// whose tenant cannot be resolved maps to nothing and makes the error.
func (w *clusterWatch) wanted(ctx context.Context) (map[netip.Addr]netpol.RemotePod, error) {
	claims := map[netip.Addr][]string{}
	var errs []error
	for _, obj := range w.informer.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !w.remote(pod) {
			continue
		}
		addrs := podAddrs(pod)
		if len(addrs) == 0 {
			continue
		}
		tenant, err := w.tenants.Tenant(ctx, pod.Namespace)
		if err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err))
			tenant = ""
		}
		for _, a := range addrs {
			claims[a] = append(claims[a], tenant)
		}
	}
	want := make(map[netip.Addr]netpol.RemotePod, len(claims))
	for a, cs := range claims {
		if t := owner(cs); t != "" {
			want[a] = netpol.RemotePod{Addr: a, Tenant: t}
		}
	}
	return want, errors.Join(errs...)
}

// owner is the tenant of an address the pods of tenants claim: theirs
// when they agree; else "".
func owner(tenants []string) string {
	for _, t := range tenants[1:] {
		if t != tenants[0] {
			return ""
		}
	}
	return tenants[0]
}

// remote reports whether pod is one the fence should learn: on another
// node, in the pod network, not being deleted, not finished.
func (w *clusterWatch) remote(pod *corev1.Pod) bool {
	if pod.Spec.NodeName == w.node || pod.Spec.HostNetwork || pod.DeletionTimestamp != nil {
		return false
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// podAddrs are the pod's addresses (status.podIPs, else status.podIP).
func podAddrs(pod *corev1.Pod) []netip.Addr {
	ips := make([]string, 0, 2)
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = append(ips, pod.Status.PodIP)
	}
	var out []netip.Addr
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
