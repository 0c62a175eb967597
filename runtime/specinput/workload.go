package specinput

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/bulkhead-runtime/bulkhead/internal/fspath"
	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
)

// hostShm is the host's POSIX shared memory, which containerd binds into a
// pod that shares the host's IPC namespace.
const hostShm = "/dev/shm"

// criPlugin is the directory containerd's CRI plugin keeps its per-sandbox
// and per-container files in, under both its root and its state directory.
const criPlugin = "io.containerd.grpc.v1.cri"

// defaultCapabilities is the capability set containerd gives every
// container (pkg/oci's default Unix spec). A capability outside it was
// added by the pod's author (or by privileged mode).
var defaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// DefaultCapabilities is the capability set containerd gives every
// container: a container asks the host for none of these.
func DefaultCapabilities() []string { return slices.Clone(defaultCapabilities) }

// podFiles says which host paths are a pod's own: the files the kubelet and
// containerd made for it (volumes, service account token, /etc/hosts,
// termination log, resolv.conf, hostname, /dev/shm, image volumes). Every
// other bind source is a host path the policy judges; the pod's volumes
// are judged by their type (volumeOf).
type podFiles struct {
	// KubeletRoot, ContainerdRoot and ContainerdState are the node's
	// directories (Dirs).
	KubeletRoot, ContainerdRoot, ContainerdState string
	// PodUID is the pod's Kubernetes UID; empty outside Kubernetes.
	PodUID string
	// SandboxID and ContainerID are containerd's ids of the pod's sandbox
	// and of the container being judged (empty at sandbox create).
	SandboxID, ContainerID string
	// resolve maps a kubelet subPath bind to the host path it binds; nil
	// reads the node's mount table.
	resolve func(path string) (string, error)
}

// podFilesOf are the own files of pod on a node with dirs, with those of
// container containerID ("" at the sandbox's create).
func podFilesOf(dirs Dirs, pod Pod, containerID string) podFiles {
	return podFiles{
		KubeletRoot: dirs.KubeletRoot, ContainerdRoot: dirs.ContainerdRoot, ContainerdState: dirs.ContainerdState,
		PodUID: pod.UID, SandboxID: pod.SandboxID, ContainerID: containerID,
	}
}

// own reports whether the clean absolute path p is one of the pod's own files.
func (f podFiles) own(p string) bool {
	var roots []string
	if f.PodUID != "" && f.KubeletRoot != "" {
		roots = append(roots, filepath.Join(f.KubeletRoot, "pods", f.PodUID))
	}
	for _, base := range []string{f.ContainerdRoot, f.ContainerdState} {
		if base == "" {
			continue
		}
		if f.SandboxID != "" {
			roots = append(roots, filepath.Join(base, criPlugin, "sandboxes", f.SandboxID))
		}
		if f.ContainerID != "" {
			roots = append(roots, filepath.Join(base, criPlugin, "containers", f.ContainerID))
		}
	}
	if f.ContainerdState != "" && f.SandboxID != "" {
		// The pod's image volumes: judged by type (workload.volume_type).
		roots = append(roots, filepath.Join(f.ContainerdState, criPlugin, imageVolumeDir, f.SandboxID))
	}
	return slices.ContainsFunc(roots, func(root string) bool { return fspath.Under(p, root) })
}

// subPath reports whether p is a bind the kubelet made for a volumeMount's
// subPath: it lives in the pod's directory but binds whatever the volume
// holds, a hostPath's subdirectory included.
func (f podFiles) subPath(p string) bool {
	return f.PodUID != "" && f.KubeletRoot != "" && fspath.Under(p, filepath.Join(f.KubeletRoot, "pods", f.PodUID, "volume-subpaths"))
}

// hostPath is the host path a bind mount's source will mount: cleaned,
// a kubelet subPath bind resolved through the mount table, symlinks
// followed where the path exists (the kernel follows them when mounting).
func (f podFiles) hostPath(source string) string {
	p := source
	if !filepath.IsAbs(p) {
		return p // not clean and absolute: the policy refuses it as written
	}
	p = filepath.Clean(p)
	if f.subPath(p) {
		resolve := f.resolve
		if resolve == nil {
			resolve = resolveBind
		}
		if r, err := resolve(p); err == nil {
			p = r
		}
		// Unresolved, it stays under volume-subpaths, which own() never
		// counts as the pod's: fail closed.
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return p
}

// resolveBind finds what the bind mount at mountpoint p binds, as a host
// path: the mount table gives the bound directory relative to its
// filesystem (root), and another mount of the same filesystem tells where
// that filesystem is reachable on the host.
func resolveBind(p string) (string, error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return "", err
	}
	var bind *mountinfo.Info
	for _, m := range mounts {
		if m.Mountpoint == p {
			bind = m // the last one wins: it is what the path shows
		}
	}
	if bind == nil {
		return "", fmt.Errorf("%s: not a mount point", p)
	}
	best := ""
	bestRoot := -1
	for _, m := range mounts {
		if m == bind || m.Major != bind.Major || m.Minor != bind.Minor || strings.Contains(m.Mountpoint, "/volume-subpaths/") {
			continue
		}
		if !fspath.Under(bind.Root, m.Root) || len(m.Root) <= bestRoot {
			continue
		}
		rel := strings.TrimPrefix(bind.Root, m.Root)
		best, bestRoot = filepath.Join(m.Mountpoint, rel), len(m.Root)
	}
	if bestRoot < 0 {
		return "", fmt.Errorf("%s: binds %s of device %d:%d, which no other mount shows", p, bind.Root, bind.Major, bind.Minor)
	}
	return best, nil
}

// hostNamespaces reads which host namespaces a spec shares: containerd
// leaves a namespace out of the spec to share the host's.
func hostNamespaces(spec *specs.Spec) (network, pid, ipc bool) {
	has := func(t specs.LinuxNamespaceType) bool {
		return spec.Linux != nil && slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == t })
	}
	return !has(specs.NetworkNamespace), !has(specs.PIDNamespace), !has(specs.IPCNamespace)
}

// containerOf describes what the container of spec asks of the host, as
// the policy input's container: host bind mounts, device nodes (but not
// those in granted, which Bulkhead itself hands out), capabilities beyond
// containerd's default set, privileged mode, and its memory limit. It
// lists too the pod's volumes the container mounts, each once, told from
// where its bind comes from: a node sees mounts, not the pod spec. What the
// node cannot tell apart is left to the webhook and said by MayBeClaim (a
// claim's volume against an inline source of its plugin); a volume that is
// not a bind (a tmpfs) is not listed. Each bind's host path is resolved
// once, for both.
func containerOf(name string, spec *specs.Spec, files podFiles, granted []string) (policy.Container, []policy.Volume) {
	c := policy.Container{Name: name, Image: spec.Annotations[cri.AnnotationImageName]}
	var volumes []policy.Volume
	_, _, hostIPC := hostNamespaces(spec)
	for _, m := range spec.Mounts {
		if !isBind(m) {
			continue
		}
		p := files.hostPath(m.Source)
		if v, ok := files.volumeOf(p); filepath.IsAbs(p) && ok && !slices.Contains(volumes, v) {
			volumes = append(volumes, v)
		}
		if filepath.IsAbs(p) && files.own(p) && !files.subPath(p) {
			continue
		}
		if hostIPC && p == hostShm && filepath.Clean(m.Destination) == hostShm {
			// containerd shares the host's /dev/shm with a pod in the
			// host's IPC namespace: that is what host IPC means, judged
			// as the namespace (workload.host_namespace), as the webhook
			// judges hostIPC, not as a host path the pod asked for.
			continue
		}
		c.Mounts = append(c.Mounts, policy.Mount{HostPath: p, Path: m.Destination, ReadOnly: slices.Contains(m.Options, "ro")})
	}
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			p := hostDevicePath(d)
			if !slices.Contains(granted, p) {
				c.Devices = append(c.Devices, p)
			}
		}
	}
	c.MemoryBytes = MemoryLimit(spec)
	if spec.Process != nil && spec.Process.Capabilities != nil {
		caps := spec.Process.Capabilities
		seen := map[string]bool{}
		for _, set := range [][]string{caps.Bounding, caps.Effective, caps.Permitted, caps.Inheritable, caps.Ambient} {
			for _, cp := range set {
				cp = strings.ToUpper(cp)
				if !strings.HasPrefix(cp, "CAP_") {
					cp = "CAP_" + cp
				}
				if seen[cp] || slices.Contains(defaultCapabilities, cp) {
					continue
				}
				seen[cp] = true
				c.AddedCapabilities = append(c.AddedCapabilities, strings.TrimPrefix(cp, "CAP_"))
			}
		}
		slices.Sort(c.AddedCapabilities)
		// containerd's privileged mode grants every capability the host
		// knows; a container holding all of these is privileged in effect.
		c.Privileged = !slices.ContainsFunc(privilegedCapabilities, func(cp string) bool { return !slices.Contains(caps.Bounding, cp) })
	}
	return c, volumes
}

// MemoryLimit is the container's memory limit in bytes, 0 for none: the
// kubelet passes a container without a limit as 0 and containerd then
// leaves linux.resources.memory.limit unset (a negative value, OCI's
// "unlimited", is none too). The sandbox's io.kubernetes.cri.sandbox-memory
// is the sum of the limits, where such a container counts 0, so only the
// container's own spec shows that it is unbounded. A unified memory.max
// (cgroup v2) overrides the limit, as runc writes it last (MemoryAfter).
func MemoryLimit(spec *specs.Spec) int64 {
	if spec.Linux == nil {
		return 0
	}
	return MemoryAfter(0, spec.Linux.Resources)
}

// kubeletVolumePlugin is one of the kubelet's in-tree volume plugins, as
// its directory under <kubelet root>/pods/<uid>/volumes names it (the
// plugin's name with "/" escaped as "~").
type kubeletVolumePlugin struct {
	// Type is the pod spec's volume source field the plugin mounts.
	Type string
	// Claim says that a PersistentVolume may use the plugin too, so that a
	// claim's volume mounts where an inline source of Type does.
	Claim bool
}

// kubeletVolumePlugins are the in-tree plugins of the kubelet (v1.37: the
// others moved to CSI). A FlexVolume driver's directory is
// "<vendor>~<driver>"; hostPath binds its host path itself, and an image
// volume is containerd's (imageVolumeDir).
var kubeletVolumePlugins = map[string]kubeletVolumePlugin{
	"kubernetes.io~empty-dir":    {Type: "emptyDir"},
	"kubernetes.io~configmap":    {Type: "configMap"},
	"kubernetes.io~secret":       {Type: "secret"},
	"kubernetes.io~projected":    {Type: "projected"},
	"kubernetes.io~downward-api": {Type: "downwardAPI"},
	"kubernetes.io~git-repo":     {Type: "gitRepo"},
	"kubernetes.io~csi":          {Type: "csi", Claim: true},
	"kubernetes.io~nfs":          {Type: "nfs", Claim: true},
	"kubernetes.io~iscsi":        {Type: "iscsi", Claim: true},
	"kubernetes.io~fc":           {Type: "fc", Claim: true},
	"kubernetes.io~local-volume": {Type: "local", Claim: true},
}

// imageVolumeDir is where containerd's CRI plugin mounts a pod's image
// volumes: <containerd state>/io.containerd.grpc.v1.cri/image-volumes/<sandbox id>/<image>.
const imageVolumeDir = "image-volumes"

// volumeOf names the pod volume whose files the clean absolute path p
// lies in, and its type as the pod spec would name it; ok is false when p
// is none of the pod's volumes (its other own files, or a host path).
func (f podFiles) volumeOf(p string) (v policy.Volume, ok bool) {
	if volumes := filepath.Join(f.KubeletRoot, "pods", f.PodUID, "volumes"); f.PodUID != "" && f.KubeletRoot != "" && fspath.Under(p, volumes) {
		// <plugin>/<name>/...; the kubelet binds a volume's own directory,
		// so a bind above one (every volume of a plugin, or of the pod) is
		// of no type the policy knows and is judged as "unknown".
		rest := strings.TrimPrefix(strings.TrimPrefix(p, volumes), "/")
		dir, name, _ := strings.Cut(rest, "/")
		name, _, _ = strings.Cut(name, "/")
		plugin, known := kubeletVolumePlugins[dir]
		switch {
		case name == "":
			plugin = kubeletVolumePlugin{Type: "unknown"}
		case known:
		case !strings.HasPrefix(dir, "kubernetes.io~") && strings.Count(dir, "~") == 1:
			plugin = kubeletVolumePlugin{Type: "flexVolume", Claim: true}
		default:
			plugin = kubeletVolumePlugin{Type: "unknown"}
		}
		return policy.Volume{Name: name, Type: plugin.Type, MayBeClaim: plugin.Claim}, true
	}
	if images := filepath.Join(f.ContainerdState, criPlugin, imageVolumeDir, f.SandboxID); f.ContainerdState != "" && f.SandboxID != "" && fspath.Under(p, images) {
		image, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(p, images), "/"), "/")
		if image == "" {
			return policy.Volume{Type: "unknown"}, true
		}
		return policy.Volume{Name: image, Type: "image"}, true
	}
	return v, false
}

// privilegedCapabilities are capabilities no container gets unless it is
// privileged or asks for nearly everything.
var privilegedCapabilities = []string{
	"CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_PTRACE", "CAP_SYS_BOOT", "CAP_NET_ADMIN", "CAP_MAC_ADMIN", "CAP_BPF",
}

// hostDevicePath names the host device node an OCI device entry gives the
// container. The entry's path is where the container sees it, which the
// pod's author chooses; the device itself is its type and major:minor, so
// the node's /dev is searched for it. An RDMA device not found there is
// named under /dev/infiniband all the same.
func hostDevicePath(d specs.LinuxDevice) string {
	if p, ok := hostDevices()[devKey{d.Type, d.Major, d.Minor}]; ok && d.Type != "" {
		return p
	}
	if d.Type == "c" && d.Major == rdma.InfinibandMajor {
		return filepath.Join(rdma.Dir, filepath.Base(d.Path))
	}
	return filepath.Clean(d.Path)
}

type devKey struct {
	typ          string
	major, minor int64
}

// hostDevices maps each device node under /dev to its path, read once per
// shim (device nodes of a node change rarely; a device added later is
// judged by the path the spec gives it).
var hostDevices = sync.OnceValue(func() map[devKey]string {
	m := map[devKey]string{}
	_ = filepath.WalkDir("/dev", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if e.IsDir() && (p == "/dev/shm" || p == "/dev/pts" || p == "/dev/mqueue" || p == "/dev/hugepages") {
			return filepath.SkipDir
		}
		if e.Type()&fs.ModeDevice == 0 {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		typ := "b"
		if e.Type()&fs.ModeCharDevice != 0 {
			typ = "c"
		}
		k := devKey{typ, int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))}
		if _, seen := m[k]; !seen {
			m[k] = p
		}
		return nil
	})
	return m
})

// asksHost reports whether c asks the host for anything at all.
func asksHost(c policy.Container) bool {
	return c.Privileged || len(c.Mounts) > 0 || len(c.Devices) > 0 || len(c.AddedCapabilities) > 0
}

// isBind reports whether m binds a host path (rather than mounting a
// fresh proc, sysfs, tmpfs...).
func isBind(m specs.Mount) bool {
	return m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind")
}
