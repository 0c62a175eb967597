package bulkhead.runtime_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.runtime

rules(doc) := r if {
	r := {f.rule | some f in runtime.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

selected(doc) := s if {
	s := runtime.selected with input as doc with data.bulkhead.tenants as fx.tenants
}

test_runtime_table if {
	cases := [
		# [namespace, handler, rule ids, selected runtime]
		["agents", "bulkhead", set(), "gvisor"],
		["agents", "", {"runtime.handler_required"}, "gvisor"],
		["agents", "runc", {"runtime.runc_forbidden"}, "gvisor"],
		["agents", "kata", {"runtime.unknown_handler"}, "gvisor"],
		["research", "bulkhead", set(), "gvisor"],
		["research", "", {"runtime.handler_required"}, "gvisor"],
		["research", "runc", {"runtime.runc_forbidden"}, "gvisor"],
		["platform", "bulkhead", set(), "gvisor"],
		["platform", "runc", {"runtime.runc_used"}, "runc"],
		["platform", "", {"runtime.runc_used"}, "runc"],
		# The runc tier's own handler: the trusted tier only.
		["agents", "bulkhead-runc", {"runtime.runc_forbidden"}, "gvisor"],
		["research", "bulkhead-runc", {"runtime.runc_forbidden"}, "gvisor"],
		["platform", "bulkhead-runc", {"runtime.runc_used"}, "runc"],
	]
	every c in cases {
		doc := fx.pod(c[0], c[1])
		rules(doc) == c[2]
		selected(doc) == c[3]
	}
}

test_runc_for_trusted_is_audit_only if {
	some f in runtime.findings with input as fx.platform with data.bulkhead.tenants as fx.tenants
	f.enforcement == "audit"
}

test_gvisor_forbidden_when_tier_lists_only_runc if {
	tiers := {"legacy": {"runtimes": ["runc"], "require_handler": false}}
	tenants := {"old": {"tier": "legacy", "namespaces": ["old"]}}
	rs := {f.rule | some f in runtime.findings} with input as fx.pod("old", "bulkhead")
		with data.bulkhead.tenants as tenants
		with data.bulkhead.tiers as tiers
	rs == {"runtime.gvisor_forbidden"}
}

# A pod without the runtime_handler field is judged as one naming none.
test_missing_handler_field_is_no_handler if {
	doc := json.remove(fx.pod("agents", "bulkhead"), ["/pod/runtime_handler"])
	rules(doc) == {"runtime.handler_required"}
	selected(doc) == "gvisor"
}

test_runc_message_names_tenant_and_handler if {
	some f in runtime.findings with input as fx.platform with data.bulkhead.tenants as fx.tenants
	f.message == `tenant "platform" runs a pod outside gVisor (handler "runc")`
}
