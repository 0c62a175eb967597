package agreement

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// kubelet turns a pod into the CRI requests a kubelet sends for it, and
// runs them against a node: RunPodSandbox, then CreateContainer and
// StartContainer for every init and app container. It does what the
// kubelet does that the node judges (the sandbox's namespaces, sysctls,
// privilege and memory; each container's mounts from the kubelet's pod
// directory, capabilities, privilege, seccomp and memory) and nothing
// else: no image pull, no probes, no restarts.
type kubelet struct {
	n *node.Node
	// root is the kubelet's --root-dir, as the node's shim knows it
	// (node.Options.KubeletRoot): pods' own files live under root/pods/UID.
	root string
}

// errRefused marks a node's refusal, as against a failure of the node.
var errRefused = errors.New("refused by the node")

// refusal reads a CRI error: the rule ids of a Bulkhead refusal, or the
// error itself when it is something else.
func refusal(err error) ([]string, error) {
	if err == nil {
		return nil, nil
	}
	const marker = "bulkhead refused pod "
	msg := err.Error()
	i := strings.Index(msg, marker)
	if i < 0 {
		return nil, err
	}
	rules := rulesIn(msg[i:])
	if len(rules) == 0 {
		return nil, fmt.Errorf("a refusal that names no rule: %w", err)
	}
	return rules, fmt.Errorf("%w: %s", errRefused, msg[i:])
}

func (k *kubelet) podDir(p *corev1.Pod) string { return filepath.Join(k.root, "pods", string(p.UID)) }

// podMemoryLimit is what the kubelet puts in the sandbox's resources
// (calculateSandboxResources, resourcehelper.PodLimits): the app
// containers' limits added up, a container without one counting 0, or the
// largest init container's if larger.
func podMemoryLimit(p *corev1.Pod) int64 {
	var sum, initMax int64
	for _, c := range p.Spec.Containers {
		sum += c.Resources.Limits.Memory().Value()
	}
	for _, c := range p.Spec.InitContainers {
		initMax = max(initMax, c.Resources.Limits.Memory().Value())
	}
	return max(sum, initMax)
}

func namespaceOptions(p *corev1.Pod) *cri.NamespaceOption {
	o := &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD}
	if p.Spec.HostNetwork {
		o.Network = cri.NamespaceMode_NODE
	}
	if p.Spec.HostPID {
		o.Pid = cri.NamespaceMode_NODE
	}
	if p.Spec.HostIPC {
		o.Ipc = cri.NamespaceMode_NODE
	}
	return o
}

// privileged reports whether any container of p is privileged: the kubelet
// then makes the sandbox privileged too (HasPrivilegedContainer).
func privileged(p *corev1.Pod) bool {
	is := func(sc *corev1.SecurityContext) bool { return sc != nil && sc.Privileged != nil && *sc.Privileged }
	for _, c := range append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...) {
		if is(c.SecurityContext) {
			return true
		}
	}
	for _, c := range p.Spec.EphemeralContainers {
		if is(c.SecurityContext) {
			return true
		}
	}
	return false
}

func (k *kubelet) sandboxConfig(p *corev1.Pod) *cri.PodSandboxConfig {
	cfg := &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)},
		LogDirectory: filepath.Join(k.root, "logs", p.Namespace+"_"+p.Name+"_"+string(p.UID)),
		Annotations:  map[string]string{},
		Labels:       map[string]string{"io.kubernetes.pod.name": p.Name, "io.kubernetes.pod.namespace": p.Namespace, "io.kubernetes.pod.uid": string(p.UID)},
		Linux: &cri.LinuxPodSandboxConfig{
			SecurityContext: &cri.LinuxSandboxSecurityContext{NamespaceOptions: namespaceOptions(p), Privileged: privileged(p)},
			Resources:       &cri.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 2, MemoryLimitInBytes: podMemoryLimit(p)},
		},
	}
	if !p.Spec.HostNetwork {
		// A host-network pod keeps the node's name (and UTS namespace).
		cfg.Hostname = p.Name
	}
	for k, v := range p.Annotations {
		cfg.Annotations[k] = v
	}
	for k, v := range p.Labels {
		cfg.Labels[k] = v
	}
	if sc := p.Spec.SecurityContext; sc != nil && len(sc.Sysctls) > 0 {
		cfg.Linux.Sysctls = map[string]string{}
		for _, s := range sc.Sysctls {
			cfg.Linux.Sysctls[s.Name] = s.Value
		}
	}
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.HostPort != 0 {
				cfg.PortMappings = append(cfg.PortMappings, &cri.PortMapping{Protocol: cri.Protocol_TCP, ContainerPort: port.ContainerPort, HostPort: port.HostPort})
			}
		}
	}
	return cfg
}

// pluginDir is the kubelet's directory name for a volume's plugin
// (pods/UID/volumes/kubernetes.io~<plugin>/<volume>).
var pluginDir = map[string]string{
	"emptyDir": "empty-dir", "configMap": "configmap", "secret": "secret", "projected": "projected",
	"downwardAPI": "downward-api", "persistentVolumeClaim": "csi", "csi": "csi", "nfs": "nfs",
	"iscsi": "iscsi", "fc": "fc",
}

// volumeSource names the set field of a volume source ("emptyDir", ...).
func volumeSource(src corev1.VolumeSource) string {
	v := reflect.ValueOf(src)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown"
}

// mounts makes what the kubelet makes for container c's volume mounts and
// returns the CRI mounts: a hostPath's path as written (a subPath bound
// under volume-subpaths, as the kubelet does), any other volume its
// directory under the pod's, and the pod's /etc/hosts. The binds it made
// are returned for the caller to undo.
func (k *kubelet) mounts(p *corev1.Pod, c corev1.Container, index int) ([]*cri.Mount, []string, error) {
	dir := k.podDir(p)
	hosts := filepath.Join(dir, "etc-hosts")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		return nil, nil, err
	}
	out := []*cri.Mount{{ContainerPath: "/etc/hosts", HostPath: hosts}}
	var binds []string
	for i, m := range c.VolumeMounts {
		var vol *corev1.Volume
		for j := range p.Spec.Volumes {
			if p.Spec.Volumes[j].Name == m.Name {
				vol = &p.Spec.Volumes[j]
			}
		}
		if vol == nil {
			return nil, binds, fmt.Errorf("container %s mounts volume %s, which the pod does not declare", c.Name, m.Name)
		}
		var src string
		if hp := vol.HostPath; hp != nil {
			src = hp.Path
			if m.SubPath != "" {
				// The kubelet binds the subPath's host path into the pod's
				// directory and hands the runtime that bind.
				target := filepath.Join(dir, "volume-subpaths", m.Name, c.Name, fmt.Sprint(i))
				if err := os.MkdirAll(target, 0o750); err != nil {
					return nil, binds, err
				}
				if err := unix.Mount(filepath.Join(hp.Path, m.SubPath), target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
					return nil, binds, fmt.Errorf("bind subPath %s: %w", m.SubPath, err)
				}
				binds = append(binds, target)
				src = target
			}
		} else {
			kind := volumeSource(vol.VolumeSource)
			plugin, ok := pluginDir[kind]
			if !ok {
				plugin = strings.ToLower(kind)
			}
			plugin = "kubernetes.io~" + plugin
			if vol.FlexVolume != nil {
				// A FlexVolume driver's directory is <vendor>~<driver>.
				plugin = strings.ReplaceAll(vol.FlexVolume.Driver, "/", "~")
			}
			src = filepath.Join(dir, "volumes", plugin, m.Name)
			if err := os.MkdirAll(src, 0o750); err != nil {
				return nil, binds, err
			}
		}
		out = append(out, &cri.Mount{ContainerPath: m.MountPath, HostPath: src, Readonly: m.ReadOnly})
	}
	return out, binds, nil
}

func (k *kubelet) containerConfig(p *corev1.Pod, c corev1.Container, index int) (*cri.ContainerConfig, []string, error) {
	mounts, binds, err := k.mounts(p, c, index)
	if err != nil {
		return nil, binds, err
	}
	sc := &cri.LinuxContainerSecurityContext{
		NamespaceOptions: namespaceOptions(p),
		// The kubelet runs a container unconfined by seccomp unless it or
		// the pod names a profile (seccompDefault off, the default).
		Seccomp: &cri.SecurityProfile{ProfileType: cri.SecurityProfile_Unconfined},
	}
	if s := c.SecurityContext; s != nil {
		sc.Privileged = s.Privileged != nil && *s.Privileged
		if s.Capabilities != nil {
			for _, cp := range s.Capabilities.Add {
				sc.Capabilities = &cri.Capability{AddCapabilities: append(capsOf(sc), string(cp))}
			}
		}
		if s.SeccompProfile != nil && s.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault {
			sc.Seccomp = &cri.SecurityProfile{ProfileType: cri.SecurityProfile_RuntimeDefault}
		}
	}
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: c.Name},
		Image:    &cri.ImageSpec{Image: workloadImg},
		Command:  c.Command,
		LogPath:  c.Name + ".log",
		Mounts:   mounts,
		Linux: &cri.LinuxContainerConfig{
			Resources:       &cri.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 2, MemoryLimitInBytes: c.Resources.Limits.Memory().Value()},
			SecurityContext: sc,
		},
	}, binds, nil
}

func capsOf(sc *cri.LinuxContainerSecurityContext) []string {
	if sc.Capabilities == nil {
		return nil
	}
	return sc.Capabilities.AddCapabilities
}

// running is a pod the kubelet started, for the changes made to it.
type running struct {
	sandbox    string
	cfg        *cri.PodSandboxConfig
	containers map[string]string // name -> id
	binds      []string
}

// start runs the pod's sandbox and creates and starts each of its
// containers. It returns the rule ids of every refusal (the sandbox's,
// else each refused container's) and an error for anything else.
func (k *kubelet) start(ctx context.Context, p *corev1.Pod, handler string) (*running, []string, error) {
	cfg := k.sandboxConfig(p)
	if err := os.MkdirAll(cfg.LogDirectory, 0o755); err != nil {
		return nil, nil, err
	}
	resp, err := k.n.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		rules, err := refusal(err)
		if errors.Is(err, errRefused) {
			return nil, rules, nil
		}
		return nil, nil, fmt.Errorf("RunPodSandbox: %w", err)
	}
	r := &running{sandbox: resp.PodSandboxId, cfg: cfg, containers: map[string]string{}}
	var rules []string
	all := append(append([]corev1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
	for i, c := range all {
		refused, err := k.startContainer(ctx, r, p, c, i)
		if err != nil {
			return r, nil, err
		}
		rules = append(rules, refused...)
	}
	return r, rules, nil
}

// startContainer creates and starts c in the running pod; a container the
// node refuses is removed, as the kubelet would.
func (k *kubelet) startContainer(ctx context.Context, r *running, p *corev1.Pod, c corev1.Container, index int) ([]string, error) {
	cc, binds, err := k.containerConfig(p, c, index)
	r.binds = append(r.binds, binds...)
	if err != nil {
		return nil, err
	}
	created, err := k.n.Runtime.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: r.sandbox, Config: cc, SandboxConfig: r.cfg})
	if err != nil {
		rules, err := refusal(err)
		if errors.Is(err, errRefused) {
			return rules, nil
		}
		return nil, fmt.Errorf("CreateContainer %s: %w", c.Name, err)
	}
	if _, err := k.n.Runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		_, _ = k.n.Runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: created.ContainerId})
		rules, err := refusal(err)
		if errors.Is(err, errRefused) {
			return rules, nil
		}
		return nil, fmt.Errorf("StartContainer %s: %w", c.Name, err)
	}
	r.containers[c.Name] = created.ContainerId
	return nil, nil
}

// stop removes the pod and what the kubelet made for it.
func (k *kubelet) stop(ctx context.Context, p *corev1.Pod, r *running) error {
	var errs []error
	if r != nil {
		if _, err := k.n.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: r.sandbox}); err != nil {
			errs = append(errs, fmt.Errorf("StopPodSandbox: %w", err))
		}
		if _, err := k.n.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: r.sandbox}); err != nil {
			errs = append(errs, fmt.Errorf("RemovePodSandbox: %w", err))
		}
		for _, b := range r.binds {
			if err := unix.Unmount(b, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmount %s: %w", b, err))
			}
		}
	}
	if err := os.RemoveAll(k.podDir(p)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// verdict runs a case on the node: the pod, then the change the case makes
// to it. For a change, the pod itself must start; the verdict is the
// change's.
func (k *kubelet) verdict(ctx context.Context, c agreeCase) (_ verdict, err error) {
	handler := ""
	if rc := c.Pod.Spec.RuntimeClassName; rc != nil {
		handler = *rc
	}
	r, rules, err := k.start(ctx, c.Pod, handler)
	if r == nil {
		_ = os.RemoveAll(k.podDir(c.Pod))
	}
	defer func() {
		if r == nil {
			return
		}
		if serr := k.stop(context.WithoutCancel(ctx), c.Pod, r); serr != nil && err == nil {
			err = fmt.Errorf("cleaning the pod up: %w", serr)
		}
	}()
	if err != nil {
		return verdict{}, err
	}
	if c.Op == opCreate {
		return verdictOf(rules), nil
	}
	if r == nil || len(rules) > 0 {
		return verdict{}, fmt.Errorf("the pod to change did not start: refused with %v", rules)
	}
	switch c.Op {
	case opEphemeral:
		ec := c.Later.Spec.EphemeralContainers[0]
		rules, err = k.startContainer(ctx, r, c.Later, corev1.Container(ec.EphemeralContainerCommon), len(r.containers))
		return verdictOf(rules), err
	case opAnnotate:
		// CRI cannot change a running sandbox's annotations: the node sees
		// nothing of the edit.
		return verdictOf(nil), nil
	case opResize:
		id := r.containers[c.Later.Spec.Containers[0].Name]
		_, err := k.n.Runtime.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
			ContainerId: id,
			Linux:       &cri.LinuxContainerResources{CpuPeriod: 100000, CpuShares: 2, MemoryLimitInBytes: c.Later.Spec.Containers[0].Resources.Limits.Memory().Value()},
		})
		rules, err := refusal(err)
		if err != nil && !errors.Is(err, errRefused) {
			return verdict{}, fmt.Errorf("UpdateContainerResources: %w", err)
		}
		return verdictOf(rules), nil
	}
	return verdict{}, fmt.Errorf("unknown operation %q", c.Op)
}
