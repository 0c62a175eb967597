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

# Issue 24: a 1Mi container beside an unlimited sidecar was charged 1Mi and
# read as limited. A limit is missing when any container lacks one, at
# admission (init, app and ephemeral containers) and on a node for the
# container being created; at sandbox create the node's input lists only the
# sandbox container, and the pod's total speaks.
sidecar_pod(kind) := object.union(fx.agent, {
	"kind": kind,
	"pod": {"containers": [
		{"name": "main", "image": "registry.local/app@sha256:00", "memory_bytes": 1048576},
		{"name": "sidecar", "image": "registry.local/side@sha256:01"},
	]},
	"request": {"memory_bytes": 1048576},
})

test_memory_limit_missing_per_container if {
	mi := 1048576
	main := {"name": "main", "image": "registry.local/app@sha256:00", "memory_bytes": mi}
	cases := [
		# [kind, containers, request memory, rule ids]
		["admission", [main], mi, set()],
		["admission", [main, {"name": "sidecar"}], mi, {"quota.memory_limit_missing"}],
		["admission", [main, {"name": "sidecar", "memory_bytes": 0}], mi, {"quota.memory_limit_missing"}],
		["admission", [main, {"name": "sidecar", "memory_bytes": "1Gi"}], mi, {"quota.memory_limit_missing"}],
		["admission", [main, {"name": "debug", "ephemeral": true}], mi, {"quota.memory_limit_missing"}],
		["admission", [{"name": "init"}, main], mi, {"quota.memory_limit_missing"}],
		["admission", [{"name": "a"}, {"name": "b"}], 0, {"quota.memory_limit_missing"}],
		["admission", [], 0, {"quota.memory_limit_missing"}],
		["container", [main], 0, set()],
		["container", [{"name": "sidecar"}], 0, {"quota.memory_limit_missing"}],
		# The sandbox (pause) container is not the pod's.
		["sandbox", [{"name": "sandbox", "devices": ["/dev/kvm"]}], mi, set()],
		["sandbox", [], 0, {"quota.memory_limit_missing"}],
	]
	every c in cases {
		doc := object.union(fx.agent, {"kind": c[0], "pod": {"containers": c[1]}, "request": {"memory_bytes": c[2]}})
		rules(doc) == c[3]
	}
	bare := json.remove(object.union(fx.agent, {"kind": "admission"}), ["/pod/containers", "/request"])
	rules(bare) == {"quota.memory_limit_missing"}
}

test_memory_limit_missing_names_each_container if {
	messages(sidecar_pod("admission")) == {`tenant "agents" has a memory quota of 8Gi but container "sidecar" sets no memory limit`}
	debug := json.patch(sidecar_pod("admission"), [{"op": "add", "path": "/pod/containers/-", "value": {"name": "debug", "ephemeral": true}}])
	messages(debug) == {
		`tenant "agents" has a memory quota of 8Gi but container "sidecar" sets no memory limit`,
		`tenant "agents" has a memory quota of 8Gi but ephemeral container "debug" sets no memory limit`,
	}
	node := fx.per_container(json.patch(sidecar_pod("container"), [{"op": "remove", "path": "/pod/containers/0"}]))
	messages(node) == {`tenant "agents" has a memory quota of 8Gi but container "sidecar" sets no memory limit`}
}

# Without a memory quota, or with one that does not parse (quota.invalid's
# to report, where the pod is charged), no limit is missing.
test_memory_limit_missing_needs_a_memory_quota if {
	doc := object.union(fx.platform, {"kind": "admission", "pod": {"containers": [{"name": "sidecar"}]}})
	rules(doc) == set()
	invalid := json.patch(fx.tenants, [{"op": "replace", "path": "/agents/quota/memory", "value": "lots"}])
	rs := {f.rule | some f in quota.findings} with input as fx.per_container(sidecar_pod("container"))
		with data.bulkhead.tenants as invalid
	rs == set()
}

# With quota.memory_limit_missing: deny the decision refuses the pod at
# admission and the unlimited container on the node; the default warns.
test_memory_limit_missing_deny_refuses_at_both_points if {
	node := fx.per_container(sidecar_pod("container"))
	every doc in [sidecar_pod("admission"), node] {
		warned := data.bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
		warned.allow
		fx.rules(warned) == {"quota.memory_limit_missing"}
		denied := data.bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
			with data.bulkhead.enforcement as {"quota.memory_limit_missing": "deny"}
		not denied.allow
		fx.rules(denied) == {"quota.memory_limit_missing"}
	}
}
