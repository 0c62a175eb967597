package bulkhead.decision_test

import data.bulkhead
import data.bulkhead.fixtures_test as fx

test_allowed_agent_pod if {
	d := bulkhead.decision with input as fx.agent with data.bulkhead.tenants as fx.tenants
	d.allow
	d.reasons == []
	d.tenant == "agents"
	d.tier == "untrusted"
	d.runtime == "gvisor"
	d.rdma == "deny"
	d.warnings == []
}

test_unknown_namespace_denied_with_lockdown if {
	d := bulkhead.decision with input as fx.pod("elsewhere", "bulkhead") with data.bulkhead.tenants as fx.tenants
	not d.allow
	fx.rules(d) == {"tenant.unknown_namespace"}
	d.tenant == ""
	d.tier == ""
	d.gpu.allowed_profiles == []
	d.gpu.max_slices == 0
	d.network.egress_cidrs == []
	d.network.deny_metadata
}

test_warn_reason_does_not_deny if {
	doc := json.patch(fx.agent, [{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:latest"}])
	d := bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
	d.allow
	d.reasons[0].rule == "workload.image_unpinned"
	d.reasons[0].enforcement == "warn"
	startswith(d.warnings[0], "workload.image_unpinned: ")
}

test_enforcement_override_turns_warn_into_deny if {
	doc := json.patch(fx.agent, [{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:latest"}])
	d := bulkhead.decision with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.enforcement as {"workload.image_unpinned": "deny"}
	not d.allow
	d.warnings == []
}

test_enforcement_override_turns_deny_into_audit if {
	doc := object.union(fx.agent, {"pod": {"host_network": true}})
	d := bulkhead.decision with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.enforcement as {"workload.host_namespace": "audit"}
	d.allow
	d.reasons[0].enforcement == "audit"
}

test_unknown_enforcement_mode_fails_closed if {
	doc := json.patch(fx.agent, [{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:latest"}])
	d := bulkhead.decision with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.enforcement as {"workload.image_unpinned": "shrug"}
	not d.allow
}

test_reasons_sorted_by_rule if {
	doc := object.union(fx.agent, {"pod": {"host_pid": true, "runtime_handler": "runc"}})
	d := bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
	ids := [r.rule | some r in d.reasons]
	ids == sort(ids)
	count(ids) == 2
}
