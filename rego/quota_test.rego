package bulkhead.quota_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.quota

rules(doc) := r if {
	r := {f.rule | some f in quota.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

messages(doc) := m if {
	m := {f.message | some f in quota.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

test_quota_table if {
	gib := 1073741824
	cases := [
		# [usage, request patch, rule ids]
		[{"sandboxes": 2}, {}, set()],
		[{"sandboxes": 3}, {}, {"quota.sandboxes"}],
		[{"gpu_slices": 2}, {"gpu": {"profile": "2g.35gb", "count": 1}}, set()],
		[{"gpu_slices": 3}, {"gpu": {"profile": "2g.35gb", "count": 1}}, {"quota.gpu_slices"}],
		[{"gpu_slices": 9}, {}, set()],
		[{"memory_bytes": 7 * gib}, {}, set()],
		[{"memory_bytes": 7 * gib}, {"memory_bytes": gib + 1}, {"quota.memory"}],
		[{}, {"memory_bytes": 0}, {"quota.memory_limit_missing"}],
	]
	every c in cases {
		doc := object.union(fx.agent, {"usage": c[0], "request": c[1]})
		rules(doc) == c[2]
	}
}

test_sandbox_message_names_tenant_used_and_limit if {
	doc := object.union(fx.agent, {"usage": {"sandboxes": 3}})
	messages(doc) == {`tenant "agents" runs 3 sandboxes; one more exceeds its quota of 3`}
}

test_memory_limit_missing_is_warn if {
	doc := object.union(fx.agent, {"request": {"memory_bytes": 0}})
	some f in quota.findings with input as doc with data.bulkhead.tenants as fx.tenants
	f.enforcement == "warn"
}

test_tenant_without_quota_is_unlimited if {
	doc := object.union(fx.platform, {"usage": {"sandboxes": 100000, "gpu_slices": 1000}})
	rules(doc) == set()
}

test_invalid_memory_quota_refused if {
	tenants := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/quota/memory", "value": "lots"}])
	rs := {f.rule | some f in quota.findings} with input as fx.agent with data.bulkhead.tenants as tenants
	rs == {"quota.invalid"}
}

test_decimal_units_parse if {
	tenants := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/quota/memory", "value": "2G"}])
	quota.memory_limit == 2000000000 with input as fx.agent with data.bulkhead.tenants as tenants
}

# Usage and the pod's memory request default to zero when the input omits them.
test_missing_usage_and_memory_count_zero if {
	doc := object.remove(fx.agent, ["usage", "request"])
	quota.usage == {"sandboxes": 0, "gpu_slices": 0, "memory_bytes": 0} with input as doc
	quota.requested_memory == 0 with input as doc
}

# A container created in a sandbox already admitted charges nothing: no quota
# rule fires for kind container, even where the same sandbox input would.
test_container_kind_charges_no_quota if {
	full := object.union(fx.agent, {"usage": {"sandboxes": 3, "gpu_slices": 4, "memory_bytes": 8 * 1073741824}})
	rules(full) == {"quota.sandboxes", "quota.memory"}
	rules(fx.per_container(full)) == set()
	rules(fx.per_container(fx.agent)) == set()

	# Even an input that (wrongly) carries a request and usage.
	charged := object.union(full, {"kind": "container", "request": {"memory_bytes": 0, "gpu": {"profile": "1g.18gb", "count": 1}}})
	rules(charged) == set()
	invalid := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/quota/memory", "value": "lots"}])
	rs := {f.rule | some f in quota.findings} with input as fx.per_container(fx.agent) with data.bulkhead.tenants as invalid
	rs == set()
}
