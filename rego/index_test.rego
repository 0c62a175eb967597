package bulkhead.index_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.identity
import data.bulkhead.index

test_owners_maps_every_namespace_to_its_tenants if {
	tenants := object.union(fx.tenants, {"thief": {"tier": "trusted", "namespaces": ["agents", "loot"]}})
	owners := index.owners with data.bulkhead.tenants as tenants
	owners == {"agents": ["agents", "thief"], "research": ["research"], "platform": ["platform"], "loot": ["thief"]}
}

test_tier_settings_merge_each_tier_over_lockdown if {
	tiers := {"minimal": {"runtimes": ["gvisor", "runc"], "gpu": {"whole_gpu": true}}, "broken": "gold"}
	settings := index.tier_settings with data.bulkhead.tiers as tiers
	object.keys(settings) == {"minimal"}
	settings.minimal.runtimes == ["gvisor", "runc"]
	settings.minimal.gpu.whole_gpu
	settings.minimal.gpu.max_slices == identity.lockdown.gpu.max_slices
	settings.minimal.rdma == "deny"
}
