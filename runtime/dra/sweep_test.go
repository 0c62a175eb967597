package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	migdra "github.com/bulkhead-runtime/bulkhead/mig/dra"
)

// prepareInCluster creates claim in the cluster and prepares it on d.
func prepareInCluster(t *testing.T, d *Driver, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := d.PrepareResourceClaims(ctx, []*resourcev1.ResourceClaim{claim})
	if err != nil || res[claim.UID].Err != nil {
		t.Fatalf("prepare %s/%s: %v %v", claim.Namespace, claim.Name, err, res[claim.UID].Err)
	}
}

// TestSweep prepares two claims, does something to the first in the API
// server, sweeps, and finds the first released (no reservation, instance
// or CDI spec) or kept; the second, still allocated here, is always kept.
func TestSweep(t *testing.T) {
	deleteClaim := func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
		if err := c.ResourceV1().ResourceClaims(claim.Namespace).Delete(context.Background(), claim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	updateClaim := func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
		if _, err := c.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(context.Background(), claim, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		// change does it to the first claim in the API server.
		change func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim)
		// after is how long after the preparation the sweep runs.
		after time.Duration
		// released is the reason the first claim is released for; "" when
		// it is kept.
		released string
		// failed is what the sweep's error says; "" when none.
		failed string
	}{
		{
			name: "still allocated here", change: func(*testing.T, *fake.Clientset, *resourcev1.ResourceClaim) {},
			after: 3 * time.Minute,
		},
		{name: "deleted", change: deleteClaim, after: 3 * time.Minute, released: "no longer exists"},
		{
			name: "recreated under another uid",
			change: func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
				deleteClaim(t, c, claim)
				again := claimOn(claim.Namespace, claim.Name, claim.Status.Allocation.Devices.Results[0].Device)
				again.UID = "uid-recreated"
				if _, err := c.ResourceV1().ResourceClaims(claim.Namespace).Create(context.Background(), again, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			after: 3 * time.Minute, released: "recreated (uid uid-recreated)",
		},
		{
			name: "deallocated",
			change: func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
				claim = claim.DeepCopy()
				claim.Status.Allocation = nil
				updateClaim(t, c, claim)
			},
			after: 3 * time.Minute, released: "no longer allocated",
		},
		{
			name: "allocated on another node",
			change: func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
				claim = claim.DeepCopy()
				claim.Status.Allocation.Devices.Results[0].Pool = "other-node"
				updateClaim(t, c, claim)
			},
			after: 3 * time.Minute, released: "in pool other-node",
		},
		{
			name: "the API server fails",
			change: func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
				deleteClaim(t, c, claim)
				c.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, kruntime.Object, error) {
					if a.(k8stesting.GetAction).GetName() != claim.Name {
						return false, nil, nil
					}
					return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
				})
			},
			after: 3 * time.Minute, failed: "etcd is down",
		},
		{
			name: "forbidden",
			change: func(t *testing.T, c *fake.Clientset, claim *resourcev1.ResourceClaim) {
				deleteClaim(t, c, claim)
				c.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, kruntime.Object, error) {
					return true, nil, apierrors.NewForbidden(resourcev1.Resource("resourceclaims"), claim.Name, errors.New("no rule"))
				})
			},
			after: 3 * time.Minute, failed: "forbidden",
		},
		{name: "deleted within the grace period", change: deleteClaim, after: ClaimGrace - 10*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := openPipeline(t, cfg)
			c := testCluster(nil, map[string]string{"ml": "bulkhead-runc"})
			d := newDriver(t, p, c)
			ctx := context.Background()
			victim := claimOn("ml", "a", migdra.DeviceName(0, "3g.71gb", 4))
			bystander := claimOn("ml", "b", migdra.DeviceName(1, "2g.35gb", 2))
			prepareInCluster(t, d, c, victim)
			prepareInCluster(t, d, c, bystander)
			tc.change(t, c, victim)

			swept, err := d.sweep(ctx, time.Now().Add(tc.after))
			if tc.failed == "" && err != nil || tc.failed != "" && (err == nil || !strings.Contains(err.Error(), tc.failed)) {
				t.Fatalf("sweep: %v, want error %q", err, tc.failed)
			}
			h := nodeHolds(t, p)
			vuid, buid := string(victim.UID), string(bystander.UID)
			if h.reservations[buid] == nil || !slices.Contains(h.cdi, buid) {
				t.Errorf("the claim still allocated here: reservation %+v, cdi specs %v; want it kept", h.reservations[buid], h.cdi)
			}
			if _, ok := h.instances[placementKey(1, "2g.35gb", 2)]; !ok {
				t.Errorf("instances %v: the claim still allocated here lost its instance", h.instances)
			}
			_, instance := h.instances[placementKey(0, "3g.71gb", 4)]
			_, spec := os.Stat(filepath.Join(cfg.MIG.CDISpecDir, "bulkhead.dev-gpu_"+vuid+".json"))
			if tc.released == "" {
				if len(swept) != 0 || h.reservations[vuid] == nil || !instance || spec != nil {
					t.Fatalf("swept %+v; reservation %+v, instance %v, spec %v: want the claim kept", swept, h.reservations[vuid], instance, spec)
				}
				return
			}
			if len(swept) != 1 || swept[0].UID != vuid || swept[0].Namespace != "ml" || swept[0].Name != "a" || !strings.Contains(swept[0].Why, tc.released) {
				t.Fatalf("swept %+v, want claim ml/a (%s) for %q", swept, vuid, tc.released)
			}
			if h.reservations[vuid] != nil || instance || !os.IsNotExist(spec) || len(h.reservations) != 1 || len(h.instances) != 1 || len(h.cdi) != 1 {
				t.Fatalf("after the sweep: reservations %v, instances %v, cdi specs %v; want only the claim still allocated here", h.reservations, h.instances, h.cdi)
			}
			// A second sweep finds nothing more to do.
			if again, err := d.sweep(ctx, time.Now().Add(tc.after)); err != nil || len(again) != 0 {
				t.Fatalf("second sweep: %+v %v, want nothing", again, err)
			}
		})
	}
}

// TestSweepOnStart: a claim the kubelet never unprepared, deleted while
// the agent was down, is released once the restarted plugin has published
// the node's slices.
func TestSweepOnStart(t *testing.T) {
	cfg := testConfig(t)
	p := openPipeline(t, cfg)
	c := testCluster(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid"}}, map[string]string{"ml": "bulkhead-runc"})
	claim := claimOn("ml", "a", migdra.DeviceName(0, "1g.18gb", 0))
	prepareInCluster(t, newDriver(t, p, c), c, claim)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.ResourceV1().ResourceClaims("ml").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Mkdir(filepath.Join(dir, "reg"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A sweep interval longer than the test: only the sweep at start can
	// release the claim.
	d, err := New(Options{Pipeline: p, NodeName: testNode, Client: c, RegistrarDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "plugin"), SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d.now = func() time.Time { return time.Now().Add(ClaimGrace + time.Minute) }
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h := nodeHolds(t, p)
		if len(h.reservations)+len(h.instances)+len(h.cdi) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20s after start: reservations %v, instances %v, cdi specs %v; want the deleted claim released", h.reservations, h.instances, h.cdi)
		}
	}
}
