package dra

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/bulkhead-runtime/bulkhead/mig"
	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
	"github.com/bulkhead-runtime/bulkhead/mig/inject"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
	"github.com/bulkhead-runtime/bulkhead/runtime"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

const testNode = "gpu-node"

// testTenants: platform (trusted: runc allowed, every profile) with a
// quota of 4 compute slices, ml and lab (trusted, no quota to speak of;
// lab's pod runs in gVisor) and agents
// (untrusted: gVisor only, slices of at most 3 compute). They are signed
// into the bundle (policytest): the trusted tier keeps to signed tenants.
const testTenants = `{"bulkhead": {"tenants": {
  "platform": {"tier": "trusted",   "namespaces": ["platform"], "quota": {"sandboxes": 10, "gpu_slices": 4, "memory": "64Gi"}},
  "ml":       {"tier": "trusted",   "namespaces": ["ml"],       "quota": {"sandboxes": 10, "gpu_slices": 56, "memory": "64Gi"}},
  "lab":      {"tier": "trusted",   "namespaces": ["lab"],      "quota": {"sandboxes": 10, "gpu_slices": 56, "memory": "64Gi"}},
  "agents":   {"tier": "untrusted", "namespaces": ["agents"],   "quota": {"sandboxes": 10, "gpu_slices": 7, "memory": "8Gi"}}
}}}`

// testConfig is a node with the default bundle and the tenants above in
// its data, two mock H200s, CDI specs in a temporary directory and the
// fence off.
func testConfig(t *testing.T) config.Config {
	t.Helper()
	dir := t.TempDir()
	bundle := policytest.BundleWithTenants(t, testTenants)
	cfg := config.Default()
	cfg.RunscRoot = filepath.Join(dir, "runsc")
	cfg.RuncRoot = filepath.Join(dir, "runc")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Policy = config.PolicyConfig{Bundle: bundle, InsecureSkipVerification: true}
	cfg.MIG = config.MIGConfig{Backend: "mock", MockModel: "h200", MockGPUs: 2, MockState: filepath.Join(dir, "gpus.json"), CDISpecDir: filepath.Join(dir, "cdi")}
	cfg.Netpol.Enabled = false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func openPipeline(t *testing.T, cfg config.Config) *runtime.Pipeline {
	t.Helper()
	p, err := runtime.OpenPipeline(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// testCluster holds the RuntimeClasses of the default handlers and one
// pod per namespace, named "pod", running under handler.
func testCluster(node *corev1.Node, handlers map[string]string) *fake.Clientset {
	objs := []kruntime.Object{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead-runc"}, Handler: "bulkhead-runc"},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "bulkhead"}, Handler: "bulkhead"},
	}
	if node != nil {
		objs = append(objs, node)
	}
	for ns, h := range handlers {
		objs = append(objs, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod", UID: types.UID("pod-" + ns)},
			Spec:       corev1.PodSpec{RuntimeClassName: &h, NodeName: testNode},
		})
	}
	c := fake.NewClientset(objs...)
	// The fake tracker does not generate names as the API server does;
	// the ResourceSlice controller creates its slices by GenerateName.
	var created int
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceSlice)
		if s.Name == "" && s.GenerateName != "" {
			created++
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, created)
		}
		return false, nil, nil
	})
	return c
}

// claimOn is claim name in ns, allocated device on this node and
// reserved for the namespace's pod.
func claimOn(ns, name, device string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name)},
		Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: migdra.DriverName, Pool: testNode, Device: device},
			}}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod", UID: types.UID("pod-" + ns)}},
		},
	}
}

func newDriver(t *testing.T, p *runtime.Pipeline, c *fake.Clientset) *Driver {
	t.Helper()
	dir := t.TempDir()
	d, err := New(Options{Pipeline: p, NodeName: testNode, Client: c, RegistrarDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin")})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// held is what the node holds: reservations by key, instances by
// "gpuN profile@start", CDI spec owners.
type held struct {
	reservations map[string]*node.Reservation
	instances    map[string]mig.Instance
	cdi          []string
}

func nodeHolds(t *testing.T, p *runtime.Pipeline) held {
	t.Helper()
	h := held{reservations: map[string]*node.Reservation{}, instances: map[string]mig.Instance{}}
	if err := p.Node().Ledger().View(func(tx *node.LedgerTx) error {
		all, err := tx.List()
		for _, r := range all {
			h.reservations[r.SandboxID] = r
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	insts, err := p.Node().Backend().Instances()
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range insts {
		h.instances[placementKey(in.GPU, in.Profile, in.Start)] = in
	}
	if h.cdi, err = inject.CDISpecOwners(p.Node().Config().MIG.CDISpecDir, inject.CDIKind); err != nil {
		t.Fatal(err)
	}
	return h
}

func placementKey(gpu int, profile string, start int) string {
	return "gpu" + string(rune('0'+gpu)) + " " + profile + "@" + string(rune('0'+start))
}

type prep struct {
	ns, name string
	gpu      int
	profile  string
	start    int
	// refused is the rule the claim is refused for; "" when it is prepared.
	refused string
}

func TestPrepareUnprepare(t *testing.T) {
	handlers := map[string]string{"platform": "bulkhead-runc", "ml": "bulkhead-runc", "lab": "bulkhead", "agents": "bulkhead"}
	for _, tc := range []struct {
		name   string
		claims []prep
	}{
		{"a 3g.71gb slice", []prep{{ns: "platform", name: "a", gpu: 1, profile: "3g.71gb", start: 4}}},
		{"a profile the tier may not have", []prep{{ns: "agents", name: "a", gpu: 0, profile: "4g.71gb", start: 0, refused: "gpu.profile_too_large"}}},
		{"a slice for a gVisor pod", []prep{{ns: "lab", name: "a", gpu: 0, profile: "1g.18gb", start: 6, refused: runtime.RuleClaimMIGInSandbox}}},
		{"past the tenant's gpu_slices quota", []prep{
			{ns: "platform", name: "a", gpu: 0, profile: "3g.71gb", start: 4},
			{ns: "platform", name: "b", gpu: 1, profile: "3g.71gb", start: 4, refused: "quota.gpu_slices"},
		}},
		{"devices that overlap", []prep{
			{ns: "ml", name: "a", gpu: 0, profile: "3g.71gb", start: 4},
			{ns: "ml", name: "b", gpu: 0, profile: "1g.18gb", start: 6, refused: runtime.RulePlacementTaken},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := openPipeline(t, cfg)
			d := newDriver(t, p, testCluster(nil, handlers))
			ctx := context.Background()
			var claims []*resourcev1.ResourceClaim
			var prepared []prep
			for _, c := range tc.claims {
				claim := claimOn(c.ns, c.name, migdra.DeviceName(c.gpu, c.profile, c.start))
				res, err := d.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
				if err != nil {
					t.Fatal(err)
				}
				r := res[claim.UID]
				before := len(prepared)
				if c.refused != "" {
					if r.Err == nil || !strings.Contains(r.Err.Error(), "["+c.refused+"]") {
						t.Fatalf("claim %s/%s: %v, want refused by %s", c.ns, c.name, r.Err, c.refused)
					}
					if c.refused != runtime.RulePlacementTaken && !strings.Contains(r.Err.Error(), "bundle revision") {
						t.Errorf("claim %s/%s: refusal %q names no bundle revision", c.ns, c.name, r.Err)
					}
				} else {
					if r.Err != nil {
						t.Fatalf("claim %s/%s: %v", c.ns, c.name, r.Err)
					}
					want := inject.CDIName(inject.CDIKind, string(claim.UID))
					if len(r.Devices) != 1 || len(r.Devices[0].CDIDeviceIDs) != 1 || r.Devices[0].CDIDeviceIDs[0] != want || r.Devices[0].DeviceName != migdra.DeviceName(c.gpu, c.profile, c.start) {
						t.Fatalf("claim %s/%s: devices %+v, want %s", c.ns, c.name, r.Devices, want)
					}
					// Prepared again: the same answer, nothing more held.
					again, err := d.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
					if err != nil || again[claim.UID].Err != nil || again[claim.UID].Devices[0].CDIDeviceIDs[0] != want {
						t.Fatalf("claim %s/%s prepared twice: %+v %v, want %s again", c.ns, c.name, again[claim.UID], err, want)
					}
					prepared = append(prepared, c)
					claims = append(claims, claim)
				}
				// Exactly the prepared claims are held, each at its placement.
				h := nodeHolds(t, p)
				if len(h.reservations) != len(prepared) || len(h.instances) != len(prepared) || len(h.cdi) != len(prepared) {
					t.Fatalf("after claim %s/%s (%d prepared before): reservations %d, instances %d, cdi specs %v; want %d of each",
						c.ns, c.name, before, len(h.reservations), len(h.instances), h.cdi, len(prepared))
				}
				for i, pc := range prepared {
					uid := string(claims[i].UID)
					res := h.reservations[uid]
					if res == nil || res.Claim == nil || res.GPU == nil || res.GPU.GPU != pc.gpu || res.GPU.Profile != pc.profile || res.GPU.Start != pc.start || res.Tenant != pc.ns {
						t.Fatalf("claim %s: reservation %+v, want %s at gpu%d start %d for tenant %s", uid, res, pc.profile, pc.gpu, pc.start, pc.ns)
					}
					in, ok := h.instances[placementKey(pc.gpu, pc.profile, pc.start)]
					if !ok || !strings.HasPrefix(in.UUID, "MIG-") {
						t.Fatalf("claim %s: instances %v, want a MIG instance at gpu%d %s@%d", uid, h.instances, pc.gpu, pc.profile, pc.start)
					}
					spec, err := os.ReadFile(filepath.Join(cfg.MIG.CDISpecDir, "bulkhead.dev-gpu_"+uid+".json"))
					if err != nil || !strings.Contains(string(spec), in.UUID) {
						t.Fatalf("claim %s: CDI spec %s (%v), want it to name %s", uid, spec, err, in.UUID)
					}
				}
			}
			// GC, which releases dead sandboxes, keeps every claim.
			if rep, err := p.Node().GC(ctx); err != nil || len(rep.Released) != 0 || len(rep.Instances) != 0 || len(rep.CDISpecs) != 0 {
				t.Fatalf("gc: %+v %v, want nothing released", rep, err)
			}
			// A restarted agent (a new pipeline and driver on the same node)
			// unprepares from the ledger alone; twice, and an unknown claim, is fine.
			p2 := openPipeline(t, cfg)
			d2 := newDriver(t, p2, testCluster(nil, handlers))
			objs := []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "platform", Name: "unknown"}, UID: "uid-unknown"}}
			for _, c := range claims {
				objs = append(objs, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID})
			}
			for range 2 {
				errs, err := d2.UnprepareResourceClaims(ctx, objs)
				if err != nil || len(errs) != len(objs) {
					t.Fatalf("unprepare: %v %v, want one entry per claim", errs, err)
				}
				for uid, err := range errs {
					if err != nil {
						t.Fatalf("unprepare %s: %v", uid, err)
					}
				}
			}
			if h := nodeHolds(t, p2); len(h.reservations)+len(h.instances)+len(h.cdi) != 0 {
				t.Fatalf("after unprepare: reservations %v, instances %v, cdi specs %v; want none", h.reservations, h.instances, h.cdi)
			}
		})
	}
}

// TestPublish starts the plugin as the agent does, with the kubelet's
// directories in a temporary one, and finds the node's ResourceSlices
// created through the API: every device mig/dra publishes for two H200s.
func TestPublish(t *testing.T) {
	cfg := testConfig(t)
	p := openPipeline(t, cfg)
	c := testCluster(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}, nil)
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, sub := range []string{"reg"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(Options{Pipeline: p, NodeName: testNode, Client: c, RegistrarDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	gpus, err := p.Node().Backend().GPUs()
	if err != nil {
		t.Fatal(err)
	}
	want, err := migdra.Publish(gpus, migdra.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wantDevices := 0
	for _, s := range want {
		wantDevices += len(s.Devices)
	}
	for _, sock := range []string{filepath.Join(dir, "reg", migdra.DriverName+"-reg.sock"), filepath.Join(dir, "plugin", "dra.sock")} {
		if st, err := os.Stat(sock); err != nil || st.Mode()&os.ModeSocket == 0 {
			t.Errorf("%s: %v, want the plugin's socket", sock, err)
		}
	}
	var got *resourcev1.ResourceSliceList
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err = c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Items) == len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got.Items) != len(want) {
		t.Fatalf("%d ResourceSlices after 20s, want %d", len(got.Items), len(want))
	}
	devices, counters := 0, 0
	for _, s := range got.Items {
		if s.Spec.Driver != migdra.DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != testNode || s.Spec.Pool.Name != testNode {
			t.Errorf("slice %s: driver %s node %v pool %s, want %s on %s", s.Name, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool.Name, migdra.DriverName, testNode)
		}
		devices += len(s.Spec.Devices)
		counters += len(s.Spec.SharedCounters)
	}
	if devices != wantDevices || counters != len(gpus) {
		t.Errorf("published %d devices and %d counter sets, want %d and %d", devices, counters, wantDevices, len(gpus))
	}

	// A pod places a 7g.141gb on gpu1 through the annotation: the next
	// publication offers nothing of gpu1.
	if err := p.Node().Ledger().Update(func(tx *node.LedgerTx) error {
		return tx.Put(&node.Reservation{SandboxID: "annotated", State: node.StateActive, Tenant: "ml", GPU: &mig.Placement{GPU: 1, Profile: "7g.141gb", Start: 0, Size: 8, Compute: 7, Tenant: "ml", Owner: "annotated"}})
	}); err != nil {
		t.Fatal(err)
	}
	if err := d.publish(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err = c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		onGPU1 := 0
		for _, s := range got.Items {
			for _, dev := range s.Spec.Devices {
				if strings.HasPrefix(dev.Name, "gpu1-") {
					onGPU1++
				}
			}
		}
		if onGPU1 == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gpu1 still offers %d devices 20s after a pod took it whole outside DRA", onGPU1)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	cfg := testConfig(t)
	p := openPipeline(t, cfg)
	c := fake.NewClientset()
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"complete", Options{Pipeline: p, NodeName: "n", Client: c, RegistrarDir: "/r", PluginDir: "/p"}, ""},
		{"no node", Options{Pipeline: p, Client: c, RegistrarDir: "/r", PluginDir: "/p"}, "node name"},
		{"no client", Options{Pipeline: p, NodeName: "n", RegistrarDir: "/r", PluginDir: "/p"}, "client"},
		{"relative dir", Options{Pipeline: p, NodeName: "n", Client: c, RegistrarDir: "r", PluginDir: "/p"}, `registrar dir "r"`},
		{"no pipeline", Options{NodeName: "n", Client: c, RegistrarDir: "/r", PluginDir: "/p"}, "pipeline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("New: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPrepareAfterReboot: a node that rebooted keeps its ledger but loses
// its MIG instances and its CDI specs (/var/run/cdi). The kubelet prepares
// its claims again; each gets its slice back at the same placement and the
// same CDI device.
func TestPrepareAfterReboot(t *testing.T) {
	for _, lost := range []struct {
		name           string
		instance, spec bool
	}{
		{"instance and spec", true, true},
		{"instance", true, false},
		{"spec", false, true},
		{"nothing", false, false},
	} {
		t.Run(lost.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := openPipeline(t, cfg)
			d := newDriver(t, p, testCluster(nil, map[string]string{"ml": "bulkhead-runc"}))
			ctx := context.Background()
			claim := claimOn("ml", "a", migdra.DeviceName(0, "2g.35gb", 2))
			first, err := d.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
			if err != nil || first[claim.UID].Err != nil {
				t.Fatalf("prepare: %v %v", err, first[claim.UID].Err)
			}
			h := nodeHolds(t, p)
			in := h.instances[placementKey(0, "2g.35gb", 2)]
			if lost.instance {
				if err := p.Node().Backend().Destroy(in.GPU, in.GI, in.CI); err != nil {
					t.Fatal(err)
				}
			}
			if lost.spec {
				if err := inject.RemoveCDISpec(cfg.MIG.CDISpecDir, inject.CDIKind, string(claim.UID)); err != nil {
					t.Fatal(err)
				}
			}
			again, err := d.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
			if err != nil || again[claim.UID].Err != nil {
				t.Fatalf("prepare after reboot: %v %v", err, again[claim.UID].Err)
			}
			if got, want := again[claim.UID].Devices[0].CDIDeviceIDs, first[claim.UID].Devices[0].CDIDeviceIDs; got[0] != want[0] {
				t.Errorf("CDI device %v, want %v as before", got, want)
			}
			h = nodeHolds(t, p)
			now, ok := h.instances[placementKey(0, "2g.35gb", 2)]
			res := h.reservations[string(claim.UID)]
			if !ok || len(h.instances) != 1 || res == nil || res.Instance == nil || res.Instance.UUID != now.UUID {
				t.Fatalf("instances %v, reservation %+v: want one instance at gpu0 2g.35gb@2, the one the ledger records", h.instances, res)
			}
			spec, err := os.ReadFile(filepath.Join(cfg.MIG.CDISpecDir, "bulkhead.dev-gpu_"+string(claim.UID)+".json"))
			if err != nil || !strings.Contains(string(spec), now.UUID) {
				t.Fatalf("CDI spec %s (%v), want it to name %s", spec, err, now.UUID)
			}
		})
	}
}

// TestResourcesWithdrawSlicesHeldOutsideDRA: a slice a pod holds through
// the annotation is not offered to the scheduler, nor is anything that
// overlaps it; the rest of the GPU and the counters stay.
func TestResourcesWithdrawSlicesHeldOutsideDRA(t *testing.T) {
	gpus := []mig.GPUInfo{
		{Index: 0, UUID: "GPU-0", Model: "h200", MIGEnabled: true},
		{Index: 1, UUID: "GPU-1", Model: "h200", MIGEnabled: true},
	}
	for _, tc := range []struct {
		name            string
		outside         []mig.Placement
		offered, absent []string
		gpu1Devices     int // -1: as many as gpu0 has with nothing held
	}{
		{name: "nothing held", offered: []string{"gpu0-3g-71gb-at4", "gpu0-1g-18gb-at6", "gpu1-7g-141gb-at0"}, gpu1Devices: -1},
		{
			name:        "a 3g.71gb at 4 on gpu0",
			outside:     []mig.Placement{{GPU: 0, Profile: "3g.71gb", Start: 4, Size: 4, Compute: 3}},
			offered:     []string{"gpu0-4g-71gb-at0", "gpu0-1g-18gb-at3", "gpu1-3g-71gb-at4"},
			absent:      []string{"gpu0-3g-71gb-at4", "gpu0-1g-18gb-at6", "gpu0-2g-35gb-at4", "gpu0-7g-141gb-at0"},
			gpu1Devices: -1,
		},
		{
			name:        "gpu1 held whole",
			outside:     []mig.Placement{{GPU: 1, Profile: "whole", Start: 0, Size: 8, Compute: 7}},
			offered:     []string{"gpu0-7g-141gb-at0"},
			absent:      []string{"gpu1-1g-18gb-at0"},
			gpu1Devices: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Resources(testNode, gpus, tc.outside)
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]bool{}
			perGPU := map[string]int{}
			counters := 0
			for _, s := range res.Pools[testNode].Slices {
				counters += len(s.SharedCounters)
				for _, d := range s.Devices {
					names[d.Name] = true
					perGPU[strings.SplitN(d.Name, "-", 2)[0]]++
				}
			}
			for _, n := range tc.offered {
				if !names[n] {
					t.Errorf("%s not offered", n)
				}
			}
			for _, n := range tc.absent {
				if names[n] {
					t.Errorf("%s offered, though it overlaps a slice held outside DRA", n)
				}
			}
			want := tc.gpu1Devices
			if want < 0 {
				all, _ := Resources(testNode, gpus[:1], nil)
				want = len(all.Pools[testNode].Slices[1].Devices)
			}
			if perGPU["gpu1"] != want || counters != 2 {
				t.Errorf("gpu1 offers %d devices, %d counter sets; want %d and 2", perGPU["gpu1"], counters, want)
			}
		})
	}
}
