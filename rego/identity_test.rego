package bulkhead.identity_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.identity

test_tenant_from_namespace if {
	identity.tenant == "research" with input as fx.research with data.bulkhead.tenants as fx.tenants
	identity.tier_label == "standard" with input as fx.research with data.bulkhead.tenants as fx.tenants
}

test_unknown_namespace if {
	findings := identity.findings with input as fx.pod("nobody", "bulkhead") with data.bulkhead.tenants as fx.tenants
	{f.rule | some f in findings} == {"tenant.unknown_namespace"}
	identity.settings == identity.lockdown with input as fx.pod("nobody", "bulkhead") with data.bulkhead.tenants as fx.tenants
}

test_namespace_claimed_twice_is_ambiguous if {
	tenants := object.union(fx.tenants, {"thief": {"tier": "trusted", "namespaces": ["agents"]}})
	findings := identity.findings with input as fx.agent with data.bulkhead.tenants as tenants
	{f.rule | some f in findings} == {"tenant.ambiguous_namespace"}
	not identity.tenant with input as fx.agent with data.bulkhead.tenants as tenants
}

test_unknown_tier if {
	tenants := {"agents": {"tier": "gold", "namespaces": ["agents"]}}
	findings := identity.findings with input as fx.agent with data.bulkhead.tenants as tenants
	{f.rule | some f in findings} == {"tenant.unknown_tier"}
	identity.tier_label == "" with input as fx.agent with data.bulkhead.tenants as tenants
}

test_sparse_tier_falls_back_to_lockdown if {
	tiers := {"minimal": {"runtimes": ["gvisor", "runc"]}}
	tenants := {"agents": {"tier": "minimal", "namespaces": ["agents"]}}
	s := identity.settings with input as fx.agent with data.bulkhead.tenants as tenants with data.bulkhead.tiers as tiers
	s.runtimes == ["gvisor", "runc"]
	s.rdma == "deny"
	s.gpu.max_profile_slices == 0
	s.allowed_host_paths == []
	s.host_paths_writable == false
	s.allow_host_ports == false
	s.allow_unconfined == false
	s.allowed_capabilities == identity.lockdown.allowed_capabilities
	s.allowed_sysctls == identity.lockdown.allowed_sysctls
}

# The shipped untrusted and standard tiers are exactly as strict as lockdown
# on host access; trusted opens it.
test_default_tiers_host_access if {
	fields := ["allowed_host_paths", "host_paths_writable", "allowed_capabilities", "allow_host_ports", "allowed_sysctls", "allow_unconfined"]
	every tier in ["untrusted", "standard"] {
		every field in fields {
			data.bulkhead.tiers[tier][field] == identity.lockdown[field]
		}
	}
	t := data.bulkhead.tiers.trusted
	t.allowed_host_paths == ["/"]
	t.host_paths_writable == true
	t.allowed_capabilities == ["ALL"]
	t.allow_host_ports == true
	t.allowed_sysctls == ["*"]
	t.allow_unconfined == true
}

test_annotation_claiming_other_tenant_refused if {
	doc := object.union(fx.agent, {"pod": {"annotations": {"bulkhead.dev/tenant": "platform"}}})
	findings := identity.findings with input as doc with data.bulkhead.tenants as fx.tenants
	{f.rule | some f in findings} == {"identity.annotation_mismatch"}
}

test_annotation_claiming_other_tier_refused if {
	doc := object.union(fx.agent, {"pod": {"annotations": {"bulkhead.dev/tier": "trusted"}}})
	findings := identity.findings with input as doc with data.bulkhead.tenants as fx.tenants
	{f.rule | some f in findings} == {"identity.annotation_mismatch"}
}

test_annotation_repeating_identity_allowed if {
	doc := object.union(fx.agent, {"pod": {"annotations": {"bulkhead.dev/tenant": "agents", "bulkhead.dev/tier": "untrusted"}}})
	count(identity.findings) == 0 with input as doc with data.bulkhead.tenants as fx.tenants
}
