package runtime

import (
	"context"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput"
)

// TestNodeRefusesHostNetworkSandbox: a sandbox spec without a network
// namespace (what containerd writes for hostNetwork) is judged as host
// network by the node itself, whatever the webhook said.
func TestNodeRefusesHostNetworkSandbox(t *testing.T) {
	p := testPipeline(t)
	ctx := context.Background()
	for _, tt := range []struct {
		ns    string
		allow bool
	}{{"agents", false}, {"research", false}, {"platform", true}} {
		sb, spec := sandboxSpec(tt.ns, "hostnet", nil)
		spec.Linux.Namespaces = slices.DeleteFunc(spec.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.NetworkNamespace })
		sb = SandboxFromSpec(sb.ID, sb.Bundle, spec)
		sb.Runtime = policy.RuntimeGVisor
		_, err := place(t, p, sb, spec)
		if tt.allow {
			if err != nil {
				t.Errorf("%s: %v", tt.ns, err)
			}
			_ = p.Node().Release(ctx, sb.ID)
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "workload.host_namespace") || !strings.Contains(err.Error(), "host_network") {
			t.Errorf("%s: Admit of a host-network sandbox = %v, want workload.host_namespace (host_network)", tt.ns, err)
		}
	}
	_ = p.node.Ledger().View(func(tx *node.LedgerTx) error {
		if all, _ := tx.List(); len(all) != 0 {
			t.Errorf("refusals left %d reservations", len(all))
		}
		return nil
	})
}

// TestAdmitContainerJudgesTheSpec: every container create is judged from
// the OCI spec containerd hands the shim.
func TestAdmitContainerJudgesTheSpec(t *testing.T) {
	p := testPipeline(t)
	ctx := context.Background()
	bind := func(src string, opts ...string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/host", Type: "bind", Source: src, Options: append([]string{"rbind"}, opts...)})
		}
	}
	addCaps := func(caps ...string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			c := s.Process.Capabilities
			c.Bounding, c.Effective, c.Permitted = append(c.Bounding, caps...), append(c.Effective, caps...), append(c.Permitted, caps...)
		}
	}
	device := func(path string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: path, Type: "c"})
		}
	}
	noNetNS := func(s *specs.Spec) {
		s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.NetworkNamespace })
	}
	tests := []struct {
		ns   string
		edit func(*specs.Spec)
		rule string // "" allows
	}{
		{"agents", func(*specs.Spec) {}, ""},
		{"agents", bind("/"), "workload.host_path"},
		{"agents", bind("/", "ro"), "workload.host_path"},
		{"agents", bind("/var/lib/kubelet/pods"), "workload.host_path"},
		{"agents", bind("/var/lib/kubelet/pods/uid-1/../uid-2/volumes"), "workload.host_path"},
		{"agents", bind("/etc/bulkhead"), "workload.host_path"},
		{"agents", bind("/var/lib/bulkhead"), "workload.host_path"},
		{"agents", bind("//dev/infiniband/uverbs0"), "rdma.device_forbidden"},
		{"agents", device("/dev/infiniband/uverbs0"), "rdma.device_forbidden"},
		{"agents", device("/dev/kvm"), "workload.device_forbidden"},
		{"agents", addCaps("CAP_SYS_ADMIN"), "workload.capability"},
		{"agents", addCaps("CAP_NET_ADMIN"), "workload.capability"},
		{"agents", noNetNS, "workload.host_namespace"},
		{"research", bind("/"), "workload.host_path"},
		{"research", addCaps("CAP_SYS_ADMIN"), "workload.capability"},
		{"platform", bind("/"), ""},
		{"platform", addCaps("CAP_SYS_ADMIN"), ""},
	}
	for _, tt := range tests {
		sb, _ := sandboxSpec(tt.ns, "pod", nil)
		sb.ID, sb.UID = "sb1", "uid-1"
		spec := specinputtest.CRISpec()
		tt.edit(spec)
		err := p.AdmitContainer(ctx, sb, nil, "c1", spec)
		switch {
		case tt.rule == "" && err != nil:
			t.Errorf("%s %+v: refused: %v", tt.ns, spec.Mounts[len(spec.Mounts)-1], err)
		case tt.rule != "" && (err == nil || !strings.Contains(err.Error(), "["+tt.rule+"] ")):
			t.Errorf("%s: AdmitContainer = %v, want a refusal naming %s", tt.ns, err, tt.rule)
		case err != nil && !strings.HasPrefix(err.Error(), "bulkhead refused pod "+tt.ns+"/pod"):
			t.Errorf("refusal %q does not read like a sandbox refusal", err)
		}
	}
}

// testPipelineEnforcing is testPipeline on policyBundle with
// data.bulkhead.enforcement set to enforcement (the signed bundle's
// setting; the data file may not change it).
func testPipelineEnforcing(t *testing.T, enforcement map[string]string) *Pipeline {
	t.Helper()
	cfg := testConfig(t)
	cfg.Policy.Bundle = policyBundle(t, policytest.Enforcement(enforcement))
	p, err := OpenPipeline(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestNodeRefusesUnlimitedSidecar is issue 24's attack on the node: a 1Mi
// container beside one without a memory limit. The kubelet sums the limits
// into the sandbox's io.kubernetes.cri.sandbox-memory (1Mi, the unlimited
// one counting 0), so the sandbox passes; with
// quota.memory_limit_missing: deny the unlimited container's create is
// refused, and by default it is allowed with the rule as a warning.
func TestNodeRefusesUnlimitedSidecar(t *testing.T) {
	ctx := context.Background()
	for _, deny := range []bool{false, true} {
		p := testPipeline(t)
		if deny {
			p = testPipelineEnforcing(t, map[string]string{"quota.memory_limit_missing": "deny"})
		}
		sb, spec := sandboxSpec("agents", "sidecar", map[string]string{cri.AnnotationSandboxMemory: "1048576"})
		sb.ID, sb.UID = "sb1", "uid-1" // criSpec's sandbox and pod
		if _, err := place(t, p, sb, spec); err != nil {
			t.Fatalf("deny=%v: the 1Mi sandbox refused: %v", deny, err)
		}
		main := specinputtest.CRISpec()
		specinputtest.WithMemoryLimit(1 << 20)(main)
		if err := p.AdmitContainer(ctx, sb, nil, "c1", main); err != nil {
			t.Errorf("deny=%v: the 1Mi container refused: %v", deny, err)
		}
		sidecar := specinputtest.CRISpec()
		sidecar.Annotations[cri.AnnotationContainerName] = "sidecar"
		specinputtest.WithoutMemoryLimit(sidecar)
		err := p.AdmitContainer(ctx, sb, nil, "c2", sidecar)
		switch {
		case !deny && err != nil:
			t.Errorf("warn: the unlimited sidecar refused: %v", err)
		case deny && (err == nil || !strings.Contains(err.Error(), "[quota.memory_limit_missing] ") || !strings.Contains(err.Error(), `container "sidecar" sets no memory limit`)):
			t.Errorf("deny: AdmitContainer of the unlimited sidecar = %v, want a refusal naming quota.memory_limit_missing and the container", err)
		}
		if !deny {
			d, err := p.decider.Decide(ctx, specinput.Container(podOf(sb), "c2", sidecar, dirsOf(p.node.Config()), nil))
			if err != nil || !slices.ContainsFunc(d.Reasons, func(r policy.Reason) bool {
				return r.Rule == "quota.memory_limit_missing" && r.Enforcement == policy.EnforceWarn
			}) {
				t.Errorf("warn: decision %+v (%v) lacks quota.memory_limit_missing as a warning", d, err)
			}
		}
		_ = p.Node().Release(ctx, sb.ID)
	}
}

// TestAdmitContainerJudgesVolumeTypes: below trusted the node refuses a
// container mounting a volume of a type outside Pod Security
// "restricted"'s (workload.volume_type), as the webhook does, except where
// the volume may be a claim's: the node cannot tell an inline NFS, iSCSI,
// FC, CSI or FlexVolume source from a persistentVolumeClaim of that
// plugin, and the tier allows claims (only the webhook refuses those).
func TestAdmitContainerJudgesVolumeTypes(t *testing.T) {
	p := testPipeline(t)
	ctx := context.Background()
	tests := []struct {
		ns, plugin string
		rule       string // "" allows
	}{
		{"agents", "kubernetes.io~empty-dir", ""},
		{"agents", "kubernetes.io~csi", ""},
		{"agents", "kubernetes.io~nfs", ""},
		{"agents", "kubernetes.io~iscsi", ""},
		{"agents", "vendor~driver", ""},
		{"agents", "kubernetes.io~git-repo", "workload.volume_type"},
		{"agents", "kubernetes.io~rbd", "workload.volume_type"},
		{"research", "kubernetes.io~git-repo", "workload.volume_type"},
		{"platform", "kubernetes.io~git-repo", ""},
		{"platform", "kubernetes.io~rbd", ""},
	}
	for _, tt := range tests {
		sb, _ := sandboxSpec(tt.ns, "pod", nil)
		sb.ID, sb.UID = "sb1", "uid-1"
		spec := specinputtest.CRISpec()
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/var/lib/kubelet/pods/uid-1/volumes/" + tt.plugin + "/v", Options: []string{"rbind"}})
		err := p.AdmitContainer(ctx, sb, nil, "c1", spec)
		switch {
		case tt.rule == "" && err != nil:
			t.Errorf("%s %s: refused: %v", tt.ns, tt.plugin, err)
		case tt.rule != "" && (err == nil || !strings.Contains(err.Error(), "["+tt.rule+"] ")):
			t.Errorf("%s %s: AdmitContainer = %v, want a refusal naming %s", tt.ns, tt.plugin, err, tt.rule)
		}
	}
	// An image volume, the pod's own in containerd's state: a type below
	// trusted, not a host path.
	sb, _ := sandboxSpec("agents", "pod", nil)
	sb.ID, sb.UID = "sb1", "uid-1"
	spec := specinputtest.CRISpec()
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/model", Type: "bind", Source: "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1/4e5f", Options: []string{"rbind", "ro"}})
	if err := p.AdmitContainer(ctx, sb, nil, "c1", spec); err == nil || !strings.Contains(err.Error(), "[workload.volume_type] ") || strings.Contains(err.Error(), "workload.host_path") {
		t.Errorf("image volume: AdmitContainer = %v, want workload.volume_type alone", err)
	}
}
