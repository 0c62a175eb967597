# METADATA
# description: |
#   Tenant quotas from data.bulkhead.tenants[t].quota: a pod is refused when
#   the tenant's usage plus this pod would exceed a limit. A pod is charged
#   once, when its sandbox is created (or admitted): a container created in a
#   sandbox already admitted (kind container) charges nothing.
package bulkhead.quota

import data.bulkhead.contract
import data.bulkhead.gpu
import data.bulkhead.identity
import data.bulkhead.workload

# quota is undefined for kind container, so that no charging rule fires.
quota := tenant_quota if not contract.per_container

# tenant_quota is the tenant's quota whatever the kind: a container created
# in an admitted sandbox charges nothing, but whether it has a memory limit
# is judged on every create (memory_limit_missing below).
tenant_quota := identity.config.quota

# usage is the tenant's consumption; a missing field counts as zero.
usage := object.union({"sandboxes": 0, "gpu_slices": 0, "memory_bytes": 0}, reported_usage)

default reported_usage := {}

reported_usage := input.usage

# memory_pattern is what units.parse_bytes accepts for a Kubernetes quantity.
memory_pattern := `^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[kmgtpe])?$`

memory_limit := units.parse_bytes(quota.memory) if regex.match(memory_pattern, quota.memory)

# memory_quota is the tenant's memory quota in bytes, for every kind.
memory_quota := units.parse_bytes(tenant_quota.memory) if regex.match(memory_pattern, tenant_quota.memory)

default requested_memory := 0

requested_memory := input.request.memory_bytes

findings contains {
	"rule": "quota.sandboxes",
	"message": sprintf("tenant %q runs %d sandboxes; one more exceeds its quota of %d", [identity.tenant, usage.sandboxes, quota.sandboxes]),
} if {
	usage.sandboxes + 1 > quota.sandboxes
}

findings contains {
	"rule": "quota.gpu_slices",
	"message": sprintf("tenant %q holds %d GPU compute slices; %d more exceed its quota of %d", [identity.tenant, usage.gpu_slices, gpu.requested_slices, quota.gpu_slices]),
} if {
	gpu.requested_slices > 0
	usage.gpu_slices + gpu.requested_slices > quota.gpu_slices
}

findings contains {
	"rule": "quota.memory",
	"message": sprintf("tenant %q uses %d bytes of memory; %d more exceed its quota of %s (%d bytes)", [identity.tenant, usage.memory_bytes, requested_memory, quota.memory, memory_limit]),
} if {
	usage.memory_bytes + requested_memory > memory_limit
}

# Without a memory limit a container escapes the tenant's memory quota: the
# pod is charged the sum of its containers' limits (the kubelet's and
# containerd's io.kubernetes.cri.sandbox-memory too), where a container
# without one counts 0, and the kubelet then leaves the pod's cgroup
# unbounded. So a limit is missing when ANY container lacks one, not only
# when the sum is 0: a 1Mi container beside an unlimited sidecar is charged
# 1Mi. Warn by default; a security team can make it deny through
# data.bulkhead.enforcement, and then the node refuses the unlimited
# container's create as the webhook refuses the pod.

default containers := []

containers := input.pod.containers

# limited(c): container c sets a memory limit (a positive number of bytes;
# absent or 0 is none, as for the kubelet).
limited(c) if {
	is_number(c.memory_bytes)
	c.memory_bytes > 0
}

# unlimited holds the label of every container of the pod without a memory
# limit: at admission its init, app and ephemeral containers (an ephemeral
# container can never set one: the API server refuses resources on it, and
# a node cannot tell it from any other container); on a node, the container
# being created. At sandbox create a node lists only the sandbox (pause)
# container, which is not the pod's: there the pod's total speaks.
unlimited contains workload.label(c) if {
	contract.kind in {"admission", "container"}
	some c in containers
	not limited(c)
}

findings contains {
	"rule": "quota.memory_limit_missing",
	"message": sprintf("tenant %q has a memory quota of %s but %s sets no memory limit", [identity.tenant, tenant_quota.memory, who]),
	"enforcement": "warn",
} if {
	memory_quota
	some who in unlimited
}

findings contains {
	"rule": "quota.memory_limit_missing",
	"message": sprintf("tenant %q has a memory quota of %s but the pod sets no memory limit", [identity.tenant, quota.memory]),
	"enforcement": "warn",
} if {
	memory_limit
	requested_memory == 0
	count(unlimited) == 0
}

findings contains {
	"rule": "quota.invalid",
	"message": sprintf("tenant %q: quota.memory %v is not a quantity like \"64Gi\"", [identity.tenant, quota.memory]),
} if {
	not regex.match(memory_pattern, quota.memory)
}
