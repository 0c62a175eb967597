package policy

import "context"

// ContractVersion is the version of the input and decision documents below.
// A bundle may check input.version to refuse inputs it was not written for.
const ContractVersion = "v1"

// Input kinds.
const (
	KindSandbox   = "sandbox"   // a node is about to start a pod sandbox
	KindContainer = "container" // a node is about to create a container in a sandbox it admitted
	KindAdmission = "admission" // the API server is admitting a pod or pod template
)

// Input is the document a policy bundle sees as `input`. Identity (tenant,
// tier) is never part of it: the bundle derives it from Namespace through
// data.bulkhead.tenants.
type Input struct {
	// Version is ContractVersion.
	Version string `json:"version"`
	// Kind is KindSandbox or KindAdmission.
	Kind string `json:"kind"`
	// Namespace is the pod's Kubernetes namespace, as set by the kubelet
	// (CRI annotation io.kubernetes.cri.sandbox-namespace) or the API server.
	Namespace string `json:"namespace"`
	// Pod describes the pod as written by its author.
	Pod Pod `json:"pod"`
	// Request is what the pod asks Bulkhead for, parsed from bulkhead.dev/ annotations.
	Request Request `json:"request"`
	// Usage is the tenant's current consumption (node-wide for sandboxes,
	// cluster-wide for admission), not counting this pod.
	Usage Usage `json:"usage"`
	// Node describes the node's GPUs; nil for admission.
	Node *Node `json:"node,omitempty"`
}

// Pod is the part of a pod spec that policy rules look at.
type Pod struct {
	Name        string            `json:"name"`
	UID         string            `json:"uid,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// RuntimeHandler is the CRI runtime handler (RuntimeClass handler); empty
	// when the pod names no RuntimeClass.
	RuntimeHandler string `json:"runtime_handler"`
	// HostNetwork, HostPID and HostIPC are the host namespaces the pod
	// shares. On a node they come from the OCI spec: a namespace the spec
	// does not list is the host's (a sandbox without a network namespace is
	// host network, whatever the pod spec said).
	HostNetwork bool `json:"host_network,omitempty"`
	HostPID     bool `json:"host_pid,omitempty"`
	HostIPC     bool `json:"host_ipc,omitempty"`
	// Volumes are every volume the pod declares, mounted or not, at
	// admission; on a node (kind container), the volumes the container
	// mounts, told from the kubelet's plugin directory their bind comes
	// from (a node sees mounts, not the pod spec).
	Volumes []Volume `json:"volumes,omitempty"`
	// Sysctls are the kernel parameters the pod sets.
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Containers are the pod's init, app and ephemeral containers at
	// admission; on a node, the container being created (kind container)
	// or, at sandbox create, the sandbox container when it asks the host
	// for anything.
	Containers []Container `json:"containers,omitempty"`
	// ResourceClaims are the pod's dynamic resource allocation claims
	// (spec.resourceClaims), admission only: devices a DRA driver would
	// give the pod outside the device plugins Bulkhead reads.
	ResourceClaims []ResourceClaim `json:"resource_claims,omitempty"`
}

// ResourceClaim is one entry of a pod's spec.resourceClaims.
type ResourceClaim struct {
	// Name is the entry's name, which containers refer to.
	Name string `json:"name"`
	// ClaimName names an existing ResourceClaim; TemplateName a
	// ResourceClaimTemplate the pod's own claim is made from. Kubernetes
	// requires exactly one; both empty is passed on for the policy to judge.
	ClaimName    string `json:"claim_name,omitempty"`
	TemplateName string `json:"template_name,omitempty"`
	// Read says that Requests were read from the claim or template; when
	// false, what the claim asks for is unknown.
	Read bool `json:"read,omitempty"`
	// Requests are the claim's device requests, one per alternative of a
	// firstAvailable request.
	Requests []DeviceRequest `json:"requests,omitempty"`
}

// DeviceRequest is one request of a ResourceClaim.
type DeviceRequest struct {
	// Name is the request's name ("gpu", or "gpu/a100" for a firstAvailable
	// alternative).
	Name string `json:"name"`
	// DeviceClass is the DeviceClass the request draws from ("gpu.nvidia.com").
	DeviceClass string `json:"device_class"`
	// AllocationMode is "ExactCount" or "All" (every matching device on
	// the node).
	AllocationMode string `json:"allocation_mode,omitempty"`
	// Count is the number of devices for ExactCount; 0 otherwise.
	Count int64 `json:"count,omitempty"`
	// Selectors are the request's CEL selector expressions, as written.
	// The policy reads the MIG profile a request on Bulkhead's own class
	// pins from them (bulkhead.gpu), so that such a claim is judged like
	// the bulkhead.dev/gpu-profile annotation.
	Selectors []string `json:"selectors,omitempty"`
}

// Volume is one volume a pod declares.
type Volume struct {
	Name string `json:"name"`
	// Type is the volume source's field name as Kubernetes spells it:
	// "hostPath", "emptyDir", "secret", "configMap", "persistentVolumeClaim", ...
	Type string `json:"type"`
	// HostPath is the cleaned host path of a hostPath volume; empty otherwise.
	HostPath string `json:"host_path,omitempty"`
	// MayBeClaim (node only) says that Type is the plugin that mounted the
	// volume and that a PersistentVolume may use it too: the node cannot
	// tell a persistentVolumeClaim's (or generic ephemeral) volume from an
	// inline source of that type.
	MayBeClaim bool `json:"may_be_claim,omitempty"`
}

// Mount is a host path bound into a container. A pod's own files (its
// volumes, service account token, /etc/hosts, resolv.conf, /dev/shm) are
// not host paths and never appear here.
type Mount struct {
	// HostPath is the host path that will be mounted, cleaned and with any
	// subPath resolved, as the kubelet would.
	HostPath string `json:"host_path"`
	// Path is where the container sees it.
	Path     string `json:"path,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Container is one container of a pod.
type Container struct {
	Name       string `json:"name"`
	Image      string `json:"image,omitempty"`
	Privileged bool   `json:"privileged,omitempty"`
	// Ephemeral marks an ephemeral (debug) container.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// Devices are host device paths the container asks for, cleaned.
	Devices []string `json:"devices,omitempty"`
	// Mounts are the host paths bound into the container.
	Mounts []Mount `json:"mounts,omitempty"`
	// AddedCapabilities are capabilities beyond the runtime's default set,
	// upper case without the CAP_ prefix ("SYS_ADMIN"). At admission they
	// are the pod spec's capabilities.add.
	AddedCapabilities []string `json:"added_capabilities,omitempty"`
	// HostPorts are the host ports the container binds (admission only: a
	// node's port mappings never reach the runtime).
	HostPorts []int32 `json:"host_ports,omitempty"`
	// SeccompProfile and AppArmorProfile are the profile types the pod
	// spec names for the container, as Kubernetes spells them
	// ("Unconfined", "RuntimeDefault", "Localhost"); empty when unset.
	SeccompProfile  string `json:"seccomp_profile,omitempty"`
	AppArmorProfile string `json:"apparmor_profile,omitempty"`
	// MemoryBytes is the container's memory limit; 0 when unset, which
	// quota.memory_limit_missing reads as unbounded. At admission a
	// container without its own limit gets the pod-level limit
	// (spec.resources), as the kubelet gives it; on a node it is the OCI
	// spec's linux.resources.memory.limit.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Env is the container's environment. Rules may look at names and
	// values; the decision log always masks the values.
	Env map[string]string `json:"env,omitempty"`
}

// Request is what the pod asks for beyond a plain sandbox.
type Request struct {
	// GPU is nil when the pod asks for no GPU.
	GPU *GPURequest `json:"gpu,omitempty"`
	// RDMA asks for RDMA devices (the tenant's own VF).
	RDMA bool `json:"rdma,omitempty"`
	// MemoryBytes is the pod's total memory limit; 0 when unset.
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
}

// GPURequest asks for GPU capacity.
type GPURequest struct {
	// Profile is a MIG profile name such as "1g.18gb", or "whole" for a full GPU.
	Profile string `json:"profile"`
	// Count is the number of slices (or whole GPUs); at least 1.
	Count int `json:"count"`
}

// Usage is a tenant's current consumption.
type Usage struct {
	Sandboxes   int   `json:"sandboxes"`
	GPUSlices   int   `json:"gpu_slices"`
	MemoryBytes int64 `json:"memory_bytes"`
}

// Node describes the node that will run the sandbox.
type Node struct {
	Name string    `json:"name,omitempty"`
	GPUs []NodeGPU `json:"gpus,omitempty"`
}

// NodeGPU is one physical GPU of the node.
type NodeGPU struct {
	Index      int    `json:"index"`
	Model      string `json:"model"`
	MIGEnabled bool   `json:"mig_enabled"`
	// FreeSlices is the number of free compute slices (0..7).
	FreeSlices int `json:"free_slices"`
	// Tenants are the tenants that already hold a slice of this GPU.
	Tenants []string `json:"tenants,omitempty"`
}

// Runtimes a decision may choose.
const (
	RuntimeGVisor = "gvisor"
	RuntimeRunc   = "runc"
)

// RDMA answers.
const (
	RDMADeny  = "deny"
	RDMAOwnVF = "own-vf"
)

// Enforcement modes of a reason.
const (
	EnforceDeny  = "deny"
	EnforceWarn  = "warn"
	EnforceAudit = "audit"
)

// Decision is data.bulkhead.decision, checked for shape by the engine.
type Decision struct {
	Allow bool `json:"allow"`
	// Reasons lists every rule that fired, deny or not, in the bundle's
	// order. The default bundle puts the decisive one first (deny before
	// warn before audit, then by rule family: input, tenant, identity,
	// runtime, workload, rdma, gpu, quota, network; reason_precedence in
	// rego/decision.rego); every reader shows them in this order.
	Reasons []Reason `json:"reasons"`
	Tenant  string   `json:"tenant"`
	Tier    string   `json:"tier"`
	// Runtime is RuntimeGVisor or RuntimeRunc.
	Runtime  string          `json:"runtime"`
	GPU      GPUDecision     `json:"gpu"`
	Network  NetworkDecision `json:"network"`
	RDMA     string          `json:"rdma"`
	Warnings []string        `json:"warnings,omitempty"`
	// ID and Revision are filled by the engine: the decision id written to the
	// decision log and the revision of the bundle that made it.
	ID       string `json:"decision_id,omitempty"`
	Revision string `json:"revision,omitempty"`
}

// Reason is one rule that fired.
type Reason struct {
	// Rule is a stable identifier such as "runtime.untrusted_requires_gvisor".
	Rule    string `json:"rule"`
	Message string `json:"message"`
	// Enforcement is EnforceDeny, EnforceWarn or EnforceAudit (default deny).
	Enforcement string `json:"enforcement,omitempty"`
}

// GPUDecision says what GPU capacity the pod may get.
type GPUDecision struct {
	// AllowedProfiles are the MIG profiles the tier may use; empty means none.
	AllowedProfiles []string `json:"allowed_profiles"`
	// MaxSlices caps the tenant's total compute slices on the node.
	MaxSlices int `json:"max_slices"`
	// WholeGPU allows whole, non-MIG GPUs.
	WholeGPU bool `json:"whole_gpu"`
	// ExclusivePhysicalGPU forbids sharing a physical GPU with other tenants.
	ExclusivePhysicalGPU bool `json:"exclusive_physical_gpu"`
	// MIGInSandbox says what to do when the sandbox cannot use a MIG slice
	// (gVisor's nvproxy exposes no /dev/nvidia-caps): "refuse" or "whole-gpu".
	MIGInSandbox string `json:"mig_in_sandbox,omitempty"`
}

// NetworkDecision configures the tenant fence for the pod.
type NetworkDecision struct {
	// Isolation is "tenant" (fence across tenants) or "none".
	Isolation string `json:"isolation"`
	// EgressCIDRs, when non-nil, are the only destinations outside the
	// cluster the pod may reach.
	EgressCIDRs  []string `json:"egress_cidrs"`
	DenyMetadata bool     `json:"deny_metadata"`
	// MetadataCIDRs are the cloud credential endpoints the fence blocks
	// when DenyMetadata is set: the tier's network.metadata_cidrs, by
	// default every one rego/network.rego lists. Nil from a bundle that
	// predates the list; the node then refuses to fence a pod that
	// denies metadata rather than guess the list.
	MetadataCIDRs []string `json:"metadata_cidrs,omitempty"`
}

// Decider makes policy decisions. Implementations fail closed: any error
// yields a Decision with Allow false and a reason naming the failure.
type Decider interface {
	Decide(ctx context.Context, in Input) (Decision, error)
}
