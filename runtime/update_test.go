package runtime

import (
	"context"
	"errors"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

const gi = int64(1) << 30

func TestChargeAfter(t *testing.T) {
	live := map[string]node.ContainerLimits{"sb": {}, "a": {MemoryBytes: 2 * gi}, "b": {MemoryBytes: 3 * gi}}
	tests := []struct {
		name   string
		charge int64
		id     string
		limit  int64
		want   int64
	}{
		{name: "kubelet pod: a grows by 4Gi", charge: 5 * gi, id: "a", limit: 6 * gi, want: 9 * gi},
		{name: "kubelet pod: a shrinks", charge: 5 * gi, id: "a", limit: gi, want: 4 * gi},
		{name: "a lifts its limit", charge: 5 * gi, id: "a", limit: 0, want: 3 * gi},
		{name: "unchanged", charge: 5 * gi, id: "b", limit: 3 * gi, want: 5 * gi},
		{name: "new container inside the admitted total", charge: 8 * gi, id: "c", limit: 3 * gi, want: 8 * gi},
		{name: "new container past the admitted total", charge: 5 * gi, id: "c", limit: 3 * gi, want: 8 * gi},
		{name: "pod admitted without a total: a new container is charged", charge: 0, id: "c", limit: gi, want: 6 * gi},
		{name: "charge below the live sum is raised to it", charge: 0, id: "a", limit: 2 * gi, want: 5 * gi},
		{name: "pod-level limit above the sum: shrink keeps what the pod holds", charge: 10 * gi, id: "a", limit: gi, want: 9 * gi},
	}
	for _, tt := range tests {
		if got := chargeAfter(tt.charge, live, tt.id, tt.limit); got != tt.want {
			t.Errorf("%s: chargeAfter(%d, %s=%d) = %d, want %d", tt.name, tt.charge, tt.id, tt.limit, got, tt.want)
		}
	}
}

// updatePod is a pod of tenant agents (untrusted, memory quota 8Gi in
// testTenants) placed through the real pipeline on the default bundle,
// admitted with sandbox memory total, with one workload container "app"
// limited to app bytes (0: none).
type updatePod struct {
	*Pod
	dir string
}

func newUpdatePod(t testing.TB, pl *Pipeline, name string, total, app int64) *updatePod {
	t.Helper()
	// The test's pods share one pipeline, as the node agent's do.
	p, err := NewPod(PodOptions{Config: pl.node.Config(), Runtime: policy.RuntimeGVisor, Pipeline: pl, DeleteTask: func(context.Context, string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	up := &updatePod{Pod: p, dir: t.TempDir()}
	ann := map[string]string{}
	if total > 0 {
		ann[cri.AnnotationSandboxMemory] = strconv.FormatInt(total, 10)
	}
	_, spec := sandboxSpec("agents", name, ann)
	if err := up.create(name, spec); err != nil {
		t.Fatalf("sandbox %s: %v", name, err)
	}
	if err := up.create(name+"-app", containerSpec("app", app)); err != nil {
		t.Fatalf("container app of %s: %v", name, err)
	}
	t.Cleanup(func() { p.Deleted(context.Background(), name) })
	return up
}

// containerSpec is a workload container's spec limited to limit bytes (0: none).
func containerSpec(name string, limit int64) *specs.Spec {
	_, sandbox := sandboxSpec("agents", "any", nil)
	spec := &specs.Spec{Annotations: map[string]string{cri.AnnotationContainerType: "container", cri.AnnotationContainerName: name}, Linux: &specs.Linux{Namespaces: sandbox.Linux.Namespaces}}
	if limit != 0 {
		spec.Linux.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}}
	}
	return spec
}

func (up *updatePod) create(id string, spec *specs.Spec) error {
	bundle := filepath.Join(up.dir, id)
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}
	if err := writeSpecIfChanged(bundle, nil, spec); err != nil {
		return err
	}
	return up.Create(context.Background(), id, bundle, func(string) error { return nil })
}

// charged is the pod's charge as the ledger holds it.
func (up *updatePod) charged(t *testing.T) int64 {
	t.Helper()
	var res *node.Reservation
	if err := up.pipeline.node.Ledger().View(func(tx *node.LedgerTx) error {
		var err error
		res, err = tx.Get(up.sandbox.ID)
		return err
	}); err != nil || res == nil {
		t.Fatalf("reservation of %s: %+v, %v", up.sandbox.ID, res, err)
	}
	if res.MemoryBytes != up.admission.Reservation.MemoryBytes {
		t.Errorf("ledger charges %d, the shim believes %d", res.MemoryBytes, up.admission.Reservation.MemoryBytes)
	}
	return res.MemoryBytes
}

// TestPodUpdateJudgedAgainstQuota: a task update of a container's memory is
// charged to its pod and refused past the tenant's quota with the sandbox
// create's rule and message; a refused or failed update leaves the
// container (the task service is not called, or its failure is undone) and
// the ledger as they were.
func TestPodUpdateJudgedAgainstQuota(t *testing.T) {
	ctx := context.Background()
	pl := testPipeline(t)
	// agents: memory quota 8Gi. Pod one holds 2Gi, pod two 3Gi.
	one := newUpdatePod(t, pl, "one", 2*gi, 2*gi)
	two := newUpdatePod(t, pl, "two", 3*gi, 3*gi)

	applied := 0
	apply := func() error { applied++; return nil }
	update := func(up *updatePod, limit int64, act func() error) error {
		return up.Update(ctx, up.sandbox.ID+"-app", specinputtest.ResourcesAny(t, specinputtest.MemoryResources(limit)), act)
	}

	// 2Gi + 3Gi held; one asks for 6Gi: 3 + 6 > 8.
	err := update(one, 6*gi, apply)
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "[quota.memory] ") || !strings.Contains(err.Error(), "one-app: update: bulkhead refused pod agents/one (tenant agents)") {
		t.Fatalf("update past the quota: %v, want a [quota.memory] refusal naming the container and the pod", err)
	}
	if applied != 0 || one.charged(t) != 2*gi || one.sandbox.Limits["one-app"].MemoryBytes != 2*gi {
		t.Fatalf("after a refused update: applied %d, charge %d, limits %+v; want nothing changed", applied, one.charged(t), one.sandbox.Limits)
	}

	// 5Gi fits: 3 + 5 = 8.
	if err := update(one, 5*gi, apply); err != nil {
		t.Fatalf("update within the quota: %v", err)
	}
	if applied != 1 || one.charged(t) != 5*gi || one.sandbox.Limits["one-app"].MemoryBytes != 5*gi {
		t.Fatalf("after 5Gi: applied %d, charge %d, limits %+v", applied, one.charged(t), one.sandbox.Limits)
	}
	if sb, err := one.state.Load(one.sandbox.ID); err != nil || sb.Limits["one-app"].MemoryBytes != 5*gi {
		t.Errorf("record after the update: %+v, %v", sb, err)
	}

	// Now the tenant is full: two may not grow by a byte.
	if err := update(two, 3*gi+1, apply); err == nil || !strings.Contains(err.Error(), "[quota.memory] ") {
		t.Errorf("growth of a full tenant: %v, want a [quota.memory] refusal", err)
	}

	// The runtime's failure undoes the charge written before it.
	failed := errors.New("runc update: cgroup busy")
	if err := update(two, 2*gi, func() error { return failed }); !errors.Is(err, failed) || two.charged(t) != 3*gi {
		t.Errorf("failed shrink: %v, charge %d; want the runtime's error and 3Gi", err, two.charged(t))
	}
	if err := update(one, 4*gi, apply); err != nil || one.charged(t) != 4*gi {
		t.Fatalf("shrink to 4Gi: %v, charge %d", err, one.charged(t))
	}
	if err := update(two, 4*gi, func() error { return failed }); !errors.Is(err, failed) || two.charged(t) != 3*gi || two.sandbox.Limits["two-app"].MemoryBytes != 3*gi {
		t.Errorf("failed growth: %v, charge %d, limits %+v; want the runtime's error and nothing changed", err, two.charged(t), two.sandbox.Limits)
	}
	if err := update(two, 4*gi, apply); err != nil || two.charged(t) != 4*gi {
		t.Errorf("growth into the freed quota: %v, charge %d", err, two.charged(t))
	}

	// CPU only: nothing charged, nothing refused, even with the tenant full.
	before := applied
	cpu := &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: new(uint64)}}
	if err := one.Update(ctx, "one-app", specinputtest.ResourcesAny(t, cpu), apply); err != nil || applied != before+1 || one.charged(t) != 4*gi {
		t.Errorf("CPU-only update: %v, charge %d", err, one.charged(t))
	}

	// Lifting the limit is a limit missing: warn by default, so it passes,
	// and the pod is no longer charged the container's limit.
	if err := update(one, -1, apply); err != nil || one.charged(t) != 0 || one.sandbox.Limits["one-app"].MemoryBytes != 0 {
		t.Errorf("lifting the limit: %v, charge %d, limits %+v", err, one.charged(t), one.sandbox.Limits)
	}

	// Bad input refuses and changes nothing.
	before = applied
	if err := one.Update(ctx, "one-app", &anypb.Any{TypeUrl: "x/WindowsResources"}, apply); !errors.As(err, &refused) || !strings.Contains(err.Error(), "["+RuleResourcesInvalid+"] ") || applied != before {
		t.Errorf("undecodable resources: %v", err)
	}
	if err := one.Update(ctx, "nosuch", specinputtest.ResourcesAny(t, specinputtest.MemoryResources(gi)), apply); err == nil || !strings.Contains(err.Error(), "not a live container") || applied != before {
		t.Errorf("unknown container: %v", err)
	}
}

// TestPodCreateChargesLimitPastTheAdmittedTotal: a container whose memory
// limit takes its pod past the total it was admitted with (an update made
// before the container started reaches the shim only as its create) is
// charged, and refused past the quota before the task service creates it.
func TestPodCreateChargesLimitPastTheAdmittedTotal(t *testing.T) {
	up := newUpdatePod(t, testPipeline(t), "pre", 2*gi, 2*gi)
	created := 0
	create := func(id string, limit int64) error {
		bundle := filepath.Join(up.dir, id)
		if err := os.MkdirAll(bundle, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeSpecIfChanged(bundle, nil, containerSpec(id, limit)); err != nil {
			t.Fatal(err)
		}
		return up.Create(context.Background(), id, bundle, func(string) error { created++; return nil })
	}
	if err := create("big", 7*gi); err == nil || !strings.Contains(err.Error(), "[quota.memory] ") || created != 0 || up.charged(t) != 2*gi {
		t.Fatalf("container of 7Gi beside 2Gi (quota 8Gi): %v, created %d, charge %d; want a [quota.memory] refusal and nothing created", err, created, up.charged(t))
	}
	if _, ok := up.sandbox.Limits["big"]; ok {
		t.Error("the refused container is in the pod's limits")
	}
	if err := create("side", 5*gi); err != nil || created != 1 || up.charged(t) != 7*gi {
		t.Fatalf("container of 5Gi beside 2Gi: %v, created %d, charge %d; want 7Gi", err, created, up.charged(t))
	}
	// Deleting it keeps the charge (the kubelet's total counts it), and a
	// container within the charge is not asked again.
	up.Deleted(context.Background(), "side")
	if err := create("again", 5*gi); err != nil || up.charged(t) != 7*gi {
		t.Errorf("container within the charge: %v, charge %d", err, up.charged(t))
	}
}

// TestPodUpdateLimitMissingFollowsEnforcement: a container updated to no
// memory limit is quota.memory_limit_missing at the tenant's enforcement:
// deny refuses the update.
func TestPodUpdateLimitMissingFollowsEnforcement(t *testing.T) {
	cfg := testConfig(t)
	// Enforcement is the bundle's own data: the test bundle whose
	// security team made the rule deny.
	cfg.Policy.Bundle = policyBundle(t, policytest.Enforcement(map[string]string{"quota.memory_limit_missing": "deny"}))
	pl, err := OpenPipeline(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpdatePod(t, pl, "strict", 2*gi, 2*gi)
	applied := 0
	err = up.Update(context.Background(), "strict-app", specinputtest.ResourcesAny(t, specinputtest.MemoryResources(-1)), func() error { applied++; return nil })
	if err == nil || !strings.Contains(err.Error(), "[quota.memory_limit_missing] ") || applied != 0 || up.charged(t) != 2*gi {
		t.Fatalf("lifting the limit under deny: %v, applied %d, charge %d; want a [quota.memory_limit_missing] refusal and nothing changed", err, applied, up.charged(t))
	}
}

// BenchmarkPodUpdate is what judging a task update adds before the runtime
// applies it: growth (the pod admitted again, in a ledger transaction
// written before) and a shrink (a container decision, the ledger written
// after), alternately.
func BenchmarkPodUpdate(b *testing.B) {
	pl, err := OpenPipeline(context.Background(), testConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	up := newUpdatePod(b, pl, "bench", 2*gi, 2*gi)
	grow, shrink := specinputtest.ResourcesAny(b, specinputtest.MemoryResources(3*gi)), specinputtest.ResourcesAny(b, specinputtest.MemoryResources(2*gi))
	i := 0
	for b.Loop() {
		r := grow
		if i%2 == 1 {
			r = shrink
		}
		i++
		if err := up.Update(context.Background(), "bench-app", r, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
