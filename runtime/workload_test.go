package runtime

import (
	"context"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	testnode "github.com/bulkhead-runtime/bulkhead/test/node"
)

// criSpec is a container spec as containerd's CRI plugin writes it for a pod
// with UID "uid-1" in sandbox "sb1": the pod's own binds, default
// capabilities, masked paths and every namespace.
func criSpec() *specs.Spec {
	caps := slices.Clone(defaultCapabilities)
	return &specs.Spec{
		Annotations: map[string]string{cri.AnnotationContainerName: "main", cri.AnnotationImageName: "registry.local/app:1"},
		Process:     &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/kubelet/pods/uid-1/etc-hosts", Options: []string{"rbind", "rw"}},
			{Destination: "/dev/termination-log", Type: "bind", Source: "/var/lib/kubelet/pods/uid-1/containers/main/0a1b", Options: []string{"rbind"}},
			{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~projected/kube-api-access", Options: []string{"rbind", "ro"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sb1/resolv.conf", Options: []string{"rbind", "ro"}},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/sb1/shm", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: "/proc/42/ns/net"},
			},
			MaskedPaths:   []string{"/proc/kcore"},
			ReadonlyPaths: []string{"/proc/sys"},
		},
	}
}

func testFiles() podFiles {
	return podFiles{
		KubeletRoot: "/var/lib/kubelet", ContainerdRoot: "/var/lib/containerd", ContainerdState: "/run/containerd",
		PodUID: "uid-1", SandboxID: "sb1", ContainerID: "c1",
		resolve: func(p string) (string, error) {
			switch p {
			case "/var/lib/kubelet/pods/uid-1/volume-subpaths/root/main/0":
				return "/dev/infiniband", nil
			case "/var/lib/kubelet/pods/uid-1/volume-subpaths/scratch/main/1":
				return "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/scratch/sub", nil
			}
			return "", os.ErrNotExist
		},
	}
}

func TestContainerOf(t *testing.T) {
	bind := func(src, dst string, opts ...string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: dst, Type: "bind", Source: src, Options: append([]string{"rbind"}, opts...)})
		}
	}
	addCaps := func(caps ...string) func(*specs.Spec) {
		return func(s *specs.Spec) {
			c := s.Process.Capabilities
			c.Bounding, c.Effective, c.Permitted = append(c.Bounding, caps...), append(c.Effective, caps...), append(c.Permitted, caps...)
		}
	}
	tests := []struct {
		name    string
		edit    []func(*specs.Spec)
		granted []string
		want    policy.Container
	}{
		{name: "a pod's own files are not host paths", want: policy.Container{}},
		{name: "hostPath /", edit: []func(*specs.Spec){bind("/", "/host")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/", Path: "/host"}}}},
		{name: "another pod's secrets", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods/uid-2/volumes", "/x", "ro")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/var/lib/kubelet/pods/uid-2/volumes", Path: "/x", ReadOnly: true}}}},
		{name: "every pod's directory", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods", "/x")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/var/lib/kubelet/pods", Path: "/x"}}}},
		{name: "double slash and dot-dot are cleaned", edit: []func(*specs.Spec){bind("//dev/infiniband/../infiniband/uverbs0", "/dev/ib")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/dev/infiniband/uverbs0", Path: "/dev/ib"}}}},
		{name: "dot-dot out of the pod's directory", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods/uid-1/../uid-2", "/x")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/var/lib/kubelet/pods/uid-2", Path: "/x"}}}},
		{name: "another sandbox's files", edit: []func(*specs.Spec){bind("/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sb2/hostname", "/etc/hostname")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/sb2/hostname", Path: "/etc/hostname"}}}},
		{name: "subPath of a hostPath is resolved", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods/uid-1/volume-subpaths/root/main/0", "/ib")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/dev/infiniband", Path: "/ib"}}}},
		{name: "subPath of an emptyDir is the pod's own", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods/uid-1/volume-subpaths/scratch/main/1", "/s")},
			want: policy.Container{}},
		{name: "an unresolvable subPath stays a host path", edit: []func(*specs.Spec){bind("/var/lib/kubelet/pods/uid-1/volume-subpaths/x/main/2", "/s")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/var/lib/kubelet/pods/uid-1/volume-subpaths/x/main/2", Path: "/s"}}}},
		{name: "relative source is passed as written", edit: []func(*specs.Spec){bind("etc", "/e")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "etc", Path: "/e"}}}},
		{name: "added capabilities beyond containerd's defaults", edit: []func(*specs.Spec){addCaps("CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_CHOWN")},
			want: policy.Container{AddedCapabilities: []string{"NET_ADMIN", "SYS_ADMIN"}}},
		{name: "devices, granted VFs left out", granted: []string{"/dev/infiniband/uverbs1"}, edit: []func(*specs.Spec){func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/kvm"}, {Path: "//dev/infiniband/uverbs0"}, {Path: "/dev/infiniband/uverbs1"}}
		}}, want: policy.Container{Devices: []string{"/dev/kvm", "/dev/infiniband/uverbs0"}}},
		{name: "privileged: every capability", edit: []func(*specs.Spec){addCaps(privilegedCapabilities...)},
			want: policy.Container{Privileged: true, AddedCapabilities: []string{"BPF", "MAC_ADMIN", "NET_ADMIN", "SYS_ADMIN", "SYS_BOOT", "SYS_MODULE", "SYS_PTRACE", "SYS_RAWIO"}}},
		{name: "memory limit", edit: []func(*specs.Spec){withMemoryLimit(1 << 20)}, want: policy.Container{MemoryBytes: 1 << 20}},
		{name: "no memory limit: containerd leaves it unset", edit: []func(*specs.Spec){withoutMemoryLimit}, want: policy.Container{}},
		{name: "OCI's unlimited -1 is no limit", edit: []func(*specs.Spec){withMemoryLimit(-1)}, want: policy.Container{}},
		{name: "hostIPC: the host's /dev/shm is the namespace's, not a host path", edit: []func(*specs.Spec){hostIPC, bind("/dev/shm", "/dev/shm", "rw")},
			want: policy.Container{}},
		{name: "the host's /dev/shm without hostIPC is a host path", edit: []func(*specs.Spec){bind("/dev/shm", "/dev/shm", "rw")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/dev/shm", Path: "/dev/shm"}}}},
		{name: "hostIPC: the host's /dev/shm elsewhere is a host path", edit: []func(*specs.Spec){hostIPC, bind("/dev/shm", "/data", "rw")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/dev/shm", Path: "/data"}}}},
		{name: "hostIPC: another host path at /dev/shm is a host path", edit: []func(*specs.Spec){hostIPC, bind("/etc", "/dev/shm", "rw")},
			want: policy.Container{Mounts: []policy.Mount{{HostPath: "/etc", Path: "/dev/shm"}}}},
		{name: "a host device is named by its node, not where the container sees it", edit: []func(*specs.Spec){func(s *specs.Spec) {
			s.Linux.Devices = []specs.LinuxDevice{{Path: "/dev/harmless", Type: "c", Major: 1, Minor: 3}, {Path: "/dev/x", Type: "c", Major: 231, Minor: 192}}
		}}, want: policy.Container{Devices: []string{"/dev/null", "/dev/infiniband/x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := criSpec()
			for _, e := range tt.edit {
				e(spec)
			}
			got, _ := containerOf("main", spec, testFiles(), tt.granted)
			tt.want.Name, tt.want.Image = "main", "registry.local/app:1"
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("containerOf =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

// hostIPC puts the spec in the host's IPC namespace, as containerd does
// for a pod with hostIPC.
func hostIPC(s *specs.Spec) {
	s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.IPCNamespace })
}

func TestHostNamespaces(t *testing.T) {
	spec := criSpec()
	if n, p, i := hostNamespaces(spec); n || p || i {
		t.Errorf("pod namespaces read as host: %v %v %v", n, p, i)
	}
	spec.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	if n, p, i := hostNamespaces(spec); !n || !p || !i {
		t.Errorf("missing namespaces not read as host: %v %v %v", n, p, i)
	}
	if n, _, _ := hostNamespaces(&specs.Spec{}); !n {
		t.Error("a spec without linux section must read as host network")
	}
}

// TestResolveBindFollowsTheMountTable makes a real bind mount, as the
// kubelet does for a subPath, and requires the host path it binds.
func TestResolveBindFollowsTheMountTable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount (mount(2))")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "hostdir", "sub")
	dst := filepath.Join(dir, "pods", "uid-1", "volume-subpaths", "v", "c", "0")
	for _, d := range []string{src, dst} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("mount", "--bind", src, dst).CombinedOutput(); err != nil {
		t.Skipf("bind mount not possible here: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dst).Run() })
	got, err := resolveBind(dst)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(src)
	if got != want && got != src {
		t.Errorf("resolveBind(%s) = %s, want %s", dst, got, src)
	}
	files := podFiles{KubeletRoot: dir, PodUID: "uid-1"}
	c, _ := containerOf("main", &specs.Spec{Mounts: []specs.Mount{{Destination: "/d", Type: "bind", Source: dst}}}, files, nil)
	if len(c.Mounts) != 1 || (c.Mounts[0].HostPath != src && c.Mounts[0].HostPath != want) {
		t.Errorf("containerOf mounts = %+v, want the bound host directory %s", c.Mounts, src)
	}
}

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
		spec := criSpec()
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

// withMemoryLimit sets the container's memory limit as containerd's CRI
// plugin writes it (WithResources): the limit, swap equal to it, and the
// CPU shares the kubelet always passes.
func withMemoryLimit(n int64) func(*specs.Spec) {
	return func(s *specs.Spec) {
		shares := uint64(2)
		s.Linux.Resources = &specs.LinuxResources{
			CPU:    &specs.LinuxCPU{Shares: &shares},
			Memory: &specs.LinuxMemory{Limit: &n, Swap: &n},
		}
	}
}

// withoutMemoryLimit is a container without a memory limit as containerd
// writes it: the kubelet passes memory_limit_in_bytes 0, and containerd
// leaves an empty memory section.
func withoutMemoryLimit(s *specs.Spec) {
	shares := uint64(2)
	s.Linux.Resources = &specs.LinuxResources{CPU: &specs.LinuxCPU{Shares: &shares}, Memory: &specs.LinuxMemory{}}
}

// testPipelineEnforcing is testPipeline on a copy of the default bundle
// whose data.bulkhead.enforcement is enforcement (the signed bundle's
// setting; the data file may not change it).
func testPipelineEnforcing(t *testing.T, enforcement map[string]string) *Pipeline {
	t.Helper()
	dir := t.TempDir()
	if err := testnode.EnforcingBundle(dir, "../rego", enforcement); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Policy.Bundle = dir
	p, err := OpenPipeline(context.Background(), cfg, policy.RuntimeGVisor)
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
		sb, spec := sandboxSpec("agents", "sidecar", map[string]string{AnnotationSandboxMemory: "1048576"})
		sb.ID, sb.UID = "sb1", "uid-1" // criSpec's sandbox and pod
		if _, err := place(t, p, sb, spec); err != nil {
			t.Fatalf("deny=%v: the 1Mi sandbox refused: %v", deny, err)
		}
		main := criSpec()
		withMemoryLimit(1 << 20)(main)
		if err := p.AdmitContainer(ctx, sb, nil, "c1", main); err != nil {
			t.Errorf("deny=%v: the 1Mi container refused: %v", deny, err)
		}
		sidecar := criSpec()
		sidecar.Annotations[cri.AnnotationContainerName] = "sidecar"
		withoutMemoryLimit(sidecar)
		err := p.AdmitContainer(ctx, sb, nil, "c2", sidecar)
		switch {
		case !deny && err != nil:
			t.Errorf("warn: the unlimited sidecar refused: %v", err)
		case deny && (err == nil || !strings.Contains(err.Error(), "[quota.memory_limit_missing] ") || !strings.Contains(err.Error(), `container "sidecar" sets no memory limit`)):
			t.Errorf("deny: AdmitContainer of the unlimited sidecar = %v, want a refusal naming quota.memory_limit_missing and the container", err)
		}
		if !deny {
			d, err := p.decider.Decide(ctx, p.ContainerInput(sb, nil, "c2", sidecar))
			if err != nil || !slices.ContainsFunc(d.Reasons, func(r policy.Reason) bool {
				return r.Rule == "quota.memory_limit_missing" && r.Enforcement == policy.EnforceWarn
			}) {
				t.Errorf("warn: decision %+v (%v) lacks quota.memory_limit_missing as a warning", d, err)
			}
		}
		_ = p.Node().Release(ctx, sb.ID)
	}
}

// TestMountedVolumes: the node tells a pod's volumes from where the kubelet
// bound them from (<kubelet root>/pods/<uid>/volumes/<plugin>/<name>), as
// a real kubelet's container specs show them; a subPath is resolved first.
func TestMountedVolumes(t *testing.T) {
	vol := func(plugin, name string) string {
		return "/var/lib/kubelet/pods/uid-1/volumes/" + plugin + "/" + name
	}
	tests := []struct {
		name   string
		source string
		want   []policy.Volume // besides the token's projected volume
	}{
		{name: "emptyDir", source: vol("kubernetes.io~empty-dir", "scratch"), want: []policy.Volume{{Name: "scratch", Type: "emptyDir"}}},
		{name: "configMap", source: vol("kubernetes.io~configmap", "cfg"), want: []policy.Volume{{Name: "cfg", Type: "configMap"}}},
		{name: "secret", source: vol("kubernetes.io~secret", "creds"), want: []policy.Volume{{Name: "creds", Type: "secret"}}},
		{name: "downwardAPI", source: vol("kubernetes.io~downward-api", "info"), want: []policy.Volume{{Name: "info", Type: "downwardAPI"}}},
		{name: "gitRepo", source: vol("kubernetes.io~git-repo", "src"), want: []policy.Volume{{Name: "src", Type: "gitRepo"}}},
		{name: "CSI: inline or a claim's PV", source: vol("kubernetes.io~csi", "pvc-0a1b") + "/mount", want: []policy.Volume{{Name: "pvc-0a1b", Type: "csi", MayBeClaim: true}}},
		{name: "NFS", source: vol("kubernetes.io~nfs", "share"), want: []policy.Volume{{Name: "share", Type: "nfs", MayBeClaim: true}}},
		{name: "iSCSI", source: vol("kubernetes.io~iscsi", "lun"), want: []policy.Volume{{Name: "lun", Type: "iscsi", MayBeClaim: true}}},
		{name: "FC", source: vol("kubernetes.io~fc", "san"), want: []policy.Volume{{Name: "san", Type: "fc", MayBeClaim: true}}},
		{name: "local PV", source: vol("kubernetes.io~local-volume", "pv-7"), want: []policy.Volume{{Name: "pv-7", Type: "local", MayBeClaim: true}}},
		{name: "FlexVolume driver", source: vol("example.com~cifs", "share"), want: []policy.Volume{{Name: "share", Type: "flexVolume", MayBeClaim: true}}},
		{name: "a plugin this table does not know", source: vol("kubernetes.io~rbd", "img"), want: []policy.Volume{{Name: "img", Type: "unknown"}}},
		{name: "image volume", source: "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1/4e5f", want: []policy.Volume{{Name: "4e5f", Type: "image"}}},
		{name: "another sandbox's image volume is not the pod's", source: "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb2/4e5f"},
		{name: "every image volume of the pod", source: "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1", want: []policy.Volume{{Type: "unknown"}}},
		{name: "subPath of an emptyDir", source: "/var/lib/kubelet/pods/uid-1/volume-subpaths/scratch/main/1", want: []policy.Volume{{Name: "scratch", Type: "emptyDir"}}},
		{name: "another pod's volume is a host path, not a volume", source: "/var/lib/kubelet/pods/uid-2/volumes/kubernetes.io~nfs/share"},
		{name: "dot-dot out of the volumes", source: vol("kubernetes.io~empty-dir", "x") + "/../../../etc-hosts"},
		{name: "a plugin's directory: every volume of it", source: "/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~nfs", want: []policy.Volume{{Type: "unknown"}}},
		{name: "the volumes directory itself", source: "/var/lib/kubelet/pods/uid-1/volumes/", want: []policy.Volume{{Type: "unknown"}}},
		{name: "hostPath", source: "/srv/data"},
	}
	token := policy.Volume{Name: "kube-api-access", Type: "projected"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := criSpec()
			spec.Mounts = append(spec.Mounts,
				specs.Mount{Destination: "/data", Type: "bind", Source: tt.source, Options: []string{"rbind", "rw"}},
				specs.Mount{Destination: "/again", Type: "bind", Source: tt.source, Options: []string{"rbind", "ro"}},
				specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"})
			want := append([]policy.Volume{token}, tt.want...)
			if _, got := containerOf("main", spec, testFiles(), nil); !reflect.DeepEqual(got, want) {
				t.Errorf("containerOf volumes =\n %+v\nwant\n %+v", got, want)
			}
		})
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
		spec := criSpec()
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
	spec := criSpec()
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/model", Type: "bind", Source: "/run/containerd/io.containerd.grpc.v1.cri/image-volumes/sb1/4e5f", Options: []string{"rbind", "ro"}})
	if err := p.AdmitContainer(ctx, sb, nil, "c1", spec); err == nil || !strings.Contains(err.Error(), "[workload.volume_type] ") || strings.Contains(err.Error(), "workload.host_path") {
		t.Errorf("image volume: AdmitContainer = %v, want workload.volume_type alone", err)
	}
}
