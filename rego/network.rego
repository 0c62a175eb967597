# METADATA
# description: |
#   The tenant fence: isolation across tenants, the egress allow-list and the
#   cloud metadata address.
package bulkhead.network

import data.bulkhead.identity

settings := identity.settings.network

metadata_address := "169.254.169.254"

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
	"rule": "network.metadata_allowlisted",
	"message": sprintf("egress CIDR %s of tenant %q covers the metadata address %s, which stays blocked", [cidr, identity.tenant_label, metadata_address]),
	"enforcement": "audit",
} if {
	settings.deny_metadata
	some cidr in egress_cidrs
	valid_cidr(cidr)
	net.cidr_contains(cidr, metadata_address)
}
