# METADATA
# description: |
#   Lookups derived from data alone, so that a decision finds its tenant and
#   tier settings by key instead of walking data.bulkhead.tenants and merging
#   tiers on every call. Nothing here may read input: the Go engine evaluates
#   this package once per bundle load and serves the result as
#   data.bulkhead.index (policy/precompute.go); opa eval and opa test
#   evaluate the rules as written.
package bulkhead.index

import data.bulkhead.identity

# owners maps every namespace a tenant lists to the sorted names of the
# tenants that list it (more than one is a configuration error that
# bulkhead.identity reports).
owners[ns] := sort({name | some name, t in data.bulkhead.tenants; ns in t.namespaces}) if {
	some t in data.bulkhead.tenants
	some ns in t.namespaces
}

# tier_settings maps every tier to its settings merged over
# identity.lockdown, so that a sparse tier never opens anything.
tier_settings[name] := object.union(identity.lockdown, tier) if {
	some name, tier in data.bulkhead.tiers
	is_object(tier)
}
