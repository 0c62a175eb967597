package admission

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

func hostPathVolume(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

// containersByName indexes the input's containers; names are unique in a pod.
func containersByName(t *testing.T, in policy.Input) map[string]policy.Container {
	t.Helper()
	out := map[string]policy.Container{}
	for _, c := range in.Pod.Containers {
		if _, dup := out[c.Name]; dup {
			t.Fatalf("container %q listed twice", c.Name)
		}
		out[c.Name] = c
	}
	return out
}

// TestInputForHostMounts: every mount of a hostPath volume becomes a Mount
// with the host path the kubelet will bind (cleaned, subPath resolved,
// the volume's path for a subPathExpr), and those at or under /dev are the
// container's devices. Mounts of the pod's own volumes are not host paths.
func TestInputForHostMounts(t *testing.T) {
	pod := podObject{Workload: "Pod", Name: "p", Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{
			hostPathVolume("root", "/"),
			hostPathVolume("uverbs", "//dev/infiniband/uverbs0"),
			hostPathVolume("dotted", "/var/lib/../lib/bulkhead/"),
			hostPathVolume("dev", "/dev"),
			hostPathVolume("devices", "/devices"),
			hostPathVolume("logs", "/var/log/pods"),
			hostPathVolume("srv", "/srv/data"),
			hostPathVolume("relative", "var/lib/kubelet"),
			hostPathVolume("empty", ""),
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
		Containers: []corev1.Container{{
			Name: "c",
			VolumeMounts: []corev1.VolumeMount{
				{Name: "root", MountPath: "/host", ReadOnly: true},
				{Name: "root", MountPath: "/ib", SubPath: "dev/infiniband"},
				{Name: "uverbs", MountPath: "/dev/infiniband/uverbs0"},
				{Name: "dotted", MountPath: "/state"},
				{Name: "dev", MountPath: "/hostdev"},
				{Name: "devices", MountPath: "/devices"},
				{Name: "logs", MountPath: "/logs", SubPathExpr: "$(POD_NAME)"},
				{Name: "srv", MountPath: "/etc-host", SubPath: "a/../../../etc"},
				{Name: "srv", MountPath: "/abs", SubPath: "/kubelet"},
				{Name: "relative", MountPath: "/rel", SubPath: "pods"},
				{Name: "empty", MountPath: "/empty"},
				{Name: "scratch", MountPath: "/scratch"},
			},
		}},
	}}
	in, err := inputFor("agents", pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := containersByName(t, in)["c"]
	wantMounts := []policy.Mount{
		{HostPath: "/", Path: "/host", ReadOnly: true},
		{HostPath: "/dev/infiniband", Path: "/ib"},
		{HostPath: "/dev/infiniband/uverbs0", Path: "/dev/infiniband/uverbs0"},
		{HostPath: "/var/lib/bulkhead", Path: "/state"},
		{HostPath: "/dev", Path: "/hostdev"},
		{HostPath: "/devices", Path: "/devices"},
		{HostPath: "/var/log/pods", Path: "/logs"},
		{HostPath: "/etc", Path: "/etc-host"},
		{HostPath: "/srv/data/kubelet", Path: "/abs"},
		{HostPath: "var/lib/kubelet", Path: "/rel"},
		{HostPath: "", Path: "/empty"},
	}
	if !reflect.DeepEqual(c.Mounts, wantMounts) {
		t.Errorf("mounts:\n got %+v\nwant %+v", c.Mounts, wantMounts)
	}
	wantDevices := []string{"/dev/infiniband", "/dev/infiniband/uverbs0", "/dev"}
	if !reflect.DeepEqual(c.Devices, wantDevices) {
		t.Errorf("devices = %q, want %q", c.Devices, wantDevices)
	}
}

// TestInputForVolumes: every declared volume is listed, mounted or not,
// with its source's JSON name and, for hostPath, the cleaned path (a path
// that is not absolute stays as written).
func TestInputForVolumes(t *testing.T) {
	vols := []corev1.Volume{
		hostPathVolume("unmounted", "/var/lib/kubelet/pods/"),
		hostPathVolume("uverbs", "//dev/infiniband/uverbs0"),
		hostPathVolume("relative", "./etc/../etc"),
		hostPathVolume("empty", ""),
		{Name: "e", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "x"}}},
		{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		{Name: "pvc", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "x"}}},
		{Name: "proj", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
		{Name: "dapi", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{}}},
		{Name: "csi", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "x"}}},
		{Name: "eph", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}},
		{Name: "img", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "x"}}},
		{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "x", Path: "/"}}},
		{Name: "ceph", VolumeSource: corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{}}},
		{Name: "none"},
	}
	in, err := inputFor("agents", podObject{Workload: "Pod", Name: "p", Spec: corev1.PodSpec{Volumes: vols}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []policy.Volume{
		{Name: "unmounted", Type: "hostPath", HostPath: "/var/lib/kubelet/pods"},
		{Name: "uverbs", Type: "hostPath", HostPath: "/dev/infiniband/uverbs0"},
		{Name: "relative", Type: "hostPath", HostPath: "./etc/../etc"},
		{Name: "empty", Type: "hostPath", HostPath: ""},
		{Name: "e", Type: "emptyDir"},
		{Name: "s", Type: "secret"},
		{Name: "cm", Type: "configMap"},
		{Name: "pvc", Type: "persistentVolumeClaim"},
		{Name: "proj", Type: "projected"},
		{Name: "dapi", Type: "downwardAPI"},
		{Name: "csi", Type: "csi"},
		{Name: "eph", Type: "ephemeral"},
		{Name: "img", Type: "image"},
		{Name: "nfs", Type: "nfs"},
		{Name: "ceph", Type: "cephfs"},
		{Name: "none", Type: "unknown"},
	}
	if !reflect.DeepEqual(in.Pod.Volumes, want) {
		t.Errorf("volumes:\n got %+v\nwant %+v", in.Pod.Volumes, want)
	}
}

// TestInputForSecurityContext: capabilities are normalised, host ports,
// sysctls and privileged mode are read, and each container's seccomp and
// AppArmor profile is its own setting, else the pod's, from the fields or
// the legacy annotations.
func TestInputForSecurityContext(t *testing.T) {
	yes := true
	seccomp := func(t corev1.SeccompProfileType) *corev1.SeccompProfile { return &corev1.SeccompProfile{Type: t} }
	apparmor := func(t corev1.AppArmorProfileType) *corev1.AppArmorProfile { return &corev1.AppArmorProfile{Type: t} }
	pod := podObject{
		Workload: "Pod", Name: "p",
		Meta: metav1.ObjectMeta{Annotations: map[string]string{
			corev1.SeccompContainerAnnotationKeyPrefix + "legacy":                "unconfined",
			corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "legacy": "unconfined",
			corev1.SeccompContainerAnnotationKeyPrefix + "local":                 "localhost/profiles/audit.json",
			corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix + "local":  "runtime/default",
			// Field and annotation disagree: the weaker one is judged.
			corev1.SeccompContainerAnnotationKeyPrefix + "mixed": "unconfined",
		}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile:  seccomp(corev1.SeccompProfileTypeRuntimeDefault),
				AppArmorProfile: apparmor(corev1.AppArmorProfileTypeRuntimeDefault),
				Sysctls:         []corev1.Sysctl{{Name: "kernel.msgmax", Value: "65536"}, {Name: "net.ipv4.tcp_syncookies", Value: "1"}},
			},
			InitContainers: []corev1.Container{{
				Name: "init",
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
					Add:  []corev1.Capability{"cap_sys_admin", "NET_ADMIN", "Cap_Net_Raw", " chown "},
					Drop: []corev1.Capability{"ALL"},
				}},
			}},
			Containers: []corev1.Container{
				{
					Name:  "ports",
					Ports: []corev1.ContainerPort{{ContainerPort: 80}, {ContainerPort: 8080, HostPort: 8080}, {ContainerPort: 53, HostPort: 53, Protocol: corev1.ProtocolUDP}},
				},
				{
					Name: "own",
					SecurityContext: &corev1.SecurityContext{
						Privileged:      &yes,
						SeccompProfile:  seccomp(corev1.SeccompProfileTypeUnconfined),
						AppArmorProfile: apparmor(corev1.AppArmorProfileTypeUnconfined),
					},
				},
				{Name: "legacy"},
				{Name: "local"},
				{Name: "mixed", SecurityContext: &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}},
			},
		},
	}
	in, err := inputFor("agents", pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"kernel.msgmax": "65536", "net.ipv4.tcp_syncookies": "1"}; !reflect.DeepEqual(in.Pod.Sysctls, want) {
		t.Errorf("sysctls = %v, want %v", in.Pod.Sysctls, want)
	}
	cs := containersByName(t, in)
	if got, want := cs["init"].AddedCapabilities, []string{"SYS_ADMIN", "NET_ADMIN", "NET_RAW", "CHOWN"}; !reflect.DeepEqual(got, want) {
		t.Errorf("added capabilities = %q, want %q", got, want)
	}
	if got, want := cs["ports"].HostPorts, []int32{8080, 53}; !reflect.DeepEqual(got, want) {
		t.Errorf("host ports = %v, want %v", got, want)
	}
	if !cs["own"].Privileged || cs["ports"].Privileged {
		t.Errorf("privileged: own %v, ports %v; want true, false", cs["own"].Privileged, cs["ports"].Privileged)
	}
	profiles := map[string][2]string{ // container: seccomp, AppArmor
		"init":   {"RuntimeDefault", "RuntimeDefault"}, // the pod's
		"own":    {"Unconfined", "Unconfined"},
		"legacy": {"Unconfined", "Unconfined"},
		"local":  {"Localhost", "RuntimeDefault"},
		"mixed":  {"Unconfined", "RuntimeDefault"},
	}
	for name, want := range profiles {
		c := cs[name]
		if got := [2]string{c.SeccompProfile, c.AppArmorProfile}; got != want {
			t.Errorf("container %s: seccomp, AppArmor = %q, want %q", name, got, want)
		}
	}

	// The pod-wide legacy seccomp annotation applies where nothing else does.
	bare := podObject{Workload: "Pod", Name: "p",
		Meta: metav1.ObjectMeta{Annotations: map[string]string{corev1.SeccompPodAnnotationKey: "unconfined"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b", SecurityContext: &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}}}},
	}
	in, err = inputFor("agents", bare, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs = containersByName(t, in)
	if cs["a"].SeccompProfile != "Unconfined" || cs["b"].SeccompProfile != "RuntimeDefault" || cs["a"].AppArmorProfile != "" {
		t.Errorf("pod annotation: a %q/%q, b %q; want Unconfined/\"\", RuntimeDefault", cs["a"].SeccompProfile, cs["a"].AppArmorProfile, cs["b"].SeccompProfile)
	}
}

// TestInputForEphemeralContainers: ephemeral containers follow the init
// and app containers, marked, with the same reading of their spec.
func TestInputForEphemeralContainers(t *testing.T) {
	yes := true
	pod := podObject{Workload: "Pod", Name: "p", Spec: corev1.PodSpec{
		Volumes:        []corev1.Volume{hostPathVolume("root", "/")},
		InitContainers: []corev1.Container{{Name: "i"}},
		Containers:     []corev1.Container{{Name: "a"}, {Name: "b"}},
		EphemeralContainers: []corev1.EphemeralContainer{{
			TargetContainerName: "a",
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{
				Name:  "debugger",
				Image: "busybox",
				Env:   []corev1.EnvVar{{Name: "X", Value: "1"}},
				SecurityContext: &corev1.SecurityContext{
					Privileged:   &yes,
					Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"CAP_SYS_PTRACE"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "root", MountPath: "/host", SubPath: "dev"}},
			},
		}},
	}}
	in, err := inputFor("agents", pod, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range in.Pod.Containers {
		names = append(names, c.Name)
	}
	if want := []string{"i", "a", "b", "debugger"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("containers = %q, want %q", names, want)
	}
	want := policy.Container{
		Name: "debugger", Image: "busybox", Privileged: true, Ephemeral: true,
		Devices:           []string{"/dev"},
		Mounts:            []policy.Mount{{HostPath: "/dev", Path: "/host"}},
		AddedCapabilities: []string{"SYS_PTRACE"},
		Env:               map[string]string{"X": "1"},
	}
	if got := in.Pod.Containers[3]; !reflect.DeepEqual(got, want) {
		t.Errorf("ephemeral container:\n got %+v\nwant %+v", got, want)
	}
	for _, c := range in.Pod.Containers[:3] {
		if c.Ephemeral {
			t.Errorf("container %s marked ephemeral", c.Name)
		}
	}
}
