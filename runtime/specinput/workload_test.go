package specinput

import (
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

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
		{name: "memory limit", edit: []func(*specs.Spec){specinputtest.WithMemoryLimit(1 << 20)}, want: policy.Container{MemoryBytes: 1 << 20}},
		{name: "no memory limit: containerd leaves it unset", edit: []func(*specs.Spec){specinputtest.WithoutMemoryLimit}, want: policy.Container{}},
		{name: "OCI's unlimited -1 is no limit", edit: []func(*specs.Spec){specinputtest.WithMemoryLimit(-1)}, want: policy.Container{}},
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
			spec := specinputtest.CRISpec()
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
	spec := specinputtest.CRISpec()
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
			spec := specinputtest.CRISpec()
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

// TestCRISpecHasTheDefaultCapabilities keeps specinputtest.CRISpec's
// capabilities containerd's default set, which the tests of both this
// package and package runtime read as "asks the host for nothing".
func TestCRISpecHasTheDefaultCapabilities(t *testing.T) {
	if got := specinputtest.CRISpec().Process.Capabilities.Bounding; !slices.Equal(got, defaultCapabilities) {
		t.Errorf("specinputtest.CRISpec bounding capabilities = %v, want %v", got, defaultCapabilities)
	}
}
