package bulkhead.dra_test

import data.bulkhead.dra
import data.bulkhead.fixtures_test as fx

admission(doc) := object.union(doc, {"kind": "admission"})

# claim(doc, c) adds resource claim c to doc.
claim(doc, c) := object.union(doc, {"pod": {"resource_claims": [c]}})

read_claim(requests) := {"name": "gpus", "template_name": "all-gpus", "read": true, "requests": requests}

all_gpus := read_claim([{"name": "gpu", "device_class": "gpu.nvidia.com", "allocation_mode": "All"}])

two_gpus := {"name": "shared", "claim_name": "team-gpus", "read": true, "requests": [{"name": "gpu", "device_class": "mig.nvidia.com", "allocation_mode": "ExactCount", "count": 2}]}

nic := read_claim([{"name": "nic", "device_class": "nic.example.com", "allocation_mode": "ExactCount", "count": 1}])

unread := {"name": "gpus", "template_name": "all-gpus"}

nameless := {"name": "x"}

rules(doc) := r if {
	r := {f.rule | some f in dra.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

messages(doc) := m if {
	m := {f.message | some f in dra.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

test_dra_table if {
	cases := [
		[admission(fx.agent), set()],
		[claim(admission(fx.agent), all_gpus), {"gpu.dra_forbidden"}],
		[claim(admission(fx.agent), two_gpus), {"gpu.dra_forbidden"}],
		[claim(admission(fx.research), all_gpus), {"gpu.dra_forbidden"}],
		[claim(admission(fx.platform), all_gpus), set()],
		[claim(admission(fx.agent), nic), {"workload.device_class"}],
		[claim(admission(fx.research), nic), {"workload.device_class"}],
		[claim(admission(fx.platform), nic), set()],
		[claim(admission(fx.agent), unread), {"workload.claim_unread"}],
		[claim(admission(fx.research), unread), {"workload.claim_unread"}],
		[claim(admission(fx.platform), unread), set()],
		[claim(admission(fx.agent), nameless), {"workload.claim_unread"}],
		# A claim read and empty asks for nothing.
		[claim(admission(fx.agent), read_claim([])), set()],
	]
	every c in cases {
		got := rules(c[0])
		got == c[1]
	}
}

test_messages_name_the_claim_and_the_request if {
	messages(claim(admission(fx.agent), all_gpus)) == {`resource claim "gpus" (template "all-gpus") asks through DRA (request "gpu") for every matching device on the node of GPU device class "gpu.nvidia.com"; tier "untrusted" takes GPUs only through nvidia.com/gpu limits or bulkhead.dev/gpu-profile`}
	messages(claim(admission(fx.research), two_gpus)) == {`resource claim "shared" (claim "team-gpus") asks through DRA (request "gpu") for 2 device(s) of GPU device class "mig.nvidia.com"; tier "standard" takes GPUs only through nvidia.com/gpu limits or bulkhead.dev/gpu-profile`}
	messages(claim(admission(fx.agent), nic)) == {`resource claim "gpus" (template "all-gpus") asks through DRA (request "nic") for 1 device(s) of device class "nic.example.com"; tier "untrusted" allows device classes []`}
	messages(claim(admission(fx.agent), nameless)) == {`resource claim "x" could not be read, so the devices it asks for are unknown; tier "untrusted" admits such a claim only when it allows every device class and GPUs through DRA`}
}

# A tier may open a class by glob, and GPUs through DRA by gpu.allow_dra.
test_tier_opens_classes_and_dra_gpus if {
	standard := object.union(data.bulkhead.tiers.standard, {"allowed_device_classes": ["*.example.com"], "gpu": {"allow_dra": true}})
	doc := claim(admission(fx.research), nic)
	r := {f.rule | some f in dra.findings} with input as doc with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers.standard as standard
	r == set()
	g := {f.rule | some f in dra.findings} with input as claim(admission(fx.research), all_gpus) with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers.standard as standard
	g == set()

	# Allowing every class but not DRA GPUs still refuses an unread claim.
	open := object.union(data.bulkhead.tiers.standard, {"allowed_device_classes": ["*"]})
	u := {f.rule | some f in dra.findings} with input as claim(admission(fx.research), unread) with data.bulkhead.tenants as fx.tenants with data.bulkhead.tiers.standard as open
	u == {"workload.claim_unread"}
}

# Without the GPU class list every class is judged by allowed_device_classes.
test_gpu_classes_default_to_none if {
	r := {f.rule | some f in dra.findings} with input as claim(admission(fx.agent), all_gpus)
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.gpu_device_classes as null
	r == {"workload.device_class"}
}

test_decision_refuses_a_dra_gpu_in_untrusted if {
	d := data.bulkhead.decision with input as claim(admission(fx.agent), all_gpus) with data.bulkhead.tenants as fx.tenants
	not d.allow
	"gpu.dra_forbidden" in fx.rules(d)
}
