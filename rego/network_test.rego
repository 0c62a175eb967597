package bulkhead.network_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.network

decision(doc, tenants) := d if {
	d := network.decision with input as doc with data.bulkhead.tenants as tenants
}

rules(doc, tenants) := r if {
	r := {f.rule | some f in network.findings} with input as doc with data.bulkhead.tenants as tenants
}

test_untrusted_egress_is_the_allowlist if {
	d := decision(fx.agent, fx.tenants)
	d == {"isolation": "tenant", "egress_cidrs": ["10.96.0.0/12"], "deny_metadata": true}
	rules(fx.agent, fx.tenants) == set()
}

test_untrusted_without_allowlist_gets_no_egress if {
	tenants := {"agents": {"tier": "untrusted", "namespaces": ["agents"]}}
	decision(fx.agent, tenants).egress_cidrs == []
}

test_unknown_tenant_gets_no_egress if {
	decision(fx.pod("nobody", "bulkhead"), fx.tenants).egress_cidrs == []
}

test_standard_and_trusted_egress_any if {
	d := decision(fx.research, fx.tenants)
	d.egress_cidrs == null
	d.deny_metadata
	decision(fx.platform, fx.tenants).deny_metadata == false
}

test_invalid_cidr_refused if {
	tenants := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/egress_cidrs", "value": ["10.0.0.0/33", 7]}])
	rules(fx.agent, tenants) == {"network.egress_cidr_invalid"}
}

test_metadata_in_allowlist_is_audited if {
	tenants := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/egress_cidrs", "value": ["0.0.0.0/0"]}])
	rules(fx.agent, tenants) == {"network.metadata_allowlisted"}
	some f in network.findings with input as fx.agent with data.bulkhead.tenants as tenants
	f.enforcement == "audit"
}

test_bad_egress_mode_refused if {
	tiers := {"odd": {"network": {"egress": "some"}}}
	tenants := {"odd": {"tier": "odd", "namespaces": ["odd"]}}
	r := {f.rule | some f in network.findings} with input as fx.pod("odd", "bulkhead")
		with data.bulkhead.tenants as tenants
		with data.bulkhead.tiers as tiers
	r == {"network.egress_invalid"}
}
