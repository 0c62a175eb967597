# METADATA
# description: |
#   RDMA bypasses every eBPF hook, so it is isolated by device access: a pod
#   gets RDMA devices only as its tenant's own VF, and only in tiers that allow it.
package bulkhead.rdma

import data.bulkhead.identity
import data.bulkhead.workload

requested if input.request.rdma == true

decision := "own-vf" if {
	requested
	identity.settings.rdma == "own-vf"
} else := "deny"

findings contains {
	"rule": "rdma.forbidden",
	"message": sprintf("tier %q may not use RDMA", [identity.tier_label]),
} if {
	requested
	identity.settings.rdma != "own-vf"
}

# A raw RDMA device (workload.rdma_device: /dev/infiniband or under it) is
# refused in every tier, whether asked for as a device or bound in as a host
# path: RDMA bypasses the fence, so it comes only as the tenant's own VF.
findings contains {
	"rule": "rdma.device_forbidden",
	"message": sprintf("%s asks for %s directly; RDMA devices come only through bulkhead.dev/rdma as the tenant's own VF", [workload.label(c), path]),
} if {
	some c in workload.containers
	some path in object.get(c, "devices", [])
	workload.rdma_device(path)
}

findings contains {
	"rule": "rdma.device_forbidden",
	"message": sprintf("%s mounts host path %s; RDMA devices come only through bulkhead.dev/rdma as the tenant's own VF", [workload.label(c), m.host_path]),
} if {
	some c in workload.containers
	some m in object.get(c, "mounts", [])
	workload.rdma_device(m.host_path)
}
