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

# quota is undefined for kind container, so that no quota rule fires.
quota := identity.config.quota if not contract.per_container

# usage is the tenant's consumption; a missing field counts as zero.
usage := object.union({"sandboxes": 0, "gpu_slices": 0, "memory_bytes": 0}, reported_usage)

default reported_usage := {}

reported_usage := input.usage

# memory_pattern is what units.parse_bytes accepts for a Kubernetes quantity.
memory_pattern := `^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[kmgtpe])?$`

memory_limit := units.parse_bytes(quota.memory) if regex.match(memory_pattern, quota.memory)

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

# Without a memory limit a pod escapes the tenant's memory quota. Warn by
# default; a security team can make it deny through data.bulkhead.enforcement.
findings contains {
	"rule": "quota.memory_limit_missing",
	"message": sprintf("tenant %q has a memory quota of %s but the pod sets no memory limit", [identity.tenant, quota.memory]),
	"enforcement": "warn",
} if {
	memory_limit
	requested_memory == 0
}

findings contains {
	"rule": "quota.invalid",
	"message": sprintf("tenant %q: quota.memory %v is not a quantity like \"64Gi\"", [identity.tenant, quota.memory]),
} if {
	not regex.match(memory_pattern, quota.memory)
}
