# METADATA
# description: |
#   What the pod's containers may ask of the host: privileged mode, host
#   namespaces and device nodes are denied below the trusted tier.
package bulkhead.workload

import data.bulkhead.identity

settings := identity.settings

# Read by path with a default (not object.get on input.pod) so that the
# findings depend on the containers and host namespace flags, not on the
# pod's name: the engine keeps them for the next replica.
default containers := []

containers := input.pod.containers

findings contains {
	"rule": "workload.privileged",
	"message": sprintf("container %q is privileged; tier %q forbids privileged containers", [c.name, identity.tier_label]),
} if {
	not settings.allow_privileged
	some c in containers
	c.privileged == true
}

# host_namespaces are the host namespaces the pod asks for.
host_namespaces contains "host_network" if input.pod.host_network == true

host_namespaces contains "host_pid" if input.pod.host_pid == true

host_namespaces contains "host_ipc" if input.pod.host_ipc == true

findings contains {
	"rule": "workload.host_namespace",
	"message": sprintf("pod sets %s; tier %q forbids host namespaces", [field, identity.tier_label]),
} if {
	not settings.allow_host_namespaces
	some field in host_namespaces
}

# RDMA device nodes are judged by bulkhead.rdma.
rdma_device(path) if startswith(path, "/dev/infiniband/")

device_allowed(path) if {
	some pattern in settings.allowed_devices
	glob.match(pattern, ["/"], path)
}

findings contains {
	"rule": "workload.device_forbidden",
	"message": sprintf("container %q asks for host device %s; tier %q allows %v", [c.name, path, identity.tier_label, settings.allowed_devices]),
} if {
	some c in containers
	some path in object.get(c, "devices", [])
	not rdma_device(path)
	not device_allowed(path)
}

findings contains {
	"rule": "workload.image_unpinned",
	"message": sprintf("container %q uses image %q without a digest; tier %q expects images pinned by @sha256", [c.name, object.get(c, "image", ""), identity.tier_label]),
	"enforcement": "warn",
} if {
	settings.require_pinned_images
	some c in containers
	not contains(object.get(c, "image", ""), "@sha256:")
}
