package agreement

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/bulkhead-runtime/bulkhead/test/images"
)

// The default tiers and the namespace of each one's tenant (tenantsJSON).
const (
	trusted   = "trusted"
	standard  = "standard"
	untrusted = "untrusted"
)

var tiers = []string{trusted, standard, untrusted}

// tierNamespace is the namespace of each tier's ordinary tenant; a suffix
// picks its tight-quota (-tight) or full (-full) sibling.
var tierNamespace = map[string]string{trusted: "platform", standard: "research", untrusted: "agents"}

// RuntimeClass names, each the CRI handler of the same name (the webhook
// runs without a HandlerResolver, as the test node registers them).
const (
	gvisor = "bulkhead"      // Bulkhead's gVisor shim
	runc   = "bulkhead-runc" // Bulkhead's runc shim
	none   = ""              // no runtimeClassName: containerd's default runtime
)

var handlerLabel = map[string]string{gvisor: "gvisor", runc: "runc", none: "no-handler"}

// tenantsJSON is the table's tenants. Quotas are generous for the ordinary
// tenants, so that pods of the table running at once on the node never
// reach them; the -tight and -full tenants exist for the over-quota rows.
const tenantsJSON = `{"bulkhead": {"tenants": {
  "agents":          {"tier": "untrusted", "namespaces": ["agents"], "egress_cidrs": ["10.96.0.0/12"], "quota": {"sandboxes": 1000, "gpu_slices": 7, "memory": "1Ti"}},
  "agents-tight":    {"tier": "untrusted", "namespaces": ["agents-tight"], "quota": {"sandboxes": 1000, "gpu_slices": 2, "memory": "1Gi"}},
  "agents-full":     {"tier": "untrusted", "namespaces": ["agents-full"], "quota": {"sandboxes": 0, "memory": "1Ti"}},
  "agents-meta":     {"tier": "untrusted", "namespaces": ["agents-meta"], "egress_cidrs": ["169.254.169.254/32", "169.254.170.2/32", "100.100.100.200/32"], "quota": {"memory": "1Ti"}},
  "agents-badcidr":  {"tier": "untrusted", "namespaces": ["agents-badcidr"], "egress_cidrs": ["10.0.0.0/33"], "quota": {"memory": "1Ti"}},
  "research":        {"tier": "standard", "namespaces": ["research"], "quota": {"sandboxes": 1000, "gpu_slices": 28, "memory": "1Ti"}},
  "research-tight":  {"tier": "standard", "namespaces": ["research-tight"], "quota": {"sandboxes": 1000, "gpu_slices": 2, "memory": "1Gi"}},
  "research-full":   {"tier": "standard", "namespaces": ["research-full"], "quota": {"sandboxes": 0, "memory": "1Ti"}},
  "research-meta":   {"tier": "standard", "namespaces": ["research-meta"], "egress_cidrs": ["169.254.169.254/32"], "quota": {"memory": "1Ti"}},
  "platform":        {"tier": "trusted", "namespaces": ["platform"]},
  "platform-tight":  {"tier": "trusted", "namespaces": ["platform-tight"], "quota": {"sandboxes": 1000, "gpu_slices": 2, "memory": "1Gi"}},
  "platform-full":   {"tier": "trusted", "namespaces": ["platform-full"], "quota": {"sandboxes": 0}},
  "platform-meta":   {"tier": "trusted", "namespaces": ["platform-meta"], "egress_cidrs": ["169.254.169.254/32"]}
}}}`

// enforcement overrides the default bundle's for the table: a missing
// memory limit refuses (issue 24 hole 2 is about exactly that setting),
// so that it shows in both sides' verdicts rather than as a warning only
// the webhook returns.
var enforcement = map[string]string{"quota.memory_limit_missing": "deny"}

// verdict is one side's answer: allowed, or refused with these deny rule
// ids (sorted, each once). Warn and audit reasons are not compared: the
// node returns none of them through CRI.
type verdict struct {
	Allow bool
	Rules []string
}

func (v verdict) String() string {
	if v.Allow {
		return "allow"
	}
	return "deny " + strings.Join(v.Rules, ",")
}

func (v verdict) equal(o verdict) bool { return v.Allow == o.Allow && slices.Equal(v.Rules, o.Rules) }

// verdictOf is allow for no rules, else a deny naming them.
func verdictOf(rules []string) verdict {
	rules = slices.Clone(rules)
	slices.Sort(rules)
	rules = slices.Compact(rules)
	return verdict{Allow: len(rules) == 0, Rules: rules}
}

// Operations a case performs. Create is a new pod; the others change a pod
// that was admitted and runs.
const (
	opCreate    = ""
	opEphemeral = "ephemeral" // kubectl debug: UPDATE pods/ephemeralcontainers; a container created in the running sandbox
	opAnnotate  = "annotate"  // UPDATE of the pod changing a bulkhead.dev/ request annotation
	opResize    = "resize"    // UPDATE pods/resize; CRI UpdateContainerResources
	resizeTo    = "2Gi"       // the memory limit a resize asks for
	resizeFrom  = "512Mi"     // the limit the pod starts with
	defaultMem  = "64Mi"      // every container's limit unless a case says otherwise
	workloadImg = images.WorkloadImage
)

// agreeCase is one row of the table.
type agreeCase struct {
	// Name says what the row is: tier/handler/variant.
	Name string
	// Pod is the pod as created (for updates: as first admitted).
	Pod *corev1.Pod
	// Op is opCreate or the change made to the running pod.
	Op string
	// Later is the pod after the change, for ops other than opCreate.
	Later *corev1.Pod
	// Webhook and Node are the expected verdicts, written down from the
	// tier table; equal unless Invisible says why not.
	Webhook, Node verdict
	// Invisible says what one side cannot see, when Webhook and Node differ.
	Invisible string
	// Pending names the open hole this row waits for ("issue 24 hole N"):
	// the row is reported as a skip, never a pass, until the fix lands and
	// the field is removed.
	Pending string
	// Serial rows run alone on the node: they hold GPU capacity or a
	// tenant's quota that another row running at once would change.
	Serial bool
}

// Reasons a side cannot see what the other does (docs/security.md).
const (
	whyNoHandler = "no RuntimeClass: the webhook judges the pod under data.bulkhead.default_handler_runtime (runc), which standard and untrusted refuse; " +
		"a node runs it under containerd's default runtime: where that is runc no Bulkhead shim ever sees the pod, and on this test node it is Bulkhead's gVisor shim, which judges it as handler bulkhead"
	whyHostPort   = "host ports go from the kubelet to containerd's CNI call (portmap), never into the OCI spec: workload.host_port is judged at admission only"
	whyUnconfined = "the node cannot tell an explicit seccomp/AppArmor Unconfined from a pod that names no profile: workload.unconfined is judged at admission only"
	whyNetRaw     = "NET_RAW is in containerd's default capability set, so on the node it is not an added capability; admission refuses the explicit add"
	whyUnmounted  = "a node sees mounts, not volumes: a hostPath volume mounted nowhere gives the pod nothing there, and admission refuses it"
	whyCDI        = "containerd passes the node only bulkhead.dev/ pod annotations (pod_annotations), so a cdi.k8s.io/ pod annotation never reaches the shim; the node judges the device nodes a CDI spec injects (workload.device_forbidden)"
	whyDevDir     = "the webhook reads a hostPath under /dev as a host device too (workload.device_forbidden); the node sees a bind mount and judges its host path (workload.host_path)"
	whyDRA        = "a DRA claim reaches the node only as the devices its driver injects once the scheduler allocated it: the node cannot read the claim, and judges those device nodes (no DRA driver runs here, so there are none)"
	whyDevicePlug = "a GPU asked for as a device-plugin resource (nvidia.com/mig-*) reaches the node as the plugin's devices, not as a Bulkhead request: the node judges only bulkhead.dev/gpu-profile (and the plugin's device nodes, none here)"
	whyVolumeType = "the kubelet mounts every volume under the pod's own directory (kubernetes.io~<plugin>), which the node counts as the pod's own files: it cannot tell an inline nfs/iscsi/fc/flexVolume source from a claim, so workload.volume_type is judged at admission"
	whyAnnotation = "a sandbox's annotations are fixed when RunPodSandbox creates it: CRI has no call that changes them, so only the webhook sees an annotation edited on a running pod"
	whyPrivileged = "a privileged container's OCI spec carries every capability and every host device: the node, which sees the spec, refuses them too (workload.capability, workload.device_forbidden); the webhook sees the one flag"
)

// rule ids of the default bundle and the node, named once for the table.
const (
	rHostNS        = "workload.host_namespace"
	rPrivileged    = "workload.privileged"
	rHostPath      = "workload.host_path"
	rDevice        = "workload.device_forbidden"
	rCapability    = "workload.capability"
	rHostPort      = "workload.host_port"
	rSysctl        = "workload.sysctl"
	rUnconfined    = "workload.unconfined"
	rCDI           = "workload.cdi_device"
	rVolumeType    = "workload.volume_type"
	rDeviceClass   = "workload.device_class"
	rClaimUnread   = "workload.claim_unread"
	rDRAForbidden  = "gpu.dra_forbidden"
	rRuncForbidden = "runtime.runc_forbidden"
	rHandlerReq    = "runtime.handler_required"
	rMismatch      = "identity.annotation_mismatch"
	rUnknownNS     = "tenant.unknown_namespace"
	rRDMA          = "rdma.forbidden"
	rMemMissing    = "quota.memory_limit_missing"
	rQuotaMemory   = "quota.memory"
	rQuotaSbx      = "quota.sandboxes"
	rQuotaGPU      = "quota.gpu_slices"
	rEgressCIDR    = "network.egress_cidr_invalid"
	rMIGInGVisor   = "gpu.mig_in_gvisor"
	rTooLarge      = "gpu.profile_too_large"
	rWhole         = "gpu.whole_forbidden"
	rUnknownGPU    = "gpu.profile_unknown"
	rMaxSlices     = "gpu.max_slices"
	rGPUCount      = "gpu.count"
	// rAnnotationImmutable is the webhook's own (policy/admission, not the bundle).
	rAnnotationImmutable = "request.annotation_immutable"
)

// stage is where the node judges a request: at RunPodSandbox, from the
// sandbox's spec (host namespaces, sysctls, request annotations, quota),
// or when each container is created (mounts, devices, capabilities,
// privilege, memory limits). A node that
// refuses the sandbox never sees its containers.
type stage int

const (
	atSandbox stage = iota
	atContainer
)

// variant is one way a pod asks the host for something, with the deny rule
// ids each tier earns: webhook, and node where it differs (invisible says why).
type variant struct {
	name      string
	edit      func(*corev1.Pod)
	stage     stage
	webhook   map[string][]string
	node      map[string][]string // nil: as webhook
	invisible string
	pending   string
}

// below is rules for standard and untrusted, none for trusted.
func below(rules ...string) map[string][]string {
	return map[string][]string{standard: rules, untrusted: rules}
}

func mainOf(p *corev1.Pod) *corev1.Container { return &p.Spec.Containers[0] }

func securityContext(c *corev1.Container) *corev1.SecurityContext {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	return c.SecurityContext
}

func hostPathVolume(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path}}}
}

// mountVolume declares v and mounts it in the main container.
func mountVolume(v corev1.Volume, readOnly bool) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, v)
		c := mainOf(p)
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name, ReadOnly: readOnly})
	}
}

func addCaps(caps ...corev1.Capability) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		securityContext(mainOf(p)).Capabilities = &corev1.Capabilities{Add: caps}
	}
}

func sysctl(name, value string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: name, Value: value}}}
	}
}

func annotate(key, value string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[key] = value
	}
}

// hostAccess is every way of asking for the host that the table crosses
// with tiers and handlers.
var hostAccess = []variant{
	{name: "plain", edit: func(*corev1.Pod) {}},
	{name: "hostNetwork", edit: func(p *corev1.Pod) { p.Spec.HostNetwork = true }, webhook: below(rHostNS)},
	{name: "hostPID", edit: func(p *corev1.Pod) { p.Spec.HostPID = true }, webhook: below(rHostNS)},
	// containerd binds the host's /dev/shm into a hostIPC pod: the node
	// judges it as the namespace, as the webhook judges the field.
	{name: "hostIPC", edit: func(p *corev1.Pod) { p.Spec.HostIPC = true }, webhook: below(rHostNS)},
	// The kubelet marks the sandbox privileged too, which for containerd
	// only unconfines the pause container: the node judges the container.
	{name: "privileged", edit: func(p *corev1.Pod) { securityContext(mainOf(p)).Privileged = ptr.To(true) }, stage: atContainer,
		webhook: below(rPrivileged), node: below(rPrivileged, rCapability, rDevice), invisible: whyPrivileged},
	{name: "hostPath-etc-ro", edit: mountVolume(hostPathVolume("etc", "/etc"), true), stage: atContainer, webhook: below(rHostPath)},
	{name: "hostPath-varlog-rw", edit: mountVolume(hostPathVolume("log", "/var/log"), false), stage: atContainer, webhook: below(rHostPath)},
	{name: "hostPath-double-slash", edit: mountVolume(hostPathVolume("etc", "//etc"), true), stage: atContainer, webhook: below(rHostPath)},
	{name: "hostPath-subpath", edit: func(p *corev1.Pod) {
		mountVolume(hostPathVolume("root", "/"), true)(p)
		mainOf(p).VolumeMounts[0].SubPath = "etc"
	}, stage: atContainer, webhook: below(rHostPath)},
	{name: "hostPath-dev-null", edit: mountVolume(hostPathVolume("null", "/dev/null"), false), stage: atContainer,
		webhook: below(rHostPath, rDevice), node: below(rHostPath), invisible: whyDevDir},
	{name: "hostPath-unmounted", edit: func(p *corev1.Pod) {
		p.Spec.Volumes = append(p.Spec.Volumes, hostPathVolume("unused", "/var/lib/kubelet"))
	},
		stage: atContainer, webhook: below(rHostPath), node: map[string][]string{}, invisible: whyUnmounted},
	{name: "cap-SYS_ADMIN", edit: addCaps("SYS_ADMIN"), stage: atContainer, webhook: below(rCapability)},
	{name: "cap-NET_ADMIN", edit: addCaps("NET_ADMIN"), stage: atContainer, webhook: below(rCapability)},
	{name: "cap-NET_RAW", edit: addCaps("NET_RAW"), stage: atContainer, webhook: below(rCapability), node: map[string][]string{}, invisible: whyNetRaw},
	{name: "cap-CHOWN", edit: addCaps("CHOWN"), stage: atContainer},
	{name: "hostPort", edit: func(p *corev1.Pod) {
		mainOf(p).Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, Protocol: corev1.ProtocolTCP}}
	}, stage: atContainer, webhook: below(rHostPort), node: map[string][]string{}, invisible: whyHostPort},
	{name: "sysctl-safe", edit: sysctl("net.ipv4.tcp_syncookies", "1")},
	{name: "sysctl-unsafe", edit: sysctl("kernel.msgmax", "65536"), webhook: below(rSysctl)},
	{name: "seccomp-unconfined", edit: func(p *corev1.Pod) {
		securityContext(mainOf(p)).SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
	}, stage: atContainer, webhook: below(rUnconfined), node: map[string][]string{}, invisible: whyUnconfined},
	{name: "rdma", edit: annotate("bulkhead.dev/rdma", "true"), webhook: map[string][]string{untrusted: {rRDMA}}},
	{name: "cdi-annotation", edit: annotate("cdi.k8s.io/agreement", "example.com/device=one"),
		webhook: below(rCDI), node: map[string][]string{}, invisible: whyCDI},
	{name: "tier-claim", edit: annotate("bulkhead.dev/tier", trusted), webhook: below(rMismatch)},
	{name: "tenant-claim", edit: annotate("bulkhead.dev/tenant", "platform"), webhook: below(rMismatch)},
}

// handlerRules is what the handler alone earns on each side: the node
// judges it at RunPodSandbox.
func handlerRules(tier, handler string) (webhook, node []string, why string) {
	switch {
	case handler == runc && tier != trusted:
		return []string{rRuncForbidden}, []string{rRuncForbidden}, ""
	case handler == none && tier != trusted:
		// The node runs it under its default runtime, here Bulkhead's gVisor shim.
		return []string{rHandlerReq}, nil, whyNoHandler
	}
	return nil, nil, ""
}

// newPod is an ordinary pod of tier's tenant: one container with a memory
// limit, under the handler's RuntimeClass.
func newPod(namespace, handler string) *corev1.Pod {
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Labels: map[string]string{"app": "agreement"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{container("main", defaultMem)},
		},
	}
	if handler != none {
		p.Spec.RuntimeClassName = ptr.To(handler)
	}
	return p
}

// container is a busybox container with memory limit mem ("" for none).
func container(name, mem string) corev1.Container {
	c := corev1.Container{Name: name, Image: workloadImg, Command: []string{"/bin/sh", "-c", "exec sleep 3600"}}
	if mem != "" {
		c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)}
	}
	return c
}

// table builds every case. Expectations come from the variants' per-tier
// rule ids above and the staging of the node (sandbox before containers),
// never from either side.
func table() []agreeCase {
	var cases []agreeCase
	add := func(c agreeCase) {
		c.Pod.Name = fmt.Sprintf("c%03d", len(cases))
		c.Pod.UID = types.UID("agreement-" + c.Pod.Name)
		if c.Later != nil {
			c.Later.Name, c.Later.UID = c.Pod.Name, c.Pod.UID
		}
		cases = append(cases, c)
	}

	// Tiers × handlers × host access.
	for _, tier := range tiers {
		for _, handler := range []string{gvisor, runc, none} {
			for _, v := range hostAccess {
				if handler == none && v.name != "plain" {
					continue // the handler alone decides; one row per tier says so
				}
				hw, hn, why := handlerRules(tier, handler)
				vw := v.webhook[tier]
				vn := vw
				if v.node != nil {
					vn = v.node[tier]
				}
				webhook := append(slices.Clone(hw), vw...)
				sandbox := slices.Clone(hn)
				if v.stage == atSandbox {
					sandbox = append(sandbox, vn...)
				}
				node := sandbox
				if len(sandbox) == 0 {
					node = vn
				}
				if v.stage == atContainer && len(hn) > 0 && len(vn) > 0 {
					// The node refuses the sandbox and never sees the
					// container's request: nothing to compare beyond the
					// handler's own row.
					continue
				}
				reasons := []string{}
				if why != "" && !slices.Equal(hw, hn) {
					reasons = append(reasons, why)
				}
				if v.invisible != "" && !slices.Equal(vw, vn) {
					reasons = append(reasons, v.invisible)
				}
				p := newPod(tierNamespace[tier], handler)
				v.edit(p)
				add(agreeCase{
					Name: tier + "/" + handlerLabel[handler] + "/" + v.name, Pod: p,
					Webhook: verdictOf(webhook), Node: verdictOf(node),
					Invisible: strings.Join(reasons, "; "), Pending: v.pending,
				})
			}
		}
	}

	for _, c := range gpuCases() {
		add(c)
	}
	for _, c := range otherCases() {
		add(c)
	}
	return cases
}

// tierGPU is each tier's GPU settings in the default bundle (docs/policy.md).
var tierGPU = map[string]struct {
	maxProfileSlices, maxSlices int
	whole, migRefuse            bool
}{
	trusted:   {7, 56, true, false},
	standard:  {7, 28, true, false},
	untrusted: {3, 7, false, true},
}

// quotaSlices is the GPU slice quota of each tier's ordinary tenant (0: none).
var quotaSlices = map[string]int{trusted: 0, standard: 28, untrusted: 7}

// profileSlices is the MIG catalogue the table uses (rego/data.json).
var profileSlices = map[string]int{"1g.18gb": 1, "3g.71gb": 3, "4g.71gb": 4, "7g.141gb": 7, "whole": 7}

// gpuRules is what the bundle answers for a GPU request of tier's tenant
// (usage zero) under handler, from the tier's settings alone.
func gpuRules(tier, handler, profile string, count, quota int) []string {
	s := tierGPU[tier]
	var r []string
	n, known := profileSlices[profile]
	switch {
	case !known:
		return []string{rUnknownGPU}
	case profile == "whole":
		if !s.whole {
			r = append(r, rWhole)
		}
	default:
		if n > s.maxProfileSlices {
			r = append(r, rTooLarge)
		}
		if handler == gvisor && s.migRefuse {
			r = append(r, rMIGInGVisor)
		}
	}
	if count > 1 {
		// A node places one GPU or slice per pod; the bundle says so too.
		r = append(r, rGPUCount)
	}
	if n*count > s.maxSlices {
		r = append(r, rMaxSlices)
	}
	if quota > 0 && n*count > quota {
		r = append(r, rQuotaGPU)
	}
	return r
}

// gpuCases crosses tiers and both shims with GPU requests. They hold the
// node's (mock) GPUs, so they run one at a time.
func gpuCases() []agreeCase {
	type req struct {
		profile string
		count   int
	}
	reqs := []req{{"1g.18gb", 1}, {"3g.71gb", 1}, {"4g.71gb", 1}, {"7g.141gb", 1}, {"whole", 1}, {"1g.18gb", 2}, {"5g.99gb", 1}}
	var out []agreeCase
	for _, tier := range tiers {
		for _, handler := range []string{gvisor, runc} {
			for _, q := range reqs {
				hw, _, _ := handlerRules(tier, handler)
				rules := append(slices.Clone(hw), gpuRules(tier, handler, q.profile, q.count, quotaSlices[tier])...)
				c := agreeCase{
					Name:    fmt.Sprintf("%s/%s/gpu-%s-x%d", tier, handlerLabel[handler], q.profile, q.count),
					Pod:     newPod(tierNamespace[tier], handler),
					Webhook: verdictOf(rules), Node: verdictOf(rules), Serial: true,
				}
				annotate("bulkhead.dev/gpu-profile", q.profile)(c.Pod)
				if q.count != 1 {
					annotate("bulkhead.dev/gpu-count", fmt.Sprint(q.count))(c.Pod)
				}
				out = append(out, c)
			}
		}
		// The same slice asked for as a device-plugin resource.
		c := agreeCase{
			Name: tier + "/gvisor/gpu-resource-limit", Pod: newPod(tierNamespace[tier], gvisor), Serial: true,
			Webhook: verdictOf(gpuRules(tier, gvisor, "1g.18gb", 1, quotaSlices[tier])), Node: verdictOf(nil),
		}
		mainOf(c.Pod).Resources.Limits["nvidia.com/mig-1g.18gb"] = resource.MustParse("1")
		if !c.Webhook.equal(c.Node) {
			c.Invisible = whyDevicePlug
		}
		out = append(out, c)
	}
	return out
}

// memoryQuota reports whether tier's ordinary tenant has a memory quota.
func memoryQuota(tier string) bool { return tier != trusted }

// otherCases are the rows that are not a plain cross product: resources
// and quotas, DRA claims, volume types, egress, identity, and changes to a
// running pod.
func otherCases() []agreeCase {
	var out []agreeCase
	both := func(name string, p *corev1.Pod, rules ...string) agreeCase {
		return agreeCase{Name: name, Pod: p, Webhook: verdictOf(rules), Node: verdictOf(rules)}
	}
	ifQuota := func(tier string, rules ...string) []string {
		if memoryQuota(tier) {
			return rules
		}
		return nil
	}
	for _, tier := range tiers {
		ns := tierNamespace[tier]
		label := func(s string) string { return tier + "/gvisor/" + s }

		// Memory limits and quotas.
		p := newPod(ns, gvisor)
		mainOf(p).Resources.Limits = nil
		out = append(out, both(label("memory-none"), p, ifQuota(tier, rMemMissing)...))

		p = newPod(ns, gvisor)
		p.Spec.Containers = append(p.Spec.Containers, container("sidecar", ""))
		c := both(label("memory-one-container-unlimited"), p, ifQuota(tier, rMemMissing)...)
		out = append(out, c)

		p = newPod(ns, gvisor)
		p.Spec.InitContainers = []corev1.Container{container("init", "512Mi")}
		out = append(out, both(label("memory-init-larger"), p))

		p = newPod(ns, gvisor)
		p.Spec.InitContainers = []corev1.Container{container("init", "")}
		out = append(out, both(label("memory-init-unlimited"), p, ifQuota(tier, rMemMissing)...))

		p = newPod(ns+"-tight", gvisor)
		mainOf(p).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("2Gi")
		out = append(out, both(label("memory-over-quota"), p, rQuotaMemory))

		p = newPod(ns+"-tight", gvisor)
		mainOf(p).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("600Mi")
		p.Spec.Containers = append(p.Spec.Containers, container("sidecar", "600Mi"))
		out = append(out, both(label("memory-sum-over-quota"), p, rQuotaMemory))

		p = newPod(ns+"-full", gvisor)
		out = append(out, both(label("sandboxes-over-quota"), p, rQuotaSbx))

		// GPU slices over the tenant's quota of 2: each tier on a shim
		// that can hold the slice it asks for where one exists.
		handler := gvisor
		if tier == trusted {
			handler = runc
		}
		p = newPod(ns+"-tight", handler)
		annotate("bulkhead.dev/gpu-profile", "3g.71gb")(p)
		c = both(tier+"/"+handlerLabel[handler]+"/gpu-over-quota", p, gpuRules(tier, handler, "3g.71gb", 1, 2)...)
		c.Serial = true
		out = append(out, c)

		// DRA claims: the webhook reads them (claimReader), the node cannot.
		for _, claim := range []struct {
			name string
			src  corev1.PodResourceClaim
			rule string
		}{
			{"dra-gpu-claim", corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To(claimGPU)}, rDRAForbidden},
			{"dra-other-class", corev1.PodResourceClaim{Name: "fpga", ResourceClaimName: ptr.To(claimFPGA)}, rDeviceClass},
			{"dra-claim-unread", corev1.PodResourceClaim{Name: "gone", ResourceClaimTemplateName: ptr.To("no-such-template")}, rClaimUnread},
		} {
			p = newPod(ns, gvisor)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{claim.src}
			mainOf(p).Resources.Claims = []corev1.ResourceClaim{{Name: claim.src.Name}}
			c := agreeCase{Name: label(claim.name), Pod: p, Webhook: verdictOf(below(claim.rule)[tier]), Node: verdictOf(nil)}
			if !c.Webhook.equal(c.Node) {
				c.Invisible = whyDRA
			}
			out = append(out, c)
		}

		// Volume types: Pod Security "restricted"'s pass everywhere, the
		// others only in trusted.
		for _, v := range []corev1.Volume{
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
			{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
			{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
			{Name: "inline-csi", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "example.csi.k8s.io"}}},
		} {
			p = newPod(ns, gvisor)
			mountVolume(v, false)(p)
			out = append(out, both(label("volume-"+v.Name), p))
		}
		for _, v := range []corev1.Volume{
			{Name: "nfs", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "198.51.100.7", Path: "/export"}}},
			{Name: "iscsi", VolumeSource: corev1.VolumeSource{ISCSI: &corev1.ISCSIVolumeSource{TargetPortal: "198.51.100.7:3260", IQN: "iqn.2026-12.example:disk", Lun: 0}}},
			{Name: "fc", VolumeSource: corev1.VolumeSource{FC: &corev1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: ptr.To[int32](0)}}},
			{Name: "flex", VolumeSource: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{Driver: "example.com/flex"}}},
		} {
			p = newPod(ns, gvisor)
			mountVolume(v, false)(p)
			c := agreeCase{Name: label("volume-" + v.Name), Pod: p, Webhook: verdictOf(below(rVolumeType)[tier]), Node: verdictOf(nil)}
			if !c.Webhook.equal(c.Node) {
				c.Invisible = whyVolumeType
			}
			out = append(out, c)
		}

		// Egress allow-lists that name cloud metadata endpoints: audited,
		// never a refusal (the fence keeps them blocked).
		out = append(out, both(label("egress-lists-metadata"), newPod(ns+"-meta", gvisor)))

		// An ephemeral (debug) container added to a running pod: with an
		// added capability, and, like every ephemeral container, without a
		// memory limit.
		// (A privileged one would never reach Bulkhead: containerd refuses a
		// privileged container in a sandbox that is not.)
		for _, e := range []struct {
			name     string
			sysAdmin bool
		}{{"ephemeral-debug", false}, {"ephemeral-SYS_ADMIN", true}} {
			p = newPod(ns, gvisor)
			later := p.DeepCopy()
			ec := corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon(container("debugger", ""))}
			var rules []string
			if e.sysAdmin {
				ec.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
				rules = below(rCapability)[tier]
			}
			rules = append(rules, ifQuota(tier, rMemMissing)...)
			later.Spec.EphemeralContainers = []corev1.EphemeralContainer{ec}
			out = append(out, agreeCase{Name: label(e.name), Pod: p, Op: opEphemeral, Later: later, Webhook: verdictOf(rules), Node: verdictOf(rules)})
		}

		// A request annotation removed from a running pod (hole 3): the
		// request itself is harmless, the edit is not.
		p = newPod(ns, gvisor)
		annotate("bulkhead.dev/rdma", "false")(p)
		later := p.DeepCopy()
		delete(later.Annotations, "bulkhead.dev/rdma")
		out = append(out, agreeCase{
			Name: label("annotation-edited"), Pod: p, Op: opAnnotate, Later: later,
			Webhook: verdictOf([]string{rAnnotationImmutable}), Node: verdictOf(nil), Invisible: whyAnnotation,
		})

		// An in-place resize past the tenant's memory quota (hole 1).
		p = newPod(ns+"-tight", gvisor)
		mainOf(p).Resources.Limits[corev1.ResourceMemory] = resource.MustParse(resizeFrom)
		later = p.DeepCopy()
		mainOf(later).Resources.Limits[corev1.ResourceMemory] = resource.MustParse(resizeTo)
		out = append(out, agreeCase{
			Name: label("resize-over-quota"), Pod: p, Op: opResize, Later: later,
			Webhook: verdictOf([]string{rQuotaMemory}), Node: verdictOf([]string{rQuotaMemory}), Serial: true,
		})
	}

	// Identity and data: a namespace no tenant lists, a tenant whose
	// allow-list is malformed.
	out = append(out, both("none/gvisor/unknown-namespace", newPod("default", gvisor), rUnknownNS))
	out = append(out, both("untrusted/gvisor/egress-cidr-invalid", newPod("agents-badcidr", gvisor), rEgressCIDR))
	return out
}

// DRA claims the webhook's claim reader knows, in every namespace.
const (
	claimGPU  = "gpu-claim"
	claimFPGA = "fpga-claim"
)

// claimClasses maps each readable claim to its device class.
var claimClasses = map[string]string{claimGPU: "gpu.nvidia.com", claimFPGA: "fpga.example.com"}

// caseNames lists the rows' names, to catch duplicates.
func caseNames(cases []agreeCase) map[string]int {
	names := map[string]int{}
	for _, c := range cases {
		names[c.Name]++
	}
	return names
}
