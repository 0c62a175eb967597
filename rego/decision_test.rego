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

test_reasons_sorted_by_rule_within_a_family if {
	doc := object.union(fx.agent, {"pod": {"host_pid": true, "host_network": true, "containers": [object.union(fx.agent.pod.containers[0], {"privileged": true})]}})
	d := bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
	ids := [r.rule | some r in d.reasons]
	ids == ["workload.host_namespace", "workload.host_namespace", "workload.privileged"]
}

# The decisive reason comes first: who the pod is before what follows from
# its tier (without a tenant, the GPU rules fire against the lockdown).
test_reasons_decisive_first if {
	doc := object.union(fx.agent, {"request": {"gpu": {"profile": "1g.18gb", "count": 1}}, "pod": {"runtime_handler": "runc"}})
	d := bulkhead.decision with input as doc with data.bulkhead.tenants as {}
	d.reasons[0].rule == "tenant.unknown_namespace"
	ranks := [bulkhead.rank_of_rule(r.rule) | some r in d.reasons]
	ranks == sort(ranks)
	count(ranks) > 1
}

# Deny before warn before audit, whatever the families.
test_reasons_deny_before_warn_before_audit if {
	doc := json.patch(fx.agent, [
		{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:latest"},
		{"op": "add", "path": "/request/rdma", "value": true},
		{"op": "add", "path": "/pod/host_pid", "value": true},
	])
	d := bulkhead.decision with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.enforcement as {"rdma.forbidden": "audit"}
	[r.enforcement | some r in d.reasons] == ["deny", "warn", "audit"]
	[r.rule | some r in d.reasons] == ["workload.host_namespace", "workload.image_unpinned", "rdma.forbidden"]
}

test_reasons_of_other_families_come_last if {
	bulkhead.rank_of_rule("acme.cost_center") == count(bulkhead.reason_precedence)
	bulkhead.rank_of_rule("tenant.unknown_namespace") < bulkhead.rank_of_rule("gpu.max_slices")
	bulkhead.rank_of_rule("input.kind_invalid") == 0
}

# The pod the security review found admitted for an untrusted tenant is
# refused, every finding naming its rule; a trusted tenant may run it but
# for the raw RDMA device and the unclean host path.
review_pod(doc) := object.union(doc, {"pod": {
	"volumes": [
		{"name": "root", "type": "hostPath", "host_path": "/"},
		{"name": "verbs", "type": "hostPath", "host_path": "//dev/infiniband/uverbs0"},
	],
	"containers": [
		{
			"name": "main",
			"image": "registry.local/app@sha256:00",
			"mounts": [
				{"host_path": "/var/lib/kubelet/pods", "path": "/pods"},
				{"host_path": "/dev/infiniband", "path": "/ib"},
			],
			"added_capabilities": ["SYS_ADMIN", "NET_ADMIN", "NET_RAW"],
		},
		{"name": "debug", "image": "registry.local/debug@sha256:11", "ephemeral": true, "privileged": true},
	],
}})

test_review_pod_refused_for_untrusted if {
	d := bulkhead.decision with input as review_pod(fx.agent) with data.bulkhead.tenants as fx.tenants
	not d.allow
	fx.rules(d) == {"workload.host_path", "workload.capability", "workload.privileged", "rdma.device_forbidden"}
	every r in d.reasons {
		r.enforcement == "deny"
	}
}

test_review_pod_in_trusted_tier if {
	doc := review_pod(object.union(fx.platform, {"pod": {"runtime_handler": "runc"}}))
	d := bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
	not d.allow
	fx.rules(d) == {"workload.host_path", "rdma.device_forbidden", "runtime.runc_used"}
	clean := json.patch(doc, [
		{"op": "remove", "path": "/pod/volumes/1"},
		{"op": "remove", "path": "/pod/containers/0/mounts/1"},
	])
	c := bulkhead.decision with input as clean with data.bulkhead.tenants as fx.tenants
	c.allow
	fx.rules(c) == {"runtime.runc_used"}
}

# The node's check of one container in a sandbox it admitted: no request, no
# usage, and no quota warning for the memory limit it does not carry.
test_container_kind_decision if {
	d := bulkhead.decision with input as fx.per_container(fx.agent) with data.bulkhead.tenants as fx.tenants
	d.allow
	d.reasons == []
	p := bulkhead.decision with input as fx.per_container(fx.container(fx.agent, {"privileged": true})) with data.bulkhead.tenants as fx.tenants
	not p.allow
	fx.rules(p) == {"workload.privileged"}
}
