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

findings contains {
	"rule": "rdma.device_forbidden",
	"message": sprintf("container %q asks for %s directly; RDMA devices come only through bulkhead.dev/rdma as the tenant's own VF", [c.name, path]),
} if {
	some c in workload.containers
	some path in object.get(c, "devices", [])
	startswith(path, "/dev/infiniband/")
}
