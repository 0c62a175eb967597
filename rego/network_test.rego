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
	d == {
		"isolation": "tenant", "egress_cidrs": ["10.96.0.0/12"], "deny_metadata": true,
		"metadata_cidrs": network.default_metadata_cidrs,
	}
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

# Issue 24: the credential endpoints are a tier setting with a safe default.
test_default_metadata_cidrs_cover_the_clouds if {
	d := decision(fx.agent, fx.tenants)
	every a in [
		"169.254.169.254", "169.254.170.2", "169.254.170.23", "100.100.100.200",
		"168.63.129.16", "fd00:ec2::254", "fd00:ec2::23",
	] {
		some c in d.metadata_cidrs
		net.cidr_contains(c, a)
	}
}

test_tier_lists_its_own_metadata_cidrs if {
	tiers := json.patch(data.bulkhead.tiers, [{"op": "add", "path": "/untrusted/network/metadata_cidrs", "value": ["169.254.169.254/32", "192.0.2.80/32"]}])
	d := network.decision with input as fx.agent with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers as tiers
	d.metadata_cidrs == ["169.254.169.254/32", "192.0.2.80/32"]
	r := {f.rule | some f in network.findings} with input as fx.agent with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers as tiers
	r == set()
}

test_bad_metadata_cidrs_refused if {
	every value in [["169.254.169.254"], [7], "169.254.169.254/32", []] {
		tiers := json.patch(data.bulkhead.tiers, [{"op": "add", "path": "/untrusted/network/metadata_cidrs", "value": value}])
		r := {f.rule | some f in network.findings} with input as fx.agent with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers as tiers
		r == {"network.metadata_cidr_invalid"}
	}
}

# Every listed endpoint counts: an allow-list that covers only the ECS task
# credentials address (not 169.254.169.254) is audited too, once per endpoint.
test_metadata_allowlisted_considers_every_endpoint if {
	tenants := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/egress_cidrs", "value": ["169.254.170.0/24", "100.100.100.0/24", "fd00:ec2::/64"]}])
	fs := {f | some f in network.findings; f.rule == "network.metadata_allowlisted"} with input as fx.agent with data.bulkhead.tenants as tenants
	count(fs) == 5
	every f in fs {
		f.enforcement == "audit"
	}
}
