package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
)

// recordingFence is the remote-pod and remote-node part of a fence, in
// memory: what a netpol.Manager would hold after the same calls. held
// addresses are refused as a pod of this node's (netpol.ErrAddressHeld).
type recordingFence struct {
	mu    sync.Mutex
	pods  map[netip.Addr]string
	held  map[netip.Addr]bool
	nodes []netip.Addr
	calls int
}

func newRecordingFence() *recordingFence {
	return &recordingFence{pods: map[netip.Addr]string{}, held: map[netip.Addr]bool{}}
}

func (f *recordingFence) SetRemote(_ context.Context, pods []netpol.RemotePod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	clear(f.pods)
	var err error
	for _, p := range pods {
		if f.held[p.Addr] {
			err = fmt.Errorf("%s: %w", p.Addr, netpol.ErrAddressHeld)
			continue
		}
		f.pods[p.Addr] = p.Tenant
	}
	return err
}

func (f *recordingFence) UpsertRemote(_ context.Context, p netpol.RemotePod) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.held[p.Addr] {
		return fmt.Errorf("%s: %w", p.Addr, netpol.ErrAddressHeld)
	}
	f.pods[p.Addr] = p.Tenant
	return nil
}

func (f *recordingFence) DeleteRemote(_ context.Context, a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	delete(f.pods, a)
	return nil
}

func (f *recordingFence) SetRemoteNodes(_ context.Context, addrs []netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.nodes = slices.Clone(addrs)
	return nil
}

func (f *recordingFence) nodeView() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.nodes)
}

func (f *recordingFence) view() map[netip.Addr]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.pods)
}

// fakeTenants maps namespaces as a policy would; bump makes Refresh
// report a new policy once.
type fakeTenants struct {
	mu      sync.Mutex
	tenants map[string]string
	// rdma holds the namespaces whose policy grants RDMA to a pod that
	// asks.
	rdma    map[string]bool
	changed atomic.Bool
}

func (t *fakeTenants) Grant(_ context.Context, ns string) (policy.NamespaceGrant, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return policy.NamespaceGrant{Tenant: t.tenants[ns], RDMA: t.rdma[ns]}, nil
}

func (t *fakeTenants) Refresh() bool { return t.changed.Swap(false) }

func (t *fakeTenants) set(ns, tenant string) {
	t.mu.Lock()
	t.tenants[ns] = tenant
	t.mu.Unlock()
	t.changed.Store(true)
}

const thisNode = "node-a"

// testPod is a pod of namespace ns on node with the given addresses,
// Running when it has any, else Pending.
func testPod(ns, name, node string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	setIPs(p, ips...)
	return p
}

func setIPs(p *corev1.Pod, ips ...string) {
	p.Status.PodIPs = nil
	p.Status.PodIP = ""
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
		p.Status.Phase = corev1.PodRunning
	}
}

type fence map[string]string

func (want fence) addrs() map[netip.Addr]string {
	out := map[netip.Addr]string{}
	for a, t := range want {
		out[netip.MustParseAddr(a)] = t
	}
	return out
}

// The fence's remote pods follow the API server's pods of other nodes,
// step by step.
func TestClusterWatch(t *testing.T) {
	hostNet := testPod("red", "host-net", "node-b", "192.168.0.2")
	hostNet.Spec.HostNetwork = true
	done := testPod("red", "done", "node-b", "10.1.0.8")
	done.Status.Phase = corev1.PodSucceeded
	client := fake.NewClientset(
		testPod("red", "a1", "node-b", "10.1.0.1", "fd01::1"),
		testPod("red", "own", thisNode, "10.0.0.9"), // the shims register it
		hostNet,                           // a node address, no tenant's
		testPod("red", "unscheduled", ""), // no address yet
		testPod("kube-public", "no-tenant", "node-b", "10.1.0.7"), // a namespace of no tenant
		done,
	)
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) })
		return false, nil, nil
	})
	f := newRecordingFence()
	f.pods[netip.MustParseAddr("10.1.0.50")] = "blue" // left by an earlier agent
	f.held[netip.MustParseAddr("10.1.0.99")] = true   // a pod of this node has it
	tenants := &fakeTenants{tenants: map[string]string{"red": "red", "blue": "blue"}}
	w := newClusterWatch(client, thisNode, f, tenants)
	if w.Synced() || w.status().Connected {
		t.Fatal("synced or connected before it ran")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer never watched pods")
	}

	pods := client.CoreV1().Pods
	get := func(ns, name string) *corev1.Pod {
		p, err := pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	update := func(p *corev1.Pod) {
		if _, err := pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(p *corev1.Pod) {
		if _, err := pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	remove := func(ns, name string) {
		if err := pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	steps := []struct {
		name string
		do   func()
		want fence
	}{
		{
			name: "first sync: other nodes' pods with addresses, an earlier agent's entries gone",
			do:   func() {},
			want: fence{"10.1.0.1": "red", "fd01::1": "red"},
		},
		{
			name: "a pod scheduled without addresses is not known yet",
			do:   func() { create(testPod("blue", "b1", "node-c")) },
			want: fence{"10.1.0.1": "red", "fd01::1": "red"},
		},
		{
			name: "its addresses arrive",
			do:   func() { p := get("blue", "b1"); setIPs(p, "10.1.0.2", "fd01::2"); update(p) },
			want: fence{"10.1.0.1": "red", "fd01::1": "red", "10.1.0.2": "blue", "fd01::2": "blue"},
		},
		{
			name: "an address changes",
			do:   func() { p := get("red", "a1"); setIPs(p, "10.1.0.3", "fd01::1"); update(p) },
			want: fence{"10.1.0.3": "red", "fd01::1": "red", "10.1.0.2": "blue", "fd01::2": "blue"},
		},
		{
			name: "a deleted pod's addresses go",
			do:   func() { remove("red", "a1") },
			want: fence{"10.1.0.2": "blue", "fd01::2": "blue"},
		},
		{
			name: "an address two live pods of different tenants claim is nobody's",
			do:   func() { create(testPod("red", "c1", "node-c", "10.1.0.2")) },
			want: fence{"fd01::2": "blue"},
		},
		{
			name: "a pod being deleted loses its addresses: the other claim wins",
			do: func() {
				p := get("blue", "b1")
				now := metav1.Now()
				p.DeletionTimestamp = &now
				update(p)
			},
			want: fence{"10.1.0.2": "red"},
		},
		{
			name: "a failed pod's addresses go",
			do: func() {
				create(testPod("blue", "b4", "node-c", "10.1.0.5"))
				p := get("blue", "b4")
				p.Status.Phase = corev1.PodFailed
				update(p)
			},
			want: fence{"10.1.0.2": "red"},
		},
		{
			name: "the address reused by a pod of the same tenant keeps its tenant",
			do: func() {
				remove("blue", "b1")
				remove("red", "c1")
				create(testPod("red", "c2", "node-b", "10.1.0.2"))
			},
			want: fence{"10.1.0.2": "red"},
		},
		{
			name: "a pod moved onto this node is the shims' to register",
			do:   func() { p := get("red", "c2"); p.Spec.NodeName = thisNode; update(p) },
			want: fence{},
		},
		{
			name: "an address held on this node is skipped, the others are kept",
			do: func() {
				create(testPod("blue", "b2", "node-b", "10.1.0.99"))
				create(testPod("blue", "b3", "node-b", "10.1.0.4"))
			},
			want: fence{"10.1.0.4": "blue"},
		},
		{
			name: "a new policy moves a namespace to another tenant",
			do:   func() { tenants.set("blue", "green") },
			want: fence{"10.1.0.4": "green"},
		},
	}
	for _, s := range steps {
		s.do()
		want := s.want.addrs()
		deadline := time.Now().Add(5 * time.Second)
		for !maps.Equal(f.view(), want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := f.view(); !maps.Equal(got, want) {
			t.Fatalf("%s: fence holds %v, want %v", s.name, got, want)
		}
	}
	st := w.status()
	if !st.Watching || !st.Synced || !st.Connected || st.LastContact.IsZero() || st.RemoteAddresses != 2 {
		// 10.1.0.99 counts as applied: the fence refused it, not the watch.
		t.Errorf("status %+v: want watching, synced, connected, a contact time and 2 addresses", st)
	}
}

// Until it has listed the pods, the watch trusts nothing an earlier agent
// left, and says it has not synced; a lost API server says so too.
func TestClusterWatchUnsynced(t *testing.T) {
	client := fake.NewClientset(testPod("red", "a1", "node-b", "10.1.0.1"))
	failing := atomic.Bool{}
	failing.Store(true)
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
		if failing.Load() {
			return true, nil, fmt.Errorf("connection refused")
		}
		return false, nil, nil
	})
	f := newRecordingFence()
	f.pods[netip.MustParseAddr("10.1.0.1")] = "blue"           // stale: the address was reused
	f.nodes = []netip.Addr{netip.MustParseAddr("192.168.0.9")} // an earlier agent's: kept, it only drops more
	w := newClusterWatch(client, thisNode, f, &fakeTenants{tenants: map[string]string{"red": "red"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)

	deadline := time.Now().Add(5 * time.Second)
	for w.status().LastError == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := w.status()
	if st.Synced || st.Connected || st.LastError == "" {
		t.Errorf("API server unreachable: status %+v, want not synced, not connected, an error", st)
	}
	if got := f.view(); len(got) != 0 {
		t.Errorf("before the first sync the fence holds %v, want nothing", got)
	}
	if got := f.nodeView(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("192.168.0.9")}) {
		t.Errorf("before the first sync the fence's node addresses are %v, want the earlier agent's kept", got)
	}

	failing.Store(false)
	want := fence{"10.1.0.1": "red"}.addrs()
	deadline = time.Now().Add(10 * time.Second)
	for !maps.Equal(f.view(), want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.view(); !maps.Equal(got, want) || !w.Synced() || !w.status().Connected {
		t.Errorf("after the API server returned: fence %v (want %v), status %+v", got, want, w.status())
	}
	if got := f.nodeView(); len(got) != 0 {
		t.Errorf("after the first sync with no other node the fence's node addresses are %v, want none", got)
	}
}

func TestPodAddrs(t *testing.T) {
	p := testPod("red", "x", "node-b")
	p.Status.PodIP = "10.0.0.1" // an old kubelet: podIP only
	if got := podAddrs(p); len(got) != 1 || got[0] != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("podIP only: %v", got)
	}
	setIPs(p, "::ffff:10.0.0.2", "fd00::2", "not-an-ip", "fd00::2")
	got := podAddrs(p)
	if len(got) != 2 || got[0] != netip.MustParseAddr("10.0.0.2") || got[1] != netip.MustParseAddr("fd00::2") {
		t.Errorf("podIPs: %v, want 10.0.0.2 and fd00::2 once each", got)
	}
}

func TestOwner(t *testing.T) {
	for _, tc := range []struct {
		tenants []string
		want    string
	}{
		{[]string{"red"}, "red"},
		{[]string{"red", "red"}, "red"},
		{[]string{"red", "blue"}, ""},
		{[]string{"red", "red", "blue"}, ""},
		{[]string{"", "red"}, ""},
		{[]string{""}, ""},
	} {
		if got := owner(tc.tenants); got != tc.want {
			t.Errorf("owner(%q) = %q, want %q", tc.tenants, got, tc.want)
		}
	}
}

// The watch keeps a real fence: netpol.Manager on a private bpffs, with a
// pod of another node, a ClusterIP it backs and another node's addresses.
func TestClusterWatchNetpol(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_BPF, CAP_SYS_ADMIN) to mount a bpffs and load the fence")
	}
	dir := t.TempDir()
	pin := filepath.Join(dir, "bpffs")
	if err := netpol.MountBPFFS(pin); err != nil {
		t.Skipf("cannot mount a bpf filesystem: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pin, unix.MNT_DETACH) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := netpol.Open(ctx, netpol.Options{PinDir: filepath.Join(pin, "bulkhead"), LockPath: filepath.Join(dir, "netpol.lock"),
		Cluster: &netpol.ClusterConfig{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.SetRemote(ctx, []netpol.RemotePod{{Addr: netip.MustParseAddr("10.1.0.1"), Tenant: "blue"}}); err != nil {
		t.Fatal(err) // an earlier agent's entry, for an address since reused
	}

	if err := m.SetRemoteNodes(ctx, addrList("192.168.0.9")); err != nil {
		t.Fatal(err) // an earlier agent's: a node since gone
	}

	client := fake.NewClientset(testPod("red", "a1", "node-b", "10.1.0.1", "fd01::1"),
		testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1"),
		testNode(thisNode, "InternalIP=192.168.0.1"),
		testNode("node-b", "InternalIP=192.168.0.2", "InternalIP=fd00:1::2", "ExternalIP=203.0.113.2"))
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) })
		return false, nil, nil
	})
	w := newClusterWatch(client, thisNode, m, &fakeTenants{tenants: map[string]string{"red": "red"}})
	go w.run(ctx)
	select {
	case <-watching:
	case <-time.After(10 * time.Second):
		t.Fatal("the informer never watched pods")
	}
	want := []netpol.RemotePod{{Addr: netip.MustParseAddr("10.1.0.1"), Tenant: "red"}, {Addr: netip.MustParseAddr("10.96.0.10"), Tenant: "red"},
		{Addr: netip.MustParseAddr("fd01::1"), Tenant: "red"}}
	remotes := func() []netpol.RemotePod {
		got, err := m.RemotePods()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(remotes(), want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := remotes(); !slices.Equal(got, want) || !w.Synced() {
		t.Fatalf("fence holds %+v (synced %v), want %+v", got, w.Synced(), want)
	}
	remoteNodes := func() []netip.Addr {
		got, err := m.RemoteNodes()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	wantNodes := addrList("192.168.0.2", "203.0.113.2", "fd00:1::2")
	if got := remoteNodes(); !slices.Equal(got, wantNodes) {
		t.Errorf("the fence's node addresses are %v, want node-b's %v", got, wantNodes)
	}
	// A restarted agent reconfiguring the node keeps them in the cluster.
	again, err := netpol.Open(ctx, netpol.Options{PinDir: filepath.Join(pin, "bulkhead"), LockPath: filepath.Join(dir, "netpol.lock"),
		Cluster: &netpol.ClusterConfig{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}})
	if err != nil {
		t.Fatal(err)
	}
	again.Close()
	if got := remoteNodes(); !slices.Equal(got, wantNodes) {
		t.Errorf("after Open with a ClusterConfig the fence's node addresses are %v, want %v", got, wantNodes)
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(remoteNodes()) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := remoteNodes(); len(got) != 0 {
		t.Errorf("after node-b left the fence's node addresses are %v", got)
	}
	if err := client.CoreV1().Pods("red").Delete(ctx, "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(remotes()) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := remotes(); len(got) != 0 {
		// The ClusterIP goes too: its endpoint is no pod any more.
		t.Errorf("after the pod was deleted the fence holds %+v", got)
	}
}

// testService is a Service of namespace ns with the given cluster
// addresses ("None": headless).
func testService(ns, name string, ips ...string) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-svc-" + name)},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: ips},
	}
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0]
	}
	return s
}

// testSlice is an EndpointSlice of Service service in namespace ns, one
// endpoint per address, as a selectorless Service's owner would write it.
func testSlice(ns, name, service string, addrs ...string) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return es
}

// startWatch runs a cluster watch of client into f until the test ends,
// and returns once its informers watch and its first full pass is in f.
func startWatch(t *testing.T, client *fake.Clientset, f remoteFence, tenants tenantResolver) *clusterWatch {
	t.Helper()
	var watching sync.WaitGroup
	for _, res := range []string{"pods", "services", "endpointslices", "nodes"} {
		watching.Add(1)
		var once sync.Once
		client.PrependWatchReactor(res, func(k8stesting.Action) (bool, watch.Interface, error) {
			once.Do(watching.Done)
			return false, nil, nil
		})
	}
	w := newClusterWatch(client, thisNode, f, tenants)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.run(ctx)
	done := make(chan struct{})
	go func() { watching.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the informers never watched pods, services, endpointslices and nodes")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !w.Synced() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if !w.Synced() {
		t.Fatalf("the watch never synced: %+v", w.status())
	}
	return w
}

// A ClusterIP is its namespace's tenant's only when every endpoint of
// the Service is a known pod of that tenant.
func TestClusterWatchServices(t *testing.T) {
	// Pods every case holds: red on another node (both families), blue
	// on another node, red on this node, and one of a namespace of no
	// tenant.
	pods := func() []kruntime.Object {
		return []kruntime.Object{
			testPod("red", "r1", "node-b", "10.1.0.1", "fd01::1"),
			testPod("blue", "b1", "node-b", "10.1.0.2"),
			testPod("red", "own", thisNode, "10.0.0.9"),
			testPod("kube-system", "sys", "node-b", "10.1.0.3"),
		}
	}
	base := fence{"10.1.0.1": "red", "fd01::1": "red", "10.1.0.2": "blue"}
	with := func(extra fence) fence {
		out := maps.Clone(base)
		maps.Copy(out, extra)
		return out
	}
	deleting := testPod("red", "leaving", "node-c", "10.1.0.4")
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	finished := testPod("red", "done", "node-c", "10.1.0.5")
	finished.Status.Phase = corev1.PodSucceeded
	externalName := testService("red", "ext")
	externalName.Spec.Type = corev1.ServiceTypeExternalName
	externalName.Spec.ExternalName = "db.example.org"
	fqdn := testSlice("red", "web-fqdn", "web", "db.example.org")
	fqdn.AddressType = discoveryv1.AddressTypeFQDN

	for _, tc := range []struct {
		name    string
		objects []kruntime.Object
		want    fence
	}{
		{
			name:    "endpoints that are the tenant's pods: the ClusterIP is the tenant's",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1")},
			want:    with(fence{"10.96.0.10": "red"}),
		},
		{
			name: "dual stack: both ClusterIPs, endpoints of both families in two slices",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10", "fd96::10"),
				testSlice("red", "web-4", "web", "10.1.0.1"), testSlice("red", "web-6", "web", "fd01::1")},
			want: with(fence{"10.96.0.10": "red", "fd96::10": "red"}),
		},
		{
			name:    "an endpoint of another tenant's pod: no entry",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1", "10.1.0.2")},
			want:    base,
		},
		{
			name:    "a selectorless Service's endpoint that is no pod: no entry",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10", "fd96::10"), testSlice("red", "web-1", "web", "192.168.5.5")},
			want:    base,
		},
		{
			name:    "an endpoint of a pod of no tenant: no entry",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.3")},
			want:    base,
		},
		{
			name:    "an FQDN endpoint: no entry",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), fqdn},
			want:    base,
		},
		{
			name:    "a pod of this node is a known endpoint; its own address stays the shims'",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.0.0.9", "10.1.0.1")},
			want:    with(fence{"10.96.0.10": "red"}),
		},
		{
			name:    "no endpoint: the ClusterIP is the tenant's, nothing is reachable through it",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web")},
			want:    with(fence{"10.96.0.10": "red"}),
		},
		{
			name:    "a Service of a namespace of no tenant: no entry",
			objects: []kruntime.Object{testService("kube-system", "dns", "10.96.0.53"), testSlice("kube-system", "dns-1", "dns", "10.1.0.3")},
			want:    base,
		},
		{
			name:    "headless: nothing to map (its clients use the pods' addresses)",
			objects: []kruntime.Object{testService("red", "web", "None"), testSlice("red", "web-1", "web", "10.1.0.1")},
			want:    base,
		},
		{
			name:    "ExternalName: nothing to map",
			objects: []kruntime.Object{externalName},
			want:    base,
		},
		{
			name: "a slice of another namespace with the same service name is not the Service's",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1"),
				testSlice("blue", "web-1", "web", "10.1.0.2")},
			want: with(fence{"10.96.0.10": "red"}),
		},
		{
			name: "a slice of no Service changes nothing",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1"),
				testSlice("red", "stray", "", "10.1.0.2")},
			want: with(fence{"10.96.0.10": "red"}),
		},
		{
			name:    "a pod being deleted still backs its Service; its own address goes",
			objects: []kruntime.Object{deleting, testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.4")},
			want:    with(fence{"10.96.0.10": "red"}),
		},
		{
			name:    "a finished pod's address backs nothing",
			objects: []kruntime.Object{finished, testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.5")},
			want:    base,
		},
		{
			name: "an endpoint address two tenants' pods claim: no entry",
			objects: []kruntime.Object{testPod("blue", "b2", "node-c", "10.1.0.1"), testService("red", "web", "10.96.0.10"),
				testSlice("red", "web-1", "web", "10.1.0.1")},
			want: fence{"fd01::1": "red", "10.1.0.2": "blue"},
		},
		{
			name: "a ClusterIP a pod of another tenant also claims: nobody's",
			objects: []kruntime.Object{testPod("blue", "b2", "node-c", "10.96.0.10"), testService("red", "web", "10.96.0.10"),
				testSlice("red", "web-1", "web", "10.1.0.1")},
			want: base,
		},
		{
			name: "a ClusterIP an unowned Service claims is nobody's, whoever else claims it",
			objects: []kruntime.Object{testService("red", "web", "10.96.0.10"), testSlice("red", "web-1", "web", "10.1.0.1"),
				testService("blue", "other", "10.96.0.10"), testSlice("blue", "other-1", "other", "192.168.5.5")},
			want: base,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(append(pods(), tc.objects...)...)
			f := newRecordingFence()
			startWatch(t, client, f, &fakeTenants{tenants: map[string]string{"red": "red", "blue": "blue"}})
			want := tc.want.addrs()
			if got := f.view(); !maps.Equal(got, want) {
				t.Errorf("fence holds %v, want %v", got, want)
			}
		})
	}
}

// A ClusterIP's entry follows its Service and EndpointSlices, step by step.
func TestClusterWatchServiceChanges(t *testing.T) {
	client := fake.NewClientset(
		testPod("red", "r1", "node-b", "10.1.0.1"),
		testPod("blue", "b1", "node-b", "10.1.0.2"),
		testService("red", "web", "10.96.0.10", "fd96::10"),
		testSlice("red", "web-1", "web", "10.1.0.1"),
	)
	f := newRecordingFence()
	tenants := &fakeTenants{tenants: map[string]string{"red": "red", "blue": "blue"}}
	startWatch(t, client, f, tenants)
	ctx := t.Context()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	eps := client.DiscoveryV1().EndpointSlices
	setSlice := func(addrs ...string) {
		_, err := eps("red").Update(ctx, testSlice("red", "web-1", "web", addrs...), metav1.UpdateOptions{})
		must(err)
	}

	steps := []struct {
		name string
		do   func()
		want fence
	}{
		{
			name: "first sync: the Service's endpoint is its tenant's pod",
			do:   func() {},
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue", "10.96.0.10": "red", "fd96::10": "red"},
		},
		{
			name: "the endpoints move to another tenant's pod: the entries go",
			do:   func() { setSlice("10.1.0.2") },
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue"},
		},
		{
			name: "back to its own pod",
			do:   func() { setSlice("10.1.0.1") },
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue", "10.96.0.10": "red", "fd96::10": "red"},
		},
		{
			name: "the endpoints move to an address of no pod: the entries go",
			do:   func() { setSlice("10.1.0.1", "192.168.5.5") },
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue"},
		},
		{
			name: "a pod of the tenant takes that address: the entries come back",
			do: func() {
				_, err := client.CoreV1().Pods("red").Create(ctx, testPod("red", "r2", "node-c", "192.168.5.5"), metav1.CreateOptions{})
				must(err)
			},
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue", "192.168.5.5": "red", "10.96.0.10": "red", "fd96::10": "red"},
		},
		{
			name: "a second slice with another tenant's pod: the entries go",
			do: func() {
				_, err := eps("red").Create(ctx, testSlice("red", "web-2", "web", "10.1.0.2"), metav1.CreateOptions{})
				must(err)
			},
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue", "192.168.5.5": "red"},
		},
		{
			name: "that slice deleted: they come back",
			do:   func() { must(eps("red").Delete(ctx, "web-2", metav1.DeleteOptions{})) },
			want: fence{"10.1.0.1": "red", "10.1.0.2": "blue", "192.168.5.5": "red", "10.96.0.10": "red", "fd96::10": "red"},
		},
		{
			name: "a new policy moves the namespace: the ClusterIPs follow their pods",
			do:   func() { tenants.set("red", "green") },
			want: fence{"10.1.0.1": "green", "10.1.0.2": "blue", "192.168.5.5": "green", "10.96.0.10": "green", "fd96::10": "green"},
		},
		{
			name: "the Service deleted: its entries go",
			do:   func() { must(client.CoreV1().Services("red").Delete(ctx, "web", metav1.DeleteOptions{})) },
			want: fence{"10.1.0.1": "green", "10.1.0.2": "blue", "192.168.5.5": "green"},
		},
	}
	for _, s := range steps {
		s.do()
		want := s.want.addrs()
		deadline := time.Now().Add(5 * time.Second)
		for !maps.Equal(f.view(), want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := f.view(); !maps.Equal(got, want) {
			t.Fatalf("%s: fence holds %v, want %v", s.name, got, want)
		}
	}
}

// testNode is a node with the given addresses, "type=address" each
// (InternalIP, ExternalIP, Hostname, InternalDNS).
func testNode(name string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-node-" + name)}}
	for _, a := range addrs {
		typ, addr, _ := strings.Cut(a, "=")
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeAddressType(typ), Address: addr})
	}
	return n
}

func addrList(ss ...string) []netip.Addr {
	out := []netip.Addr{}
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// The fence's node addresses follow the API server's other nodes, step by
// step: InternalIP and ExternalIP, both families, never this node's.
func TestClusterWatchNodes(t *testing.T) {
	client := fake.NewClientset(
		testNode(thisNode, "InternalIP=192.168.0.1", "InternalIP=fd00:1::1"),
		testNode("node-b", "InternalIP=192.168.0.2", "ExternalIP=203.0.113.2", "InternalIP=fd00:1::2",
			"Hostname=node-b", "InternalDNS=node-b.internal"),
	)
	f := newRecordingFence()
	w := startWatch(t, client, f, &fakeTenants{tenants: map[string]string{}})
	ctx := t.Context()
	nodes := client.CoreV1().Nodes()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	create := func(n *corev1.Node) { _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); must(err) }
	update := func(n *corev1.Node) { _, err := nodes.Update(ctx, n, metav1.UpdateOptions{}); must(err) }

	steps := []struct {
		name string
		do   func()
		want []netip.Addr
	}{
		{
			name: "first sync: the other node's InternalIP and ExternalIP, both families, not this node's",
			do:   func() {},
			want: addrList("192.168.0.2", "203.0.113.2", "fd00:1::2"),
		},
		{
			name: "a node joins",
			do:   func() { create(testNode("node-c", "InternalIP=192.168.0.3", "InternalIP=fd00:1::3")) },
			want: addrList("192.168.0.2", "192.168.0.3", "203.0.113.2", "fd00:1::2", "fd00:1::3"),
		},
		{
			name: "a node's address changes",
			do:   func() { update(testNode("node-c", "InternalIP=192.168.0.4", "InternalIP=fd00:1::3")) },
			want: addrList("192.168.0.2", "192.168.0.4", "203.0.113.2", "fd00:1::2", "fd00:1::3"),
		},
		{
			name: "an address two nodes report is listed once",
			do:   func() { create(testNode("node-d", "ExternalIP=203.0.113.2")) },
			want: addrList("192.168.0.2", "192.168.0.4", "203.0.113.2", "fd00:1::2", "fd00:1::3"),
		},
		{
			name: "a node leaves: the address another node still reports stays",
			do:   func() { must(nodes.Delete(ctx, "node-b", metav1.DeleteOptions{})) },
			want: addrList("192.168.0.4", "203.0.113.2", "fd00:1::3"),
		},
		{
			name: "this node's addresses change: nothing to learn",
			do:   func() { update(testNode(thisNode, "InternalIP=192.168.0.11", "ExternalIP=203.0.113.11")) },
			want: addrList("192.168.0.4", "203.0.113.2", "fd00:1::3"),
		},
		{
			name: "loopback, link-local and unparsable addresses are skipped",
			do: func() {
				update(testNode("node-d", "ExternalIP=203.0.113.2", "InternalIP=127.0.0.1", "InternalIP=fe80::1",
					"InternalIP=169.254.0.5", "InternalIP=not-an-ip", "InternalIP=::ffff:192.168.0.5"))
			},
			want: addrList("192.168.0.4", "192.168.0.5", "203.0.113.2", "fd00:1::3"),
		},
		{
			name: "every other node gone: none",
			do: func() {
				must(nodes.Delete(ctx, "node-c", metav1.DeleteOptions{}))
				must(nodes.Delete(ctx, "node-d", metav1.DeleteOptions{}))
			},
			want: addrList(),
		},
	}
	for _, s := range steps {
		s.do()
		deadline := time.Now().Add(5 * time.Second)
		for !slices.Equal(f.nodeView(), s.want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := f.nodeView(); !slices.Equal(got, s.want) {
			t.Fatalf("%s: fence's node addresses %v, want %v", s.name, got, s.want)
		}
		deadline = time.Now().Add(5 * time.Second)
		for w.status().RemoteNodes != len(s.want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if st := w.status(); st.RemoteNodes != len(s.want) {
			t.Errorf("%s: status RemoteNodes %d, want %d", s.name, st.RemoteNodes, len(s.want))
		}
	}
}

// Until the node informer has listed the nodes the watch is not synced,
// and it writes no node address: an earlier agent's stay.
func TestClusterWatchNodesUnsynced(t *testing.T) {
	client := fake.NewClientset(testNode("node-b", "InternalIP=192.168.0.2"))
	failing := atomic.Bool{}
	failing.Store(true)
	client.PrependReactor("list", "nodes", func(k8stesting.Action) (bool, kruntime.Object, error) {
		if failing.Load() {
			return true, nil, fmt.Errorf("nodes is forbidden")
		}
		return false, nil, nil
	})
	f := newRecordingFence()
	earlier := addrList("192.168.0.9")
	f.nodes = earlier
	w := newClusterWatch(client, thisNode, f, &fakeTenants{tenants: map[string]string{}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.run(ctx)
	deadline := time.Now().Add(5 * time.Second)
	for w.status().LastError == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := w.status(); st.Synced || st.Connected || !strings.Contains(st.LastError, "nodes") {
		t.Errorf("nodes unlisted: status %+v, want not synced, not connected, an error about nodes", st)
	}
	if got := f.nodeView(); !slices.Equal(got, earlier) {
		t.Errorf("before the first sync the fence's node addresses are %v, want the earlier agent's %v", got, earlier)
	}
	failing.Store(false)
	want := addrList("192.168.0.2")
	deadline = time.Now().Add(10 * time.Second)
	for !slices.Equal(f.nodeView(), want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.nodeView(); !slices.Equal(got, want) || !w.Synced() {
		t.Errorf("after the nodes were listed: %v (want %v), synced %v", got, want, w.Synced())
	}
}

// A remote pod holds the RDMA grant only when it asks for RDMA and its
// namespace's policy answers own-vf to that request, as its own node's
// decision did; neither alone grants it, and an address two pods claim
// holds it only when both do.
func TestClusterWatchRDMAGrant(t *testing.T) {
	asks := func(p *corev1.Pod, v string) *corev1.Pod {
		p.Annotations = map[string]string{policy.AnnotationRDMA: v}
		return p
	}
	tenants := &fakeTenants{
		tenants: map[string]string{"train": "train", "train-2": "train", "bots": "bots"},
		rdma:    map[string]bool{"train": true, "train-2": true},
	}
	w := newClusterWatch(fake.NewClientset(), thisNode, newRecordingFence(), tenants)
	for _, p := range []*corev1.Pod{
		asks(testPod("train", "granted", "node-b", "10.1.0.1", "fd01::1"), "true"),
		asks(testPod("train", "spaced", "node-b", "10.1.0.2"), " TRUE "),
		testPod("train", "not-asking", "node-b", "10.1.0.3"),
		asks(testPod("train", "asks-false", "node-b", "10.1.0.4"), "false"),
		asks(testPod("train", "garbled", "node-b", "10.1.0.5"), "yes please"),
		asks(testPod("bots", "tier-denies", "node-b", "10.1.0.6"), "true"),
		asks(testPod("train", "local", thisNode, "10.0.0.1"), "true"),
		// 10.1.0.7: two pods of one tenant, one granted, one not.
		asks(testPod("train", "reused-a", "node-b", "10.1.0.7"), "true"),
		testPod("train-2", "reused-b", "node-c", "10.1.0.7"),
		// 10.1.0.8: two granted pods of one tenant.
		asks(testPod("train", "both-a", "node-b", "10.1.0.8"), "true"),
		asks(testPod("train-2", "both-b", "node-c", "10.1.0.8"), "true"),
	} {
		if err := w.pods.GetStore().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]netpol.RemotePod{
		"10.1.0.1": {Tenant: "train", AllowRDMA: true},
		"fd01::1":  {Tenant: "train", AllowRDMA: true},
		"10.1.0.2": {Tenant: "train", AllowRDMA: true},
		"10.1.0.3": {Tenant: "train"},
		"10.1.0.4": {Tenant: "train"},
		"10.1.0.5": {Tenant: "train"},
		"10.1.0.6": {Tenant: "bots"},
		"10.1.0.7": {Tenant: "train"},
		"10.1.0.8": {Tenant: "train", AllowRDMA: true},
	}
	got, err := w.wanted(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("wanted %d remote addresses %v, want %d", len(got), got, len(want))
	}
	for s, rp := range want {
		a := netip.MustParseAddr(s)
		rp.Addr = a
		if got[a] != rp {
			t.Errorf("%s: remote pod %+v, want %+v", s, got[a], rp)
		}
	}
}
