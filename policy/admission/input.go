package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"reflect"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// Resource names read from container limits.
const (
	resourceGPU       = corev1.ResourceName("nvidia.com/gpu")
	resourceMIGPrefix = "nvidia.com/mig-"
)

// maxGPUCount bounds bulkhead.dev/gpu-count: no node has more slices.
const maxGPUCount = policy.MaxGPUCount

// Supported kinds: the pod itself and every built-in workload with a pod template.
var (
	kindPod         = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	kindDeployment  = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
	kindReplicaSet  = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "ReplicaSet"}
	kindStatefulSet = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "StatefulSet"}
	kindDaemonSet   = schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "DaemonSet"}
	kindJob         = schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"}
	kindCronJob     = schema.GroupVersionKind{Group: "batch", Version: "v1", Kind: "CronJob"}
)

// SupportedKinds lists the kinds Review understands, in the order the
// ValidatingWebhookConfiguration lists their resources.
func SupportedKinds() []schema.GroupVersionKind {
	return []schema.GroupVersionKind{kindPod, kindDeployment, kindReplicaSet, kindStatefulSet, kindDaemonSet, kindJob, kindCronJob}
}

// ErrUnsupportedKind is wrapped by podOf for a kind it cannot read.
var ErrUnsupportedKind = fmt.Errorf("unsupported kind")

// podObject is the pod, or pod template, found in an admitted object.
type podObject struct {
	// Workload is "Pod" or the kind carrying the template ("Deployment", ...).
	Workload string
	// Name is the object's name (generateName when the name is empty).
	Name string
	// Object is the admitted object's own metadata (deletion state, UID).
	Object metav1.ObjectMeta
	// Meta is the pod's metadata: the pod itself or the template's.
	Meta metav1.ObjectMeta
	Spec corev1.PodSpec
	// SpecPath is the field path of Spec in the object ("spec",
	// "spec.template.spec", ...), for errors that name a field.
	SpecPath string
}

// podOf decodes raw as gvk and returns the pod it describes.
func podOf(gvk schema.GroupVersionKind, raw []byte) (podObject, error) {
	decode := func(v any) error {
		if len(raw) == 0 {
			return fmt.Errorf("object: empty")
		}
		if err := scanQuantities(raw); err != nil {
			return fmt.Errorf("object: decoding %s: %w", gvk.Kind, err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			if q := badQuantity(raw); q != nil {
				err = q
			}
			return fmt.Errorf("object: decoding %s: %w", gvk.Kind, err)
		}
		return nil
	}
	var (
		out      podObject
		meta     metav1.ObjectMeta
		tmpl     corev1.PodTemplateSpec
		specPath = "spec.template.spec"
	)
	switch gvk {
	case kindPod:
		var o corev1.Pod
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, corev1.PodTemplateSpec{ObjectMeta: o.ObjectMeta, Spec: o.Spec}
		specPath = "spec"
	case kindDeployment:
		var o appsv1.Deployment
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.Template
	case kindReplicaSet:
		var o appsv1.ReplicaSet
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.Template
	case kindStatefulSet:
		var o appsv1.StatefulSet
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.Template
	case kindDaemonSet:
		var o appsv1.DaemonSet
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.Template
	case kindJob:
		var o batchv1.Job
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.Template
	case kindCronJob:
		var o batchv1.CronJob
		if err := decode(&o); err != nil {
			return out, err
		}
		meta, tmpl = o.ObjectMeta, o.Spec.JobTemplate.Spec.Template
		specPath = "spec.jobTemplate.spec.template.spec"
	default:
		return out, fmt.Errorf("kind %q: %w (supported: Pod, Deployment, ReplicaSet, StatefulSet, DaemonSet, Job, CronJob)", gvk.GroupVersion().String()+" "+gvk.Kind, ErrUnsupportedKind)
	}
	out = podObject{Workload: gvk.Kind, Name: meta.Name, Object: meta, Meta: tmpl.ObjectMeta, Spec: tmpl.Spec, SpecPath: specPath}
	if out.Name == "" {
		out.Name = meta.GenerateName
	}
	return out, nil
}

// HandlerResolver maps a RuntimeClass name to its CRI handler.
type HandlerResolver interface {
	// Handler returns the handler of the named RuntimeClass.
	Handler(runtimeClass string) (string, error)
}

// inputFor builds the policy input for pod in namespace. Usage is left zero.
func inputFor(namespace string, pod podObject, handlers HandlerResolver) (policy.Input, error) {
	in := policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindAdmission,
		Namespace: namespace,
		Pod: policy.Pod{
			Name:        pod.Name,
			UID:         string(pod.Object.UID),
			Annotations: pod.Meta.Annotations,
			Labels:      pod.Meta.Labels,
			HostNetwork: pod.Spec.HostNetwork,
			HostPID:     pod.Spec.HostPID,
			HostIPC:     pod.Spec.HostIPC,
		},
	}
	if rc := pod.Spec.RuntimeClassName; rc != nil && *rc != "" {
		handler := *rc
		if handlers != nil {
			h, err := handlers.Handler(*rc)
			if err != nil {
				return in, fmt.Errorf("spec.runtimeClassName %q: %w", *rc, err)
			}
			handler = h
		}
		in.Pod.RuntimeHandler = handler
	}
	specPath := pod.SpecPath
	if specPath == "" {
		specPath = "spec"
	}
	if err := checkResources(specPath, pod.Spec); err != nil {
		return in, err
	}
	in.Pod.Volumes, in.Pod.Sysctls = volumesOf(pod.Spec.Volumes), sysctlsOf(pod.Spec.SecurityContext)
	in.Pod.ResourceClaims = resourceClaimsOf(pod.Spec.ResourceClaims)
	hostPaths := hostPathVolumes(pod.Spec.Volumes)
	add := func(c corev1.Container, ephemeral bool) {
		out := policy.Container{
			Name:              c.Name,
			Image:             c.Image,
			Ephemeral:         ephemeral,
			AddedCapabilities: addedCapabilities(c.SecurityContext),
			SeccompProfile:    seccompProfile(pod, c),
			AppArmorProfile:   appArmorProfile(pod, c),
		}
		if sc := c.SecurityContext; sc != nil && sc.Privileged != nil {
			out.Privileged = *sc.Privileged
		}
		for _, m := range c.VolumeMounts {
			vol, ok := hostPaths[m.Name]
			if !ok {
				continue
			}
			hp := mountedHostPath(vol, m)
			out.Mounts = append(out.Mounts, policy.Mount{HostPath: hp, Path: m.MountPath, ReadOnly: m.ReadOnly})
			if hp == "/dev" || strings.HasPrefix(hp, "/dev/") {
				out.Devices = append(out.Devices, hp)
			}
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				out.HostPorts = append(out.HostPorts, p.HostPort)
			}
		}
		out.MemoryBytes = containerMemoryLimit(pod.Spec, c)
		for _, e := range c.Env {
			if out.Env == nil {
				out.Env = make(map[string]string, len(c.Env))
			}
			// A value from a Secret or ConfigMap is not in the spec: the
			// name alone is shown, with an empty value.
			out.Env[e.Name] = e.Value
		}
		in.Pod.Containers = append(in.Pod.Containers, out)
	}
	for _, c := range pod.Spec.InitContainers {
		add(c, false)
	}
	for _, c := range pod.Spec.Containers {
		add(c, false)
	}
	// Ephemeral containers arrive through the pods/ephemeralcontainers
	// subresource (kubectl debug) on a running pod; their common part has
	// exactly the fields of a Container, so the conversion stops compiling
	// the day the two types drift apart.
	for _, c := range pod.Spec.EphemeralContainers {
		add(corev1.Container(c.EphemeralContainerCommon), true)
	}
	req, err := requestOf(pod.Meta.Annotations, pod.Spec)
	if err != nil {
		return in, err
	}
	if req.MemoryBytes > maxMemoryBytes {
		return in, fmt.Errorf("%s.containers[*].resources.limits.memory: the pod's memory limits add up to %s, more than any node has (at most %s)",
			specPath, bytesString(req.MemoryBytes), resource.NewQuantity(maxMemoryBytes, resource.BinarySI))
	}
	in.Request = req
	return in, nil
}

// maxMemoryBytes bounds a container's memory limit and the pod's total: 1
// PiB, far above the largest single machines sold (tens of TiB). Anything
// larger is a mistake or an attack on the arithmetic (two 4Ei limits once
// wrapped the pod's int64 total to a negative number), so it is refused
// rather than judged.
const maxMemoryBytes = 1 << 50

// bytesString writes n bytes as a quantity, "saturated" when the sum hit
// the int64 ceiling.
func bytesString(n int64) string {
	if n == math.MaxInt64 {
		return "more than 8Ei (the sum saturated)"
	}
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// checkResources refuses the resource quantities Bulkhead reads (memory,
// nvidia.com/gpu, nvidia.com/mig-*) when they are negative or beyond any
// real node, naming the field. Quantity.Value is no guide to size: it
// returns 0 for 1e30, so a bound is checked on the quantity itself.
func checkResources(specPath string, spec corev1.PodSpec) error {
	check := func(field string, c corev1.ResourceRequirements) error {
		for _, list := range []struct {
			name string
			rl   corev1.ResourceList
		}{{"limits", c.Limits}, {"requests", c.Requests}} {
			for name, q := range list.rl {
				var bound *resource.Quantity
				switch {
				case name == corev1.ResourceMemory:
					bound = resource.NewQuantity(maxMemoryBytes, resource.BinarySI)
				case name == resourceGPU || strings.HasPrefix(string(name), resourceMIGPrefix):
					bound = resource.NewQuantity(maxGPUCount, resource.DecimalSI)
				default:
					continue
				}
				at := fmt.Sprintf("%s.resources.%s[%s]", field, list.name, name)
				if name == corev1.ResourceMemory {
					at = fmt.Sprintf("%s.resources.%s.memory", field, list.name)
				}
				if q.Sign() < 0 {
					return fmt.Errorf("%s: %s is negative", at, q.String())
				}
				if q.Cmp(*bound) > 0 {
					if name == corev1.ResourceMemory {
						return fmt.Errorf("%s: %s is more memory than any node has (at most %s)", at, q.String(), bound)
					}
					return fmt.Errorf("%s: %s GPUs requested, at most %d", at, q.String(), maxGPUCount)
				}
			}
		}
		return nil
	}
	for i, c := range spec.InitContainers {
		if err := check(fmt.Sprintf("%s.initContainers[%d]", specPath, i), c.Resources); err != nil {
			return err
		}
	}
	for i, c := range spec.Containers {
		if err := check(fmt.Sprintf("%s.containers[%d]", specPath, i), c.Resources); err != nil {
			return err
		}
	}
	for i, c := range spec.EphemeralContainers {
		if err := check(fmt.Sprintf("%s.ephemeralContainers[%d]", specPath, i), c.Resources); err != nil {
			return err
		}
	}
	if spec.Resources != nil {
		// The pod-level limit bounds the pod's cgroup and is what it is charged.
		if err := check(specPath, *spec.Resources); err != nil {
			return err
		}
	}
	return nil
}

// resourceClaimsOf lists the pod's DRA claims as the pod spec names them,
// each unread: what a claim asks for lives in the ResourceClaim or
// ResourceClaimTemplate, which readClaims fills in when it can.
func resourceClaimsOf(claims []corev1.PodResourceClaim) []policy.ResourceClaim {
	var out []policy.ResourceClaim
	for _, c := range claims {
		rc := policy.ResourceClaim{Name: c.Name}
		if c.ResourceClaimName != nil {
			rc.ClaimName = *c.ResourceClaimName
		}
		if c.ResourceClaimTemplateName != nil {
			rc.TemplateName = *c.ResourceClaimTemplateName
		}
		out = append(out, rc)
	}
	return out
}

// ClaimReader reads what a DRA claim asks for.
type ClaimReader interface {
	// ClaimSpec returns the spec of the ResourceClaim name in namespace,
	// or, when template is true, the spec of the claims the
	// ResourceClaimTemplate name makes.
	ClaimSpec(namespace, name string, template bool) (*resourcev1.ResourceClaimSpec, error)
}

// readClaims fills in the device requests of every claim reader can read.
// A claim it cannot read (no reader, not found, an error, or a pod entry
// naming neither a claim nor a template) stays unread for the policy to
// judge as unknown; the error is not the pod's fault and not a reason to
// fail the review.
func readClaims(namespace string, claims []policy.ResourceClaim, reader ClaimReader) {
	if reader == nil {
		return
	}
	for i := range claims {
		c := &claims[i]
		var (
			spec *resourcev1.ResourceClaimSpec
			err  error
		)
		switch {
		case c.ClaimName != "" && c.TemplateName == "":
			spec, err = reader.ClaimSpec(namespace, c.ClaimName, false)
		case c.TemplateName != "" && c.ClaimName == "":
			spec, err = reader.ClaimSpec(namespace, c.TemplateName, true)
		default:
			continue
		}
		if err != nil || spec == nil {
			continue
		}
		c.Requests, c.Read = deviceRequestsOf(spec), true
	}
}

// deviceRequestsOf lists a claim's device requests, one per alternative
// of a firstAvailable request (named "request/alternative").
func deviceRequestsOf(spec *resourcev1.ResourceClaimSpec) []policy.DeviceRequest {
	var out []policy.DeviceRequest
	for _, r := range spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, policy.DeviceRequest{Name: r.Name, DeviceClass: e.DeviceClassName, AllocationMode: string(e.AllocationMode), Count: countOf(string(e.AllocationMode), e.Count), Selectors: celOf(e.Selectors)})
		}
		for _, s := range r.FirstAvailable {
			out = append(out, policy.DeviceRequest{Name: r.Name + "/" + s.Name, DeviceClass: s.DeviceClassName, AllocationMode: string(s.AllocationMode), Count: countOf(string(s.AllocationMode), s.Count), Selectors: celOf(s.Selectors)})
		}
	}
	return out
}

// celOf lists the CEL expressions of a request's selectors.
func celOf(sel []resourcev1.DeviceSelector) []string {
	var out []string
	for _, s := range sel {
		if s.CEL != nil {
			out = append(out, s.CEL.Expression)
		}
	}
	return out
}

// countOf is a request's device count: the API server defaults an
// ExactCount request's count to 1, and All has none.
func countOf(mode string, count int64) int64 {
	if mode == string(resourcev1.DeviceAllocationModeAll) {
		return 0
	}
	return max(count, 1)
}

// hostPathVolumes maps the names of hostPath volumes to the path each
// names on the host, as written.
func hostPathVolumes(vols []corev1.Volume) map[string]string {
	out := map[string]string{}
	for _, v := range vols {
		if v.HostPath != nil {
			out[v.Name] = v.HostPath.Path
		}
	}
	return out
}

// cleanHostPath is what the kubelet will mount for a hostPath written as p:
// p cleaned, so "//dev/x" and "/var/../dev/x" read as the /dev/x they
// are. A path that is not absolute (empty included) stays as written, for
// the policy to refuse as such; path.Clean would turn "" into ".".
func cleanHostPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return p
	}
	return path.Clean(p)
}

// mountedHostPath is the host path m binds from a hostPath volume whose
// path is volPath. A subPath is resolved below the volume's root, as the
// kubelet does (path.Join cleans, so ".." cannot climb above "/"). A
// subPathExpr depends on the container's environment and cannot be
// expanded here: the volume's whole path is judged instead, a superset.
func mountedHostPath(volPath string, m corev1.VolumeMount) string {
	if !strings.HasPrefix(volPath, "/") || m.SubPathExpr != "" || m.SubPath == "" {
		return cleanHostPath(volPath)
	}
	return path.Join(volPath, m.SubPath)
}

// volumesOf lists every volume the pod declares, mounted or not.
func volumesOf(vols []corev1.Volume) []policy.Volume {
	var out []policy.Volume
	for _, v := range vols {
		pv := policy.Volume{Name: v.Name, Type: volumeType(v.VolumeSource)}
		if v.HostPath != nil {
			pv.HostPath = cleanHostPath(v.HostPath.Path)
		}
		out = append(out, pv)
	}
	return out
}

// volumeType is the JSON name of the set field of src ("hostPath",
// "emptyDir", "persistentVolumeClaim", ...), or "unknown" when none is
// set (a source this build's k8s.io/api does not know). The API server
// refuses a volume with more than one source.
func volumeType(src corev1.VolumeSource) string {
	v := reflect.ValueOf(src)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown"
}

// sysctlsOf returns the kernel parameters the pod sets, by name.
func sysctlsOf(sc *corev1.PodSecurityContext) map[string]string {
	if sc == nil || len(sc.Sysctls) == 0 {
		return nil
	}
	out := make(map[string]string, len(sc.Sysctls))
	for _, s := range sc.Sysctls {
		out[s.Name] = s.Value
	}
	return out
}

// addedCapabilities returns capabilities.add upper case without the CAP_
// prefix, the way the container runtime reads them ("cap_sys_admin" and
// "SYS_ADMIN" are the same capability).
func addedCapabilities(sc *corev1.SecurityContext) []string {
	if sc == nil || sc.Capabilities == nil {
		return nil
	}
	var out []string
	for _, c := range sc.Capabilities.Add {
		name := strings.ToUpper(strings.TrimSpace(string(c)))
		out = append(out, strings.TrimPrefix(name, "CAP_"))
	}
	return out
}

// seccompProfile is the seccomp profile type that applies to container c:
// the container's own setting, else the pod's. At each level the field and
// the deprecated annotation are both read (the API server copies an
// annotation into an unset field when it creates the pod).
func seccompProfile(pod podObject, c corev1.Container) string {
	var field string
	if sc := c.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		field = string(sc.SeccompProfile.Type)
	}
	if p := profileAt(field, pod.Meta.Annotations[corev1.SeccompContainerAnnotationKeyPrefix+c.Name]); p != "" {
		return p
	}
	field = ""
	if sc := pod.Spec.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		field = string(sc.SeccompProfile.Type)
	}
	return profileAt(field, pod.Meta.Annotations[corev1.SeccompPodAnnotationKey])
}

// appArmorProfile is the AppArmor profile type that applies to container
// c: the container's field or annotation, else the pod's field (AppArmor
// has no pod-wide annotation).
func appArmorProfile(pod podObject, c corev1.Container) string {
	var field string
	if sc := c.SecurityContext; sc != nil && sc.AppArmorProfile != nil {
		field = string(sc.AppArmorProfile.Type)
	}
	if p := profileAt(field, pod.Meta.Annotations[corev1.DeprecatedAppArmorBetaContainerAnnotationKeyPrefix+c.Name]); p != "" {
		return p
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.AppArmorProfile != nil {
		return string(sc.AppArmorProfile.Type)
	}
	return ""
}

// profileAt merges one level's profile field with its legacy annotation.
// Should the two disagree (the API server refuses that for pods), the
// unconfined one wins: the policy judges the weaker of the two.
func profileAt(field, annotation string) string {
	ann := legacyProfileType(annotation)
	switch {
	case field == string(corev1.SeccompProfileTypeUnconfined) || ann == string(corev1.SeccompProfileTypeUnconfined):
		return string(corev1.SeccompProfileTypeUnconfined)
	case field != "":
		return field
	}
	return ann
}

// legacyProfileType maps a seccomp or AppArmor annotation value to the
// profile type the field would hold. A value it does not know is passed on
// as written for the policy to judge.
func legacyProfileType(v string) string {
	switch {
	case v == "":
		return ""
	case v == corev1.SeccompProfileNameUnconfined: // also AppArmor's "unconfined"
		return string(corev1.SeccompProfileTypeUnconfined)
	case v == corev1.SeccompProfileRuntimeDefault || v == corev1.DeprecatedSeccompProfileDockerDefault:
		return string(corev1.SeccompProfileTypeRuntimeDefault)
	case strings.HasPrefix(v, corev1.SeccompLocalhostProfileNamePrefix):
		return string(corev1.SeccompProfileTypeLocalhost)
	}
	return v
}

// requestOf parses what a pod asks Bulkhead for from its annotations and
// resource limits. Errors name the annotation or resource and the rule.
func requestOf(annotations map[string]string, spec corev1.PodSpec) (policy.Request, error) {
	var req policy.Request
	req.MemoryBytes = podMemoryLimit(spec)
	gpus := effectiveLimit(spec, func(c corev1.Container) int64 {
		if q, ok := limitsOf(c)[resourceGPU]; ok {
			return q.Value()
		}
		return 0
	})
	migProfile, migCount, err := migResources(spec)
	if err != nil {
		return req, err
	}

	ann, err := policy.ParseAnnotations(annotations)
	if err != nil {
		return req, err
	}
	profile, hasProfile := ann.Profile, ann.Profile != ""
	count, hasCount := ann.Count, ann.Count != 0
	switch {
	case migProfile != "" && gpus > 0:
		return req, fmt.Errorf("resources: %s and %s%s both requested; ask for one kind of GPU", resourceGPU, resourceMIGPrefix, migProfile)
	case migProfile != "":
		if hasProfile && profile != migProfile {
			return req, fmt.Errorf("annotation %s: %q contradicts resource limit %s%s", policy.AnnotationGPUProfile, profile, resourceMIGPrefix, migProfile)
		}
		profile, hasProfile = migProfile, true
		gpus = migCount
	case gpus > 0 && !hasProfile:
		profile, hasProfile = policy.ProfileWhole, true
	}
	if !hasProfile {
		if hasCount {
			return req, fmt.Errorf("annotation %s: needs %s (or a GPU resource limit)", policy.AnnotationGPUCount, policy.AnnotationGPUProfile)
		}
	} else {
		switch {
		case hasCount && gpus > 0 && int64(count) != gpus:
			return req, fmt.Errorf("annotation %s: %d contradicts the pod's GPU resource limits (%d)", policy.AnnotationGPUCount, count, gpus)
		case !hasCount && gpus > 0:
			if gpus > maxGPUCount {
				return req, fmt.Errorf("resources: %d GPUs requested, at most %d", gpus, maxGPUCount)
			}
			count = int(gpus)
		case !hasCount:
			count = 1
		}
		req.GPU = &policy.GPURequest{Profile: profile, Count: count}
	}

	req.RDMA = ann.RDMA
	return req, nil
}

// podMemoryLimit is the memory limit the kubelet gives the pod's cgroup
// and containerd's io.kubernetes.cri.sandbox-memory, the node's charge:
// the pod-level limit (spec.resources.limits.memory) when set, else the
// containers' effective limit, where a container without one counts 0
// (quota.memory_limit_missing judges those, container by container).
func podMemoryLimit(spec corev1.PodSpec) int64 {
	if n, ok := podLevelMemoryLimit(spec); ok {
		return n
	}
	return effectiveLimit(spec, func(c corev1.Container) int64 {
		if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
			return q.Value()
		}
		return 0
	})
}

// podLevelMemoryLimit is spec.resources.limits.memory, when set and not 0.
func podLevelMemoryLimit(spec corev1.PodSpec) (int64, bool) {
	if spec.Resources == nil {
		return 0, false
	}
	q, ok := spec.Resources.Limits[corev1.ResourceMemory]
	if !ok || q.Value() <= 0 {
		return 0, false
	}
	return q.Value(), true
}

// containerMemoryLimit is the memory limit container c runs with, as the
// kubelet sets it in c's OCI spec (linux.resources.memory.limit, what the
// node judges): c's own limit, else the pod-level limit, else 0 (none).
// An ephemeral container can set no limit of its own (the API server
// refuses resources on one), so it has one only through the pod's.
func containerMemoryLimit(spec corev1.PodSpec, c corev1.Container) int64 {
	if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && q.Value() > 0 {
		return q.Value()
	}
	n, _ := podLevelMemoryLimit(spec)
	return n
}

// migResources reads nvidia.com/mig-<profile> limits (the device plugin's
// "mixed" strategy). A pod may ask for one profile only.
func migResources(spec corev1.PodSpec) (string, int64, error) {
	profile := ""
	var count int64
	var err error
	visit := func(c corev1.Container) {
		for name, q := range limitsOf(c) {
			p, ok := strings.CutPrefix(string(name), resourceMIGPrefix)
			if !ok || q.Value() == 0 {
				continue
			}
			if profile != "" && p != profile && err == nil {
				err = fmt.Errorf("resources: MIG profiles %s%s and %s%s both requested; a pod uses one profile", resourceMIGPrefix, profile, resourceMIGPrefix, p)
			}
			profile = p
		}
	}
	for _, c := range spec.InitContainers {
		visit(c)
	}
	for _, c := range spec.Containers {
		visit(c)
	}
	if err != nil || profile == "" {
		return "", 0, err
	}
	if !policy.IsGPUProfile(profile) {
		return "", 0, fmt.Errorf("resources: %s%s is not a MIG profile", resourceMIGPrefix, profile)
	}
	count = effectiveLimit(spec, func(c corev1.Container) int64 {
		if q, ok := limitsOf(c)[corev1.ResourceName(resourceMIGPrefix+profile)]; ok {
			return q.Value()
		}
		return 0
	})
	return profile, count, nil
}

// limitsOf returns the container's limits, falling back to requests for
// resources that set only a request.
func limitsOf(c corev1.Container) corev1.ResourceList {
	if len(c.Resources.Requests) == 0 {
		return c.Resources.Limits
	}
	out := corev1.ResourceList{}
	for k, v := range c.Resources.Requests {
		out[k] = v
	}
	for k, v := range c.Resources.Limits {
		out[k] = v
	}
	return out
}

// effectiveLimit is the pod-level value Kubernetes uses for a resource:
// the larger of the sum over app and sidecar containers and the largest
// plain init container (sidecars are init containers that keep running).
// The sum saturates at math.MaxInt64 and a negative value counts as 0, so
// no set of limits can wrap it below what one container asks for.
func effectiveLimit(spec corev1.PodSpec, get func(corev1.Container) int64) int64 {
	var sum, initMax int64
	for _, c := range spec.Containers {
		sum = saturatingAdd(sum, max(get(c), 0))
	}
	for _, c := range spec.InitContainers {
		v := max(get(c), 0)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sum = saturatingAdd(sum, v)
			continue
		}
		initMax = max(initMax, v)
	}
	return max(sum, initMax)
}

// saturatingAdd is a+b for non-negative a and b, math.MaxInt64 when that
// would overflow.
func saturatingAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Bounds on a string shaped like a quantity, checked before decoding:
// k8s.io/apimachinery's ParseQuantity spends time quadratic in the digits
// and exponential-looking in a negative exponent (1e-300000 takes 24 ms,
// a million digits 6 s, 1e-30000000 about 10 s), and a body holds many.
// Real quantities have a handful of digits and an exponent of at most 18
// (E) or -9 (n); the API server writes them in that canonical form.
const (
	maxQuantityDigits   = 64
	maxQuantityExponent = 64
	// maxJSONDepth is encoding/json's own nesting limit.
	maxJSONDepth = 10000
)

// ErrQuantityAbsurd is wrapped by podOf for a quantity-shaped string that
// is refused before parsing.
var ErrQuantityAbsurd = errors.New("quantity refused before parsing")

// scanQuantities walks raw JSON once, without decoding it, and refuses a
// string value that ParseQuantity would accept but with more digits or a
// larger exponent than the bounds above, naming its field path. Any string
// value is checked, not only known quantity fields: a field this build
// does not know may be decoded as a quantity too, and no other string of a
// pod spec looks like a 65-digit number. Malformed JSON is left for
// json.Unmarshal to report.
func scanQuantities(raw []byte) error {
	return walkStrings(raw, func(path func() string, s string) error {
		if err := checkQuantityString(s); err != nil {
			return fmt.Errorf("%s: %w", path(), err)
		}
		return nil
	})
}

// badQuantity names the first value under a resources, overhead or
// sizeLimit field that ParseQuantity refuses: encoding/json reports a
// Quantity's own error without the field it came from. raw has passed
// scanQuantities, so each parse is cheap.
func badQuantity(raw []byte) error {
	return walkStrings(raw, func(path func() string, s string) error {
		p := path()
		if !strings.Contains(p, "resources.") && !strings.Contains(p, "overhead.") && !strings.HasSuffix(p, "sizeLimit") {
			return nil
		}
		if _, err := resource.ParseQuantity(s); err != nil {
			return fmt.Errorf("%s: %q: %w", p, truncate(s, 64), err)
		}
		return nil
	})
}

// walkStrings calls visit with every string value of raw (not object keys)
// and a function that returns its field path ("spec.containers[0].image"),
// stopping at the first error. It stops quietly on malformed JSON or beyond
// maxJSONDepth, both of which json.Unmarshal reports.
func walkStrings(raw []byte, visit func(path func() string, s string) error) error {
	type frame struct {
		array bool
		index int
		key   []byte
	}
	var stack []frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.array {
				fmt.Fprintf(&b, "[%d]", f.index)
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.Write(f.key)
		}
		return b.String()
	}
	i, n := 0, len(raw)
	skipSpace := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	// str reads the string at raw[i] ('"'), returns its raw contents and
	// whether it holds an escape; ok false when it never ends.
	str := func() (body []byte, escaped, ok bool) {
		start := i + 1
		for j := start; j < n; j++ {
			switch raw[j] {
			case '\\':
				escaped = true
				j++
			case '"':
				i = j + 1
				return raw[start:j], escaped, true
			}
		}
		return nil, false, false
	}
	for {
		skipSpace()
		if i >= n {
			return nil
		}
		// Inside an object, a key comes before each value.
		if len(stack) > 0 && !stack[len(stack)-1].array {
			top := &stack[len(stack)-1]
			switch raw[i] {
			case '}':
				i++
				stack = stack[:len(stack)-1]
				goto next
			case ',':
				i++
				skipSpace()
			}
			if i >= n || raw[i] != '"' {
				if i < n && raw[i] == '}' {
					continue
				}
				return nil
			}
			key, _, ok := str()
			if !ok {
				return nil
			}
			top.key = key
			skipSpace()
			if i >= n || raw[i] != ':' {
				return nil
			}
			i++
			skipSpace()
			if i >= n {
				return nil
			}
		} else if len(stack) > 0 {
			top := &stack[len(stack)-1]
			switch raw[i] {
			case ']':
				i++
				stack = stack[:len(stack)-1]
				goto next
			case ',':
				i++
				top.index++
				skipSpace()
			}
		}
		// A value.
		if i >= n {
			return nil
		}
		switch c := raw[i]; c {
		case '{', '[':
			if len(stack) >= maxJSONDepth {
				return nil
			}
			i++
			stack = append(stack, frame{array: c == '['})
			continue
		case '"':
			body, escaped, ok := str()
			if !ok {
				return nil
			}
			s := string(body)
			if escaped {
				if json.Unmarshal(raw[i-len(body)-2:i], &s) != nil {
					return nil
				}
			}
			if err := visit(path, s); err != nil {
				return err
			}
		default:
			// A number, true, false or null: up to the next delimiter.
			for i < n && raw[i] != ',' && raw[i] != '}' && raw[i] != ']' && raw[i] != ' ' && raw[i] != '\n' && raw[i] != '\t' && raw[i] != '\r' {
				i++
			}
		}
	next:
		if len(stack) == 0 {
			return nil
		}
	}
}

// checkQuantityString refuses s when ParseQuantity would read it as a
// number with more than maxQuantityDigits digits or an exponent beyond
// maxQuantityExponent. Strings of any other shape are not quantities and
// pass.
func checkQuantityString(s string) error {
	j := 0
	if j < len(s) && (s[j] == '+' || s[j] == '-') {
		j++
	}
	digits := 0
	for ; j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.'); j++ {
		if s[j] != '.' {
			digits++
		}
	}
	if digits == 0 {
		return nil
	}
	rest := s[j:]
	switch rest {
	case "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E":
		if digits > maxQuantityDigits {
			return fmt.Errorf("%w: %d digits, at most %d", ErrQuantityAbsurd, digits, maxQuantityDigits)
		}
		return nil
	}
	if rest[0] != 'e' && rest[0] != 'E' {
		return nil
	}
	exp := rest[1:]
	if exp != "" && (exp[0] == '+' || exp[0] == '-') {
		exp = exp[1:]
	}
	if exp == "" || strings.TrimLeft(exp, "0123456789") != "" {
		return nil
	}
	if digits > maxQuantityDigits {
		return fmt.Errorf("%w: %d digits, at most %d", ErrQuantityAbsurd, digits, maxQuantityDigits)
	}
	if e := strings.TrimLeft(exp, "0"); len(e) > 4 || atoi(e) > maxQuantityExponent {
		return fmt.Errorf("%w: exponent %s, at most %d either way", ErrQuantityAbsurd, truncate(rest, 24), maxQuantityExponent)
	}
	return nil
}

// atoi reads at most 4 decimal digits; "" is 0.
func atoi(s string) int {
	v := 0
	for _, c := range s {
		v = v*10 + int(c-'0')
	}
	return v
}

// truncate shortens s for a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
