package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/containerd/log"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
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
// cluster address (issue 26), gives a Service's ClusterIPs the tenant of
// its namespace when every backend is a pod of that tenant, and puts the
// other nodes' addresses in the cluster (netpol.Manager.SetRemoteNodes).
//
//   - Which pods: every pod not on this node (the informer sees the pods of
//     every node, field selector spec.hostNetwork=false, checked again
//     here), not Succeeded or Failed, not being deleted, with addresses in
//     status.podIPs, both families. A Pending pod with addresses is
//     included: its init containers already use the network. The pods of
//     this node are the shims' to register; the watch reads them only to
//     judge Services.
//   - A pod being deleted (deletionTimestamp set) loses its addresses at
//     once, not when it is gone: its node frees them when the pod stops,
//     which may be before the API server removes the pod, and a new pod may
//     have one before this node hears of it. Removing them when the deletion
//     starts closes that window, at the price of the pod's cross-node
//     traffic during its grace period (unknown addresses: dropped).
//   - Which ClusterIPs: spec.clusterIPs of every Service, both families
//     (headless "None", ExternalName and empty skipped), get the tenant T of
//     the Service's namespace only if every endpoint address of every
//     EndpointSlice of the Service (label kubernetes.io/service-name) is the
//     address of a known pod of T: a pod of any node, this one's included,
//     not finished, whose addresses no pod of another tenant claims. A pod
//     being deleted still counts: it serves until it stops, and a new pod
//     that takes its address claims it too, which ends the ownership. A
//     Service with no endpoint address is T's (nothing is reachable
//     through it). Any other endpoint (an address of no pod, as a
//     selectorless Service's hand-written slice may hold; a pod of another
//     tenant or of none; an FQDN) leaves the ClusterIP unknown: rule 14
//     drops it unless a tier lists it as a shared service. The sending
//     pod's fence is the only one that sees a ClusterIP (it runs before
//     kube-proxy's DNAT), and the only check at all when the backend is
//     not a fenced pod; a fenced backend judges the sender's own address
//     again after the DNAT.
//   - Which tenant: the loaded policy's, asked per namespace
//     (policy.NamespaceTenants), never a rule restated here. A namespace of
//     no tenant maps its pods and Services to nothing.
//   - Which node addresses: status.addresses of type InternalIP and
//     ExternalIP of every node but this one, both families; one that
//     cannot be another node's (loopback, link-local) is skipped. They are
//     in the cluster and no tenant's (netpol rule 14): a host-network pod
//     of that node, a NodePort masqueraded there or its kubelet reaches a
//     pod from them, from any tenant, so only a tier that lists them as
//     shared services exchanges packets with them. Without them a node
//     address outside cluster_cidrs would be outside the cluster and pass
//     for every pod without an egress allow-list. Unlike remote pods they
//     are not cleared at start: a stale node address only drops more
//     (rule 14 instead of 15), which fails closed, while clearing them
//     would let the other nodes pass as outside the cluster until the
//     first sync.
//   - An address two claimants (pods, ClusterIPs) claim with different
//     tenants (a lagging status) maps to nothing: an address never keeps an
//     old tenant, it is unknown for a moment instead. A ClusterIP that is
//     not owned claims its address for nobody.
//   - Until the first full list of pods, Services, EndpointSlices and
//     Nodes is in the fence, no pod is mapped: the watch starts by
//     clearing the remote pods an earlier agent left (an address may have
//     been reused while no agent watched). An address the fence does not
//     know is dropped for every tier (netpol rule 14). While the API
//     server is lost, the entries stay as last seen (existing flows keep
//     their verdicts) and new addresses are unknown; ClusterSync says so.
//
// Every event marks the view dirty; one loop recomputes the wanted set from
// the informers' stores and writes the difference (UpsertRemote,
// DeleteRemote), and rewrites the whole set (SetRemote) after the first
// sync, every clusterResync and when the policy changes. The node
// addresses are written whole (SetRemoteNodes) on each full pass and
// whenever they change.

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
	SetRemoteNodes(ctx context.Context, addrs []netip.Addr) error
}

// tenantResolver maps namespaces to their tenant and RDMA grant:
// *policy.NamespaceTenants.
type tenantResolver interface {
	Grant(ctx context.Context, namespace string) (policy.NamespaceGrant, error)
	Refresh() bool
}

// ClusterSync is what the agent knows of the other nodes and their pods
// (the node status reports it).
type ClusterSync = node.ClusterSync

// clusterWatch keeps the fence's remote pods and other nodes' addresses
// from informers on Pods, Services, EndpointSlices and Nodes.
type clusterWatch struct {
	node    string
	fence   remoteFence
	tenants tenantResolver
	// pods, services, slices and nodes are the informers; every event of
	// each marks the view dirty.
	pods, services, slices, nodes cache.SharedIndexInformer
	// dirty asks the loop for a pass; it holds at most one request.
	dirty chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// applied is what this watch last wrote to the fence, by address.
	applied map[netip.Addr]netpol.RemotePod
	// appliedNodes is the set of other nodes' addresses this watch last
	// wrote to the fence, ordered; nodesApplied says it did once.
	appliedNodes []netip.Addr
	nodesApplied bool
	synced       bool
	// answered holds, per resource watched, whether the API server's
	// last answer about it was a success; connected means all of them.
	answered    map[string]bool
	lastContact time.Time
	lastApplied time.Time
	lastErr     error
}

// The resources the watch lists and watches, as the API server names them.
const (
	resPods           = "pods"
	resServices       = "services"
	resEndpointSlices = "endpointslices"
	resNodes          = "nodes"
)

var watched = []string{resPods, resServices, resEndpointSlices, resNodes}

// newClusterWatch watches client's pods, Services, EndpointSlices and
// Nodes for the fence of node.
func newClusterWatch(client kubernetes.Interface, node string, fence remoteFence, tenants tenantResolver) *clusterWatch {
	w := &clusterWatch{node: node, fence: fence, tenants: tenants, dirty: make(chan struct{}, 1), applied: map[netip.Addr]netpol.RemotePod{}, answered: map[string]bool{}}
	podSel := fields.OneTermEqualSelector("spec.hostNetwork", "false").String()
	pods := client.CoreV1().Pods(metav1.NamespaceAll)
	w.pods = w.informer(client, &corev1.Pod{}, resPods,
		func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			o.FieldSelector = podSel
			return pods.List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = podSel
			return pods.Watch(ctx, o)
		})
	services := client.CoreV1().Services(metav1.NamespaceAll)
	w.services = w.informer(client, &corev1.Service{}, resServices,
		func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) { return services.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return services.Watch(ctx, o)
		})
	eps := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	w.slices = w.informer(client, &discoveryv1.EndpointSlice{}, resEndpointSlices,
		func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) { return eps.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return eps.Watch(ctx, o) })
	nodes := client.CoreV1().Nodes()
	w.nodes = w.informer(client, &corev1.Node{}, resNodes,
		func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) { return nodes.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) })
	return w
}

// informer is an informer on what (a resource) whose lists and watches
// record the API server's answers, and whose events mark the view dirty.
func (w *clusterWatch) informer(client kubernetes.Interface, example kruntime.Object, what string,
	list func(context.Context, metav1.ListOptions) (kruntime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (kruntime.Object, error) {
			l, err := list(ctx, o)
			w.contact(what, wrapErr("list "+what, err))
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			wi, err := watchFn(ctx, o)
			w.contact(what, wrapErr("watch "+what, err))
			return wi, err
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example,
		cache.SharedIndexInformerOptions{ObjectDescription: what})
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		w.contact(what, fmt.Errorf("watch %s: %w", what, err))
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	mark := func(any) { w.contact(what, nil); w.markDirty() }
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, obj any) { mark(obj) },
		DeleteFunc: mark,
	})
	return inf
}

// wrapErr is err about what, or nil.
func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
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
	w := newClusterWatch(client, a.cfg.Agent.Node(), fence, policy.NewNamespaceTenants(a.engine))
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

func (w *clusterWatch) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// contact records an answer of the API server about what, or its failure.
func (w *clusterWatch) contact(what string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.answered[what] = err == nil
	if err == nil {
		w.lastContact = time.Now()
		return
	}
	w.lastErr = err
}

// Synced reports whether the first full list of pods, Services,
// EndpointSlices and Nodes is in the fence.
func (w *clusterWatch) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced
}

// connected reports whether the API server's last answer about each of
// the watched resources was a success. Caller holds mu.
func (w *clusterWatch) connected() bool {
	for _, what := range watched {
		if !w.answered[what] {
			return false
		}
	}
	return true
}

func (w *clusterWatch) status() ClusterSync {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := ClusterSync{Watching: true, Synced: w.synced, Connected: w.connected(), LastContact: w.lastContact,
		LastApplied: w.lastApplied, RemoteAddresses: len(w.applied), RemoteNodes: len(w.appliedNodes)}
	if w.lastErr != nil {
		s.LastError = w.lastErr.Error()
	}
	return s
}

// run keeps the fence until ctx ends.
func (w *clusterWatch) run(ctx context.Context) {
	// Entries an earlier agent left may name an address reused since:
	// none is trusted until this watch has listed the pods and Services.
	// Its node addresses stay: a stale one only drops more.
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
	for _, inf := range []cache.SharedIndexInformer{w.pods, w.services, w.slices, w.nodes} {
		go inf.RunWithContext(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.pods.HasSynced, w.services.HasSynced, w.slices.HasSynced, w.nodes.HasSynced) {
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
	log.G(ctx).WithError(err).Warn("cluster watch: the fence's remote pods and nodes")
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

// apply writes the informer's view to the fence: all of it when full, else
// what changed since the last pass. An address the fence refuses
// (netpol.ErrAddressHeld: a pod of this node has it) counts as applied and
// is tried again at the next full pass. The node addresses go first, whole,
// when full or changed.
func (w *clusterWatch) apply(ctx context.Context, full bool) error {
	var errs []error
	nodesErr := w.applyNodes(ctx, full)
	if nodesErr != nil {
		errs = append(errs, nodesErr)
	}
	want, err := w.wanted(ctx)
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
	w.synced = w.synced || (full && nodesErr == nil)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	w.lastApplied = time.Now()
	return nil
}

// applyNodes writes the other nodes' addresses to the fence when full, when
// they changed since the last write, or when no write succeeded yet.
func (w *clusterWatch) applyNodes(ctx context.Context, full bool) error {
	want := w.wantedNodes()
	w.mu.Lock()
	same := w.nodesApplied && slices.Equal(want, w.appliedNodes)
	w.mu.Unlock()
	if same && !full {
		return nil
	}
	if err := w.fence.SetRemoteNodes(ctx, want); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.appliedNodes, w.nodesApplied = want, true
	return nil
}

// wantedNodes are the addresses of every node but this one that the
// informer's store describes, ordered, each once.
func (w *clusterWatch) wantedNodes() []netip.Addr {
	var out []netip.Addr
	for _, obj := range w.nodes.GetStore().List() {
		n, ok := obj.(*corev1.Node)
		if !ok || n.Name == w.node {
			continue
		}
		out = append(out, nodeAddrs(n)...)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// nodeAddrs are the node's InternalIP and ExternalIP addresses, both
// families, each once; an address that cannot be another node's
// (loopback, link-local, multicast, unspecified) is left out.
func nodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, na := range n.Status.Addresses {
		if na.Type != corev1.NodeInternalIP && na.Type != corev1.NodeExternalIP {
			continue
		}
		a, err := netip.ParseAddr(na.Address)
		if err != nil {
			continue
		}
		a = a.Unmap().WithZone("")
		if !a.IsGlobalUnicast() || slices.Contains(out, a) {
			continue
		}
		out = append(out, a)
	}
	return out
}

// wanted is the set of remote pods and owned ClusterIPs the informers'
// stores describe. A pod or Service whose tenant cannot be resolved maps to
// nothing and makes the error.
func (w *clusterWatch) wanted(ctx context.Context) (map[netip.Addr]netpol.RemotePod, error) {
	var errs []error
	resolved := map[string]policy.NamespaceGrant{}
	grantOf := func(ns string) policy.NamespaceGrant {
		if g, ok := resolved[ns]; ok {
			return g
		}
		g, err := w.tenants.Grant(ctx, ns)
		if err != nil {
			errs = append(errs, fmt.Errorf("namespace %s: %w", ns, err))
			g = policy.NamespaceGrant{}
		}
		resolved[ns] = g
		return g
	}
	tenantOf := func(ns string) string { return grantOf(ns).Tenant }
	// claims are the entries' claimants: remote pods and ClusterIPs.
	// known are the claims of every pod, this node's included, by which
	// a Service's endpoints are judged.
	claims := map[netip.Addr][]claim{}
	known := map[netip.Addr][]string{}
	for _, obj := range w.pods.GetStore().List() {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !running(pod) {
			continue
		}
		addrs := podAddrs(pod)
		if len(addrs) == 0 {
			continue
		}
		g := grantOf(pod.Namespace)
		for _, a := range addrs {
			known[a] = append(known[a], g.Tenant)
		}
		if !w.remote(pod) {
			continue
		}
		c := claim{tenant: g.Tenant, rdma: g.RDMA && asksRDMA(pod)}
		for _, a := range addrs {
			claims[a] = append(claims[a], c)
		}
	}
	endpoints := serviceEndpoints(w.slices.GetStore().List())
	for _, obj := range w.services.GetStore().List() {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			continue
		}
		ips := clusterIPs(svc)
		if len(ips) == 0 {
			continue
		}
		tenant := tenantOf(svc.Namespace)
		if !ownedBy(tenant, endpoints[cache.NewObjectName(svc.Namespace, svc.Name)], known) {
			tenant = ""
		}
		for _, a := range ips {
			claims[a] = append(claims[a], claim{tenant: tenant})
		}
	}
	want := make(map[netip.Addr]netpol.RemotePod, len(claims))
	for a, cs := range claims {
		tenants := make([]string, len(cs))
		rdma := true
		for i, c := range cs {
			tenants[i] = c.tenant
			rdma = rdma && c.rdma
		}
		if t := owner(tenants); t != "" {
			want[a] = netpol.RemotePod{Addr: a, Tenant: t, AllowRDMA: rdma}
		}
	}
	return want, errors.Join(errs...)
}

// claim is one claimant of an address: the tenant it gives the address,
// and whether it holds the RDMA grant (a ClusterIP never does).
type claim struct {
	tenant string
	rdma   bool
}

// asksRDMA reports whether pod asks for RDMA (annotation bulkhead.dev/rdma
// "true", read as its own node read it). The request alone grants nothing:
// the remote pod holds the grant only when its namespace's policy answers
// own-vf to such a request too, as its node's decision did. An annotation
// that does not parse asks for nothing (its node refused the pod).
func asksRDMA(pod *corev1.Pod) bool {
	req, err := policy.ParseAnnotations(pod.Annotations)
	return err == nil && req.RDMA
}

// owner is the tenant of an address that claimants of tenants claim: theirs
// when they agree; else "" (and "" when nobody claims it).
func owner(tenants []string) string {
	if len(tenants) == 0 {
		return ""
	}
	for _, t := range tenants[1:] {
		if t != tenants[0] {
			return ""
		}
	}
	return tenants[0]
}

// ownedBy reports whether a Service of tenant with the endpoint addresses
// endpoints is tenant's: every address is a known pod's, and that pod's
// tenant is tenant (known: pods' claims by address).
func ownedBy(tenant string, endpoints []string, known map[netip.Addr][]string) bool {
	if tenant == "" {
		return false
	}
	for _, s := range endpoints {
		a, err := netip.ParseAddr(s)
		if err != nil || owner(known[a.Unmap()]) != tenant {
			return false
		}
	}
	return true
}

// serviceEndpoints gathers the endpoint addresses of the EndpointSlices in
// objs by the Service they belong to (label kubernetes.io/service-name).
// A slice of no Service is no Service's concern.
func serviceEndpoints(objs []any) map[cache.ObjectName][]string {
	out := map[cache.ObjectName][]string{}
	for _, obj := range objs {
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		name := es.Labels[discoveryv1.LabelServiceName]
		if name == "" {
			continue
		}
		key := cache.NewObjectName(es.Namespace, name)
		for _, e := range es.Endpoints {
			out[key] = append(out[key], e.Addresses...)
		}
	}
	return out
}

// clusterIPs are the Service's cluster addresses (spec.clusterIPs, else
// spec.clusterIP): none for an ExternalName or headless Service.
func clusterIPs(svc *corev1.Service) []netip.Addr {
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if s == corev1.ClusterIPNone {
			return nil
		}
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

// running reports whether pod holds its addresses in the pod network: not
// host-network, not finished. A pod being deleted still does, until it
// stops.
func running(pod *corev1.Pod) bool {
	if pod.Spec.HostNetwork {
		return false
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// remote reports whether pod is one the fence should learn: on another
// node, in the pod network, not being deleted, not finished.
func (w *clusterWatch) remote(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != w.node && pod.DeletionTimestamp == nil && running(pod)
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
