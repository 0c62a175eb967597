# METADATA
# description: |
#   What the pod's containers may ask of the host: privileged mode, host
#   namespaces, device nodes, host paths, added capabilities, host ports,
#   sysctls, unconfined seccomp/AppArmor profiles and volume types (Pod
#   Security "restricted"'s below trusted), each limited by the
#   tier's settings (docs/security.md). Init, app and ephemeral containers
#   are judged alike. Paths are judged as written: Go cleans them, but a path
#   that is not clean and absolute is refused in every tier rather than
#   compared with a prefix it might escape.
package bulkhead.workload

import data.bulkhead.identity

settings := identity.settings

# Read by path with a default (not object.get on input.pod) so that the
# findings depend on the containers, volumes, sysctls and host namespace
# flags, not on the pod's name: the engine keeps them for the next replica.
default containers := []

containers := input.pod.containers

default volumes := []

volumes := input.pod.volumes

default sysctls := {}

sysctls := input.pod.sysctls

# label(c) names container c in messages.
label(c) := sprintf("ephemeral container %q", [object.get(c, "name", "")]) if {
	c.ephemeral == true
} else := sprintf("container %q", [object.get(c, "name", "")])

# clean_path(p) holds when p is absolute and clean as Go's path.Clean leaves
# it: "/", or segments each led by "/" that are neither empty, "." nor "..".
clean_path(p) if {
	is_string(p)
	regex.match(`^(/|(/([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+))+)$`, p)
}

# within(path, prefix): path is prefix or lies under it.
within(_, prefix) if prefix == "/"

within(path, prefix) if path == prefix

within(path, prefix) if startswith(path, concat("", [prefix, "/"]))

findings contains {
	"rule": "workload.privileged",
	"message": sprintf("%s is privileged; tier %q forbids privileged containers", [label(c), identity.tier_label]),
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

# Devices.

# RDMA device nodes (/dev/infiniband and everything under it) are judged by
# bulkhead.rdma, in every tier.
rdma_device(path) if {
	is_string(path)
	within(path, "/dev/infiniband")
}

# A pattern "P/**" also matches P itself: "/dev/**" allows "/dev".
device_matches(pattern, path) if glob.match(pattern, ["/"], path)

device_matches(pattern, path) if path == trim_suffix(pattern, "/**")

device_allowed(path) if {
	some pattern in settings.allowed_devices
	device_matches(pattern, path)
}

findings contains {
	"rule": "workload.device_forbidden",
	"message": sprintf("%s asks for host device %s; tier %q allows %v", [label(c), path, identity.tier_label, settings.allowed_devices]),
} if {
	some c in containers
	some path in object.get(c, "devices", [])
	clean_path(path)
	not rdma_device(path)
	not device_allowed(path)
}

findings contains {
	"rule": "workload.device_forbidden",
	"message": sprintf("%s asks for host device %q, which is not a clean absolute path; no tier allows one", [label(c), path]),
} if {
	some c in containers
	some path in object.get(c, "devices", [])
	not clean_path(path)
}

# CDI requests. containerd injects the CDI devices named in an annotation
# "cdi.k8s.io/<name>" (value: comma-separated "vendor/class=device" names)
# into the container's spec. A CDI name says nothing about which host device
# nodes, mounts or environment it brings, so only a tier that allows every
# device ("/dev/**") may ask for one by annotation. The node judges the
# device nodes injected either way (workload.device_forbidden); this refuses
# the request where the pod author wrote it. Bulkhead hands out GPUs itself
# (bulkhead.dev/gpu-profile) and DRA claims are bulkhead.dra's to judge.
cdi_annotation_prefix := "cdi.k8s.io/"

default annotations := {}

annotations := input.pod.annotations

findings contains {
	"rule": "workload.cdi_device",
	"message": sprintf("pod annotation %q asks containerd for CDI devices %q; tier %q allows devices %v, and a CDI request needs \"/dev/**\"", [key, value, identity.tier_label, settings.allowed_devices]),
} if {
	some key, value in annotations
	startswith(key, cdi_annotation_prefix)
	not device_allowed("/dev/**")
}

# Host paths: every container mount's host path and every hostPath volume,
# mounted or not.

# host_mounts are the host paths bound into the containers.
host_mounts contains {
	"who": label(c),
	"path": object.get(m, "host_path", ""),
	"read_only": object.get(m, "read_only", false) == true,
} if {
	some c in containers
	some m in object.get(c, "mounts", [])
}

# host_volumes are the pod's hostPath volumes (and any volume that names a
# host path).
host_volumes contains {"name": object.get(v, "name", ""), "path": object.get(v, "host_path", "")} if {
	some v in volumes
	v.type == "hostPath"
}

host_volumes contains {"name": object.get(v, "name", ""), "path": v.host_path} if {
	some v in volumes
	v.host_path
}

host_path_allowed(path) if {
	clean_path(path)
	some prefix in settings.allowed_host_paths
	within(path, prefix)
}

host_paths_writable if settings.host_paths_writable == true

# host_path_access says in messages how the tier lets a host path be mounted.
host_path_access := "" if {
	host_paths_writable
} else := ", read-only"

# host_path_allowance says in messages what the tier allows.
host_path_allowance := "allows no host paths" if {
	count(settings.allowed_host_paths) == 0
} else := sprintf("allows any clean absolute host path%s", [host_path_access]) if {
	"/" in settings.allowed_host_paths
} else := sprintf("allows only host paths equal to or under one of %v%s", [settings.allowed_host_paths, host_path_access])

unclean_note(path) := "" if {
	clean_path(path)
} else := ", which is not a clean absolute path"

access_mode(m) := "read-only" if {
	m.read_only
} else := "read-write"

findings contains {
	"rule": "workload.host_path",
	"message": sprintf("%s mounts host path %q (%s)%s; tier %q %s", [m.who, m.path, access_mode(m), unclean_note(m.path), identity.tier_label, host_path_allowance]),
} if {
	some m in host_mounts
	not host_path_allowed(m.path)
}

findings contains {
	"rule": "workload.host_path",
	"message": sprintf("%s mounts host path %q read-write; tier %q %s", [m.who, m.path, identity.tier_label, host_path_allowance]),
} if {
	not host_paths_writable
	some m in host_mounts
	host_path_allowed(m.path)
	not m.read_only
}

findings contains {
	"rule": "workload.host_path",
	"message": sprintf("volume %q is host path %q%s; tier %q %s", [v.name, v.path, unclean_note(v.path), identity.tier_label, host_path_allowance]),
} if {
	some v in host_volumes
	not host_path_allowed(v.path)
}

# Volume types, named as the pod spec's volume source field ("nfs",
# "iscsi", "flexVolume", ...). Below trusted a pod may declare only those
# of Kubernetes Pod Security "restricted", unless its tier lists more
# (allowed_volume_types; "*" allows any): the others have the kubelet
# attach and mount on the host, with the host's kernel and the node's
# credentials, storage the pod's author names (an iSCSI target, an NFS
# export, a FlexVolume driver's arguments), and the node counts their
# mounts as the pod's own files. hostPath volumes are workload.host_path's.
restricted_volume_types := [
	"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
	"persistentVolumeClaim", "projected", "secret",
]

# A tier that leaves the key out gets "restricted"'s list.
allowed_volume_types := object.get(settings, "allowed_volume_types", restricted_volume_types)

volume_type_allowed(_) if "*" in allowed_volume_types

volume_type_allowed(v) if v.type in allowed_volume_types

# A node sees a volume only as a bind from the kubelet's directory of the
# plugin that mounted it, and a PersistentVolume's plugin (csi, nfs, iscsi,
# fc, local, flexVolume) mounts a claim's volume where it mounts an inline
# source of its type (may_be_claim): where the tier allows claims, only the
# webhook, which sees the pod spec, can refuse the inline source.
volume_type_allowed(v) if {
	v.may_be_claim == true
	some claim in ["persistentVolumeClaim", "ephemeral"]
	claim in allowed_volume_types
}

findings contains {
	"rule": "workload.volume_type",
	"message": sprintf("volume %q is of type %v; tier %q allows only volume types %v", [object.get(v, "name", ""), object.get(v, "type", ""), identity.tier_label, allowed_volume_types]),
} if {
	some v in volumes
	object.get(v, "type", "") != "hostPath"
	not volume_type_allowed(v)
}

# Capabilities, upper case without "CAP_" on both sides; "ALL" allowed by the
# tier allows any, and "ALL" added is allowed only there.
capability_name(cap) := trim_prefix(upper(cap), "CAP_") if {
	is_string(cap)
} else := sprintf("%v", [cap])

tier_capabilities := {capability_name(cap) | some cap in settings.allowed_capabilities}

capability_allowed(_) if "ALL" in tier_capabilities

capability_allowed(name) if name in tier_capabilities

findings contains {
	"rule": "workload.capability",
	"message": sprintf("%s adds capability %s; tier %q allows adding only %v", [label(c), capability_name(cap), identity.tier_label, settings.allowed_capabilities]),
} if {
	some c in containers
	some cap in object.get(c, "added_capabilities", [])
	not capability_allowed(capability_name(cap))
}

findings contains {
	"rule": "workload.host_port",
	"message": sprintf("%s binds host port %v; tier %q forbids host ports", [label(c), port, identity.tier_label]),
} if {
	not settings.allow_host_ports == true
	some c in containers
	some port in object.get(c, "host_ports", [])
}

# Sysctls: "*" allowed by the tier allows any.
sysctl_allowed(_) if "*" in settings.allowed_sysctls

sysctl_allowed(name) if name in settings.allowed_sysctls

findings contains {
	"rule": "workload.sysctl",
	"message": sprintf("pod sets sysctl %s=%q; tier %q allows only %v", [name, value, identity.tier_label, settings.allowed_sysctls]),
} if {
	some name, value in sysctls
	not sysctl_allowed(name)
}

# profile_fields name the container's profile fields in messages.
profile_fields := {"seccomp_profile": "seccomp", "apparmor_profile": "AppArmor"}

unconfined(profile) if {
	is_string(profile)
	lower(profile) == "unconfined"
}

findings contains {
	"rule": "workload.unconfined",
	"message": sprintf("%s runs with %s profile %s; tier %q forbids Unconfined profiles", [label(c), what, c[field], identity.tier_label]),
} if {
	not settings.allow_unconfined == true
	some c in containers
	some field, what in profile_fields
	unconfined(c[field])
}

findings contains {
	"rule": "workload.image_unpinned",
	"message": sprintf("%s uses image %q without a digest; tier %q expects images pinned by @sha256", [label(c), object.get(c, "image", ""), identity.tier_label]),
	"enforcement": "warn",
} if {
	settings.require_pinned_images
	some c in containers
	not contains(object.get(c, "image", ""), "@sha256:")
}
