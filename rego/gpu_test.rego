package bulkhead.gpu_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.gpu

rules(doc) := r if {
	r := {f.rule | some f in gpu.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

# agent_runc is an untrusted pod on a runtime that can hold a MIG slice: the
# tier forbids runc (runtime.runc_forbidden), but the GPU rules judge the
# request apart from that, so the tier's MIG caps and capacity rules are
# tested here without gpu.mig_in_gvisor, which every gVisor agent gets.
agent_runc := fx.pod("agents", "runc")

test_profile_table if {
	cases := [
		# [input, profile, count, rule ids]
		# The untrusted tier's caps, judged apart from its sandbox (agent_runc).
		[agent_runc, "1g.18gb", 1, set()],
		[agent_runc, "3g.71gb", 1, set()],
		[agent_runc, "4g.71gb", 1, {"gpu.profile_too_large"}],
		[agent_runc, "7g.141gb", 1, {"gpu.profile_too_large"}],
		[agent_runc, "whole", 1, {"gpu.whole_forbidden"}],
		[agent_runc, "2g.35gb", 4, {"gpu.max_slices", "gpu.no_capacity", "gpu.count"}],
		[agent_runc, "9g.1tb", 1, {"gpu.profile_unknown"}],
		[agent_runc, "1g.18gb", 0, {"gpu.count_invalid"}],
		[agent_runc, "1g.18gb", 1.5, {"gpu.count_invalid"}],
		[agent_runc, "1g.18gb", "1", {"gpu.count_invalid"}],
		# In its gVisor sandbox every MIG profile is refused as well.
		[fx.agent, "1g.18gb", 1, {"gpu.mig_in_gvisor"}],
		[fx.agent, "3g.71gb", 1, {"gpu.mig_in_gvisor"}],
		[fx.agent, "4g.71gb", 1, {"gpu.profile_too_large", "gpu.mig_in_gvisor"}],
		[fx.agent, "whole", 1, {"gpu.whole_forbidden"}],
		[fx.agent, "9g.1tb", 1, {"gpu.profile_unknown"}],
		[fx.agent, "1g.18gb", 0, {"gpu.count_invalid", "gpu.mig_in_gvisor"}],
		[fx.research, "7g.141gb", 1, set()],
		[fx.research, "whole", 1, set()],
		[fx.research, "whole", 3, {"gpu.no_capacity", "gpu.count"}],
		[fx.platform, "whole", 1, set()],
	]
	every c in cases {
		rules(fx.with_gpu(c[0], c[1], c[2])) == c[3]
	}
}

test_no_gpu_request_no_findings if {
	rules(fx.agent) == set()
	gpu.requested_slices == 0 with input as fx.agent
}

test_requested_slices if {
	gpu.requested_slices == 6 with input as fx.with_gpu(fx.agent, "3g.71gb", 2)
	gpu.requested_slices == 14 with input as fx.with_gpu(fx.research, "whole", 2)
}

test_untrusted_decision if {
	d := gpu.decision with input as fx.agent with data.bulkhead.tenants as fx.tenants
	d.whole_gpu == false
	d.exclusive_physical_gpu
	d.mig_in_sandbox == "refuse"
	d.max_slices == 4 # quota 4 < tier cap 7
	"3g.71gb" in d.allowed_profiles
	not "4g.71gb" in d.allowed_profiles
	not "whole" in d.allowed_profiles
}

test_standard_decision if {
	d := gpu.decision with input as fx.research with data.bulkhead.tenants as fx.tenants
	d.whole_gpu
	d.mig_in_sandbox == "whole-gpu"
	d.max_slices == 28
	"whole" in d.allowed_profiles
	"7g.141gb" in d.allowed_profiles
}

test_trusted_without_quota_uses_tier_cap if {
	d := gpu.decision with input as fx.platform with data.bulkhead.tenants as fx.tenants
	d.max_slices == 56
}

test_whole_gpu_fallback_needs_whole_gpus if {
	tiers := {"odd": {"gpu": {"max_profile_slices": 3, "whole_gpu": false, "mig_in_sandbox": "whole-gpu"}}}
	tenants := {"odd": {"tier": "odd", "namespaces": ["odd"]}}
	gpu.mig_in_sandbox == "refuse" with input as fx.pod("odd", "bulkhead")
		with data.bulkhead.tenants as tenants
		with data.bulkhead.tiers as tiers
}

test_exclusive_tier_skips_gpus_of_other_tenants if {
	shared_node := {"name": "n", "gpus": [{"index": 0, "model": "H200", "mig_enabled": true, "free_slices": 5, "tenants": ["research"]}]}
	doc := object.union(fx.with_gpu(agent_runc, "1g.18gb", 1), {"node": shared_node})
	rules(doc) == {"gpu.no_capacity"}
	own := object.union(doc, {"node": {"gpus": [{"index": 0, "model": "H200", "mig_enabled": true, "free_slices": 5, "tenants": ["agents"]}]}})
	rules(own) == set()
	research := object.union(fx.with_gpu(fx.research, "1g.18gb", 1), {"node": shared_node})
	rules(research) == set()
}

test_admission_skips_node_capacity if {
	doc := object.remove(object.union(fx.with_gpu(fx.research, "whole", 1), {"kind": "admission"}), ["node"])
	rules(doc) == set()
}

test_one_gpu_per_pod if {
	rules(fx.with_gpu(fx.research, "whole", 1)) == set()
	rules(fx.with_gpu(fx.research, "whole", 2)) == {"gpu.count"}
	rules(fx.with_gpu(agent_runc, "1g.18gb", 2)) == {"gpu.count"}
	admission := object.remove(object.union(fx.with_gpu(fx.research, "7g.141gb", 2), {"kind": "admission"}), ["node"])
	rules(admission) == {"gpu.count"}
}

test_sandbox_without_node_refused if {
	doc := object.remove(fx.with_gpu(agent_runc, "1g.18gb", 1), ["node"])
	rules(doc) == {"gpu.node_unknown"}
}

test_usage_counts_against_tier_cap if {
	doc := object.union(fx.with_gpu(agent_runc, "3g.71gb", 1), {"usage": {"gpu_slices": 5}})
	rules(doc) == {"gpu.max_slices"}
}

test_null_gpu_is_no_request if {
	doc := object.union(fx.agent, {"request": {"gpu": null}})
	rules(doc) == set()
}

test_profiles_up_to_matches_catalogue if {
	count(data.bulkhead.gpu_profiles_up_to) == 8
	every n, listed in data.bulkhead.gpu_profiles_up_to {
		listed == sort([p | some p, slices in data.bulkhead.gpu_profiles; slices <= n])
	}
}

# An input without usage counts no slices held.
test_missing_usage_counts_zero if {
	gpu.used_slices == 0 with input as object.remove(fx.agent, ["usage"])
}

# GPUs are settled when the sandbox is created: the node's check of one
# container in it (kind container) charges none, whatever its input says.
test_container_kind_asks_for_no_gpu if {
	charged := object.union(fx.with_gpu(fx.agent, "3g.71gb", 1), {"usage": {"gpu_slices": 5}})
	rules(charged) == {"gpu.max_slices", "gpu.mig_in_gvisor"}
	per_container := object.union(charged, {"kind": "container"})
	rules(per_container) == set()
	gpu.requested_slices == 0 with input as per_container
	rules(object.union(fx.with_gpu(fx.agent, "whole", 0), {"kind": "container"})) == set()
}

# gpu.mig_in_gvisor: a MIG profile for a pod whose handler runs gVisor is
# refused where the tier answers mig_in_sandbox "refuse", exactly where the
# node's shim would refuse it (runtime.Pipeline.placeGPU, same rule id).
test_mig_in_gvisor_table if {
	odd_tiers := object.union(data.bulkhead.tiers, {
		"fallback-without-whole": {"gpu": {"max_profile_slices": 7, "max_slices": 7, "whole_gpu": false, "mig_in_sandbox": "whole-gpu"}},
		"refusing-standard": object.union(data.bulkhead.tiers.standard, {"gpu": {"mig_in_sandbox": "refuse"}}),
	})
	odd_tenants := object.union(fx.tenants, {
		"odd": {"tier": "fallback-without-whole", "namespaces": ["odd"]},
		"strict": {"tier": "refusing-standard", "namespaces": ["strict"]},
	})
	cases := [
		# [namespace, handler, profile, fires]
		["agents", "bulkhead", "1g.18gb", true], # untrusted, gVisor: refuse
		["agents", "bulkhead", "1g.18gb+me", true],
		["agents", "bulkhead", "3g.71gb", true],
		["agents", "bulkhead", "whole", false], # not a slice (gpu.whole_forbidden)
		["agents", "bulkhead", "9g.1tb", false], # not a profile (gpu.profile_unknown)
		["agents", "runc", "1g.18gb", false], # runc can hold a slice (runtime.runc_forbidden)
		["agents", "bulkhead-runc", "1g.18gb", false],
		["agents", "", "1g.18gb", false], # no handler: runc by default (runtime.handler_required)
		["agents", "kata", "1g.18gb", false], # unknown handler (runtime.unknown_handler)
		["research", "bulkhead", "1g.18gb", false], # standard: whole-gpu fallback
		["research", "bulkhead", "7g.141gb", false],
		["platform", "bulkhead", "3g.71gb", false], # trusted: whole-gpu fallback
		["platform", "runc", "3g.71gb", false],
		["odd", "bulkhead", "1g.18gb", true], # a fallback to whole GPUs the tier may not take is a refusal
		["strict", "bulkhead", "2g.35gb", true],
		["strict", "bulkhead", "whole", false],
	]
	every c in cases {
		doc := fx.with_gpu(fx.pod(c[0], c[1]), c[2], 1)
		fired := "gpu.mig_in_gvisor" in {f.rule | some f in gpu.findings} with input as doc
			with data.bulkhead.tenants as odd_tenants
			with data.bulkhead.tiers as odd_tiers
		fired == c[3]
	}
}

test_mig_in_gvisor_message_names_nvproxy if {
	fs := [f |
		some f in gpu.findings with input as fx.with_gpu(fx.agent, "1g.18gb", 1) with data.bulkhead.tenants as fx.tenants
		f.rule == "gpu.mig_in_gvisor"
	]
	count(fs) == 1
	contains(fs[0].message, "nvproxy")
	contains(fs[0].message, "/dev/nvidia-caps")
	contains(fs[0].message, `"1g.18gb"`)
	contains(fs[0].message, `tier "untrusted"`)
}

# The decision refuses the pod with it at admission as on the node.
test_mig_in_gvisor_refuses_at_admission_and_on_the_node if {
	every kind in ["admission", "sandbox"] {
		doc := object.union(fx.with_gpu(fx.agent, "1g.18gb", 1), {"kind": kind})
		d := data.bulkhead.decision with input as doc with data.bulkhead.tenants as fx.tenants
		not d.allow
		"gpu.mig_in_gvisor" in fx.rules(d)
	}

	# A container created in an admitted sandbox asks for no GPU.
	per_container := fx.per_container(fx.with_gpu(fx.agent, "1g.18gb", 1))
	d := data.bulkhead.decision with input as per_container with data.bulkhead.tenants as fx.tenants
	not "gpu.mig_in_gvisor" in fx.rules(d)
}
