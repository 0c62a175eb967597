# METADATA
# description: |
#   Tenant and trust tier come from the pod's namespace through
#   data.bulkhead.tenants, never from anything the pod author writes.
package bulkhead.identity

import data.bulkhead.index

# lockdown is what a pod gets when a tier leaves a setting out: the most
# restrictive answer for every field, so a sparse tier never opens anything.
lockdown := {
	"runtimes": ["gvisor"],
	"require_handler": true,
	"allow_privileged": false,
	"allow_host_namespaces": false,
	"allowed_devices": [],
	"allowed_host_paths": [],
	"host_paths_writable": false,
	# Kubernetes Pod Security "baseline": the capabilities a pod may add there.
	"allowed_capabilities": [
		"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
		"NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
	],
	"allow_host_ports": false,
	# Kubernetes' safe sysctls (namespaced, isolated from the host and other pods).
	"allowed_sysctls": [
		"kernel.shm_rmid_forced",
		"net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
		"net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
		"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
		"net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
	],
	"allow_unconfined": false,
	"require_pinned_images": true,
	# DRA device classes (globs, "." as separator) a claim may draw from.
	"allowed_device_classes": [],
	"gpu": {
		"max_profile_slices": 0,
		"whole_gpu": false,
		"max_slices": 0,
		"exclusive_physical_gpu": true,
		"mig_in_sandbox": "refuse",
		# GPUs through DRA claims bypass MIG placement and the slice quota.
		"allow_dra": false,
	},
	"rdma": "deny",
	"network": {"isolation": "tenant", "egress": "allowlist", "deny_metadata": true},
}

# tenants_of_namespace holds, sorted, every tenant that lists input.namespace.
default tenants_of_namespace := []

tenants_of_namespace := index.owners[input.namespace]

# tenant is defined only when exactly one tenant owns the namespace.
tenant := name if {
	count(tenants_of_namespace) == 1
	some name in tenants_of_namespace
}

# config is the tenant's entry in data.bulkhead.tenants.
config := data.bulkhead.tenants[tenant]

tier_name := config.tier

# tier is defined only when the tenant's tier exists in data.bulkhead.tiers.
tier := data.bulkhead.tiers[tier_name]

# settings is the tier merged over lockdown; lockdown alone without a tier.
settings := index.tier_settings[tier_name] if tier

settings := lockdown if not tier

default tenant_label := ""

tenant_label := tenant

default tier_label := ""

tier_label := tier_name if tier

findings contains {
	"rule": "tenant.unknown_namespace",
	"message": sprintf("namespace %q belongs to no tenant in data.bulkhead.tenants", [input.namespace]),
} if {
	count(tenants_of_namespace) == 0
}

findings contains {
	"rule": "tenant.ambiguous_namespace",
	"message": sprintf("namespace %q is listed by several tenants %v; it must belong to exactly one", [input.namespace, sort(tenants_of_namespace)]),
} if {
	count(tenants_of_namespace) > 1
}

findings contains {
	"rule": "tenant.unknown_tier",
	"message": sprintf("tenant %q has tier %q, which is not in data.bulkhead.tiers", [tenant, object.get(config, "tier", "")]),
} if {
	tenant
	not tier
}

# A pod may repeat its identity in annotations (some tools do), but it may
# never claim another one.
identity_annotations := {"bulkhead.dev/tenant": "tenant", "bulkhead.dev/tier": "tier"}

actual_identity := {"tenant": tenant_label, "tier": tier_label}

findings contains {
	"rule": "identity.annotation_mismatch",
	"message": sprintf("annotation %s=%q contradicts namespace %q, which belongs to %s %q", [key, claimed, input.namespace, what, actual_identity[what]]),
} if {
	some key, claimed in input.pod.annotations
	what := identity_annotations[key]
	claimed != actual_identity[what]
}
