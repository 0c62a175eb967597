# METADATA
# description: |
#   The tenant fence: isolation across tenants, the egress allow-list and the
#   cloud credential endpoints.
package bulkhead.network

import data.bulkhead.identity

settings := identity.settings.network

# default_metadata_cidrs are the credential endpoints a tier that denies
# metadata blocks unless it lists its own (network.metadata_cidrs). Each
# hands a workload its cloud identity's credentials when asked over plain
# HTTP from inside the instance:
default_metadata_cidrs := [
	# Instance metadata (IMDS) of AWS, GCP, Azure, OCI, OpenStack and
	# others: instance-role and service-account credentials.
	"169.254.169.254/32",
	# AWS ECS task credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI).
	"169.254.170.2/32",
	# AWS EKS Pod Identity agent, IPv4.
	"169.254.170.23/32",
	# Alibaba Cloud ECS metadata: RAM role STS credentials.
	"100.100.100.200/32",
	# Azure WireServer: the VM agent's goal state, extension settings and
	# certificates (the channel of AKS TLS bootstrap token theft). Azure
	# Load Balancer health probes come from it too: a tier whose pods sit
	# behind an Azure LB on Azure CNI lists its own endpoints without it.
	"168.63.129.16/32",
	# AWS IMDS over IPv6 (Nitro).
	"fd00:ec2::254/128",
	# AWS EKS Pod Identity agent, IPv6.
	"fd00:ec2::23/128",
]

# metadata_cidrs is what the fence blocks for a pod whose tier denies
# metadata: the tier's list, or the default one.
metadata_cidrs := object.get(settings, "metadata_cidrs", default_metadata_cidrs)

# egress_cidrs is null when the tier allows any destination, otherwise the
# tenant's allow-list (none when the tenant lists none).
egress_cidrs := null if settings.egress == "any"

egress_cidrs := object.get(identity.config, "egress_cidrs", []) if settings.egress == "allowlist"

egress_cidrs := [] if {
	settings.egress == "allowlist"
	not identity.config
}

decision := {
	"isolation": settings.isolation,
	"egress_cidrs": egress_cidrs,
	"deny_metadata": settings.deny_metadata,
	"metadata_cidrs": metadata_cidrs,
}

findings contains {
	"rule": "network.egress_invalid",
	"message": sprintf("tier %q sets network.egress %v; want \"any\" or \"allowlist\"", [identity.tier_label, settings.egress]),
} if {
	not settings.egress in {"any", "allowlist"}
}

findings contains {
	"rule": "network.egress_cidr_invalid",
	"message": sprintf("tenant %q lists egress CIDR %v, which is not a CIDR", [identity.tenant_label, cidr]),
} if {
	some cidr in egress_cidrs
	not valid_cidr(cidr)
}

valid_cidr(cidr) if {
	is_string(cidr)
	net.cidr_is_valid(cidr)
}

findings contains {
	"rule": "network.metadata_cidr_invalid",
	"message": sprintf("tier %q lists metadata CIDR %v, which is not a CIDR", [identity.tier_label, cidr]),
} if {
	is_array(metadata_cidrs)
	some cidr in metadata_cidrs
	not valid_cidr(cidr)
}

findings contains {
	"rule": "network.metadata_cidr_invalid",
	"message": sprintf("tier %q sets network.metadata_cidrs %v; want an array of CIDRs", [identity.tier_label, metadata_cidrs]),
} if {
	not is_array(metadata_cidrs)
}

findings contains {
	"rule": "network.metadata_cidr_invalid",
	"message": sprintf("tier %q denies metadata but lists no metadata CIDR: nothing would be blocked", [identity.tier_label]),
} if {
	settings.deny_metadata
	metadata_cidrs == []
}

# Every listed credential endpoint that an allow-listed CIDR overlaps.
findings contains {
	"rule": "network.metadata_allowlisted",
	"message": sprintf("egress CIDR %s of tenant %q covers the credential endpoint %s, which stays blocked", [cidr, identity.tenant_label, endpoint]),
	"enforcement": "audit",
} if {
	settings.deny_metadata
	is_array(metadata_cidrs)
	some cidr in egress_cidrs
	valid_cidr(cidr)
	some endpoint in metadata_cidrs
	valid_cidr(endpoint)
	net.cidr_intersects(cidr, endpoint)
}
