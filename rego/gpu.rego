# METADATA
# description: |
#   GPU requests: MIG profile caps per tier, whole GPUs, co-tenancy on a
#   physical GPU and the node's free capacity. gVisor's nvproxy cannot expose
#   MIG capabilities, so the decision also says what the node must do when a
#   sandbox cannot use a slice (mig_in_sandbox), and a pod that would get
#   no usable GPU is refused here, at admission as on the node.
package bulkhead.gpu

import data.bulkhead.contract
import data.bulkhead.dra
import data.bulkhead.identity
import data.bulkhead.runtime

settings := identity.settings.gpu

whole_slices := 7

# request is input.request.gpu when the pod asks for a GPU. GPUs are settled
# when the sandbox is created: a container created in it (kind container)
# asks for none, whatever its input says.
request := input.request.gpu if {
	not contract.per_container
	annotated
}

# annotated: the pod asks through bulkhead.dev/gpu-profile or GPU limits.
annotated if is_object(input.request.gpu)

# A pod's claim on Bulkhead's own DRA class (bulkhead.dra) asks for the MIG
# profile its selector pins, as the annotation would: the same caps, quota
# and runtime rules judge it, here and when the node prepares the claim.
# (Several such claims, or one that pins no profile, are refused by
# bulkhead.dra.)
request := {"profile": profile_of_claim, "count": 1, "claim": true} if {
	not contract.per_container
	not annotated
	count(dra.mig_requests) == 1
	profile_of_claim := dra.mig_profile(dra.mig_requests[0][2])
}

from_claim if request.claim == true

findings contains {
	"rule": "gpu.count",
	"message": "the pod asks for a GPU both through bulkhead.dev/gpu-profile (or GPU limits) and through a claim on Bulkhead's MIG class; ask one way",
} if {
	not contract.per_container
	annotated
	count(dra.mig_requests) > 0
}

profile := object.get(request, "profile", "")

gpu_count := object.get(request, "count", 0)

whole if profile == "whole"

# data.bulkhead.gpu_profiles maps each MIG profile name to the compute
# slices one instance of it uses.
known_profile if data.bulkhead.gpu_profiles[profile]

# profile_slices is the number of compute slices one unit of the profile uses.
profile_slices := whole_slices if whole

profile_slices := data.bulkhead.gpu_profiles[profile] if known_profile

valid_count if {
	is_number(gpu_count)
	gpu_count >= 1
	floor(gpu_count) == gpu_count
}

default requested_slices := 0

requested_slices := profile_slices * gpu_count if valid_count

# data.bulkhead.gpu_profiles_up_to[n] lists, sorted, the profiles of at most
# n slices: precomputed (and checked by gpu_test.rego) so that a decision
# does not walk the whole catalogue.
mig_profiles := data.bulkhead.gpu_profiles_up_to[settings.max_profile_slices]

allowed_profiles := array.concat(mig_profiles, ["whole"]) if settings.whole_gpu

allowed_profiles := mig_profiles if not settings.whole_gpu

quota_slices := identity.config.quota.gpu_slices

max_slices := min({settings.max_slices, quota_slices}) if quota_slices

max_slices := settings.max_slices if not quota_slices

mig_in_sandbox := "whole-gpu" if {
	settings.mig_in_sandbox == "whole-gpu"
	settings.whole_gpu
} else := "refuse"

decision := {
	"allowed_profiles": allowed_profiles,
	"max_slices": max_slices,
	"whole_gpu": settings.whole_gpu,
	"exclusive_physical_gpu": settings.exclusive_physical_gpu,
	"mig_in_sandbox": mig_in_sandbox,
}

findings contains {
	"rule": "gpu.profile_unknown",
	"message": sprintf("GPU profile %q is neither \"whole\" nor a MIG profile in data.bulkhead.gpu_profiles", [profile]),
} if {
	request
	not whole
	not known_profile
}

findings contains {
	"rule": "gpu.count_invalid",
	"message": sprintf("GPU count %v must be a whole number of at least 1", [gpu_count]),
} if {
	request
	not valid_count
}

# A node places one GPU or MIG slice per pod (its shim refuses more with the
# same rule id): the bundle says so at admission too, so that the webhook
# does not admit a pod that every node refuses. Several slices per pod wait
# for the DRA driver, which allocates per claim.
findings contains {
	"rule": "gpu.count",
	"message": sprintf("bulkhead.dev/gpu-count %v: one GPU or slice per pod is supported (a node places one)", [gpu_count]),
} if {
	valid_count
	gpu_count > 1
}

# A MIG slice cannot go into a gVisor sandbox: nvproxy passes /dev/nvidiactl,
# /dev/nvidia-uvm and /dev/nvidiaN through but no /dev/nvidia-caps/*, the
# capability devices a slice needs. With mig_in_sandbox "whole-gpu" the node
# hands over a whole GPU instead; with "refuse" every node refuses the pod
# (the shim keeps the same check, same rule id), so the bundle refuses it
# first and the webhook does not admit a pod that no node will start. The
# runtime is the one the pod's handler names (a handler the tier forbids is
# refused by the runtime rules, not judged here as gVisor).
findings contains {
	"rule": "gpu.mig_in_gvisor",
	"message": sprintf("profile %q is a MIG slice and the pod runs in gVisor (handler %q), whose nvproxy exposes no /dev/nvidia-caps for MIG capabilities; tier %q answers mig_in_sandbox %q, so the pod would get no usable GPU", [profile, runtime.handler, identity.tier_label, mig_in_sandbox]),
} if {
	known_profile
	runtime.runtime_of_handler == "gvisor"
	mig_in_sandbox == "refuse"
}

# A claimed device is that slice: the whole-GPU fallback of
# mig_in_sandbox "whole-gpu" is for the annotation only, so a gVisor pod's
# claim is refused whatever the tier answers (the node's PrepareClaim
# refuses it with the same rule).
findings contains {
	"rule": "gpu.mig_in_gvisor",
	"message": sprintf("profile %q is a MIG slice claimed through DRA and the pod runs in gVisor (handler %q), whose nvproxy exposes no /dev/nvidia-caps for MIG capabilities; a claimed slice has no whole-GPU fallback", [profile, runtime.handler]),
} if {
	from_claim
	known_profile
	runtime.runtime_of_handler == "gvisor"
	mig_in_sandbox == "whole-gpu"
}

findings contains {
	"rule": "gpu.whole_forbidden",
	"message": sprintf("tier %q may not take a whole GPU; allowed profiles: %v", [identity.tier_label, allowed_profiles]),
} if {
	whole
	not settings.whole_gpu
}

findings contains {
	"rule": "gpu.profile_too_large",
	"message": sprintf("profile %q uses %d compute slices; tier %q allows at most %d per slice", [profile, profile_slices, identity.tier_label, settings.max_profile_slices]),
} if {
	known_profile
	profile_slices > settings.max_profile_slices
}

findings contains {
	"rule": "gpu.max_slices",
	"message": sprintf("tenant %q holds %d compute slices and asks for %d more (%v x %q); tier %q caps a tenant at %d", [identity.tenant_label, used_slices, requested_slices, gpu_count, profile, identity.tier_label, settings.max_slices]),
} if {
	requested_slices > 0
	used_slices + requested_slices > settings.max_slices
}

default used_slices := 0

used_slices := input.usage.gpu_slices

# Node capacity is only known to the node: admission decisions skip it.
on_node if input.kind == "sandbox"

node_described if is_object(input.node)

node_gpus := object.get(input.node, "gpus", []) if {
	on_node
	node_described
}

findings contains {
	"rule": "gpu.node_unknown",
	"message": "a sandbox input that requests a GPU must describe the node's GPUs (input.node)",
} if {
	request
	on_node
	not node_described
}

# shareable(g) holds when the tenant may place a slice on physical GPU g.
shareable(_) if not settings.exclusive_physical_gpu

shareable(g) if {
	every t in object.get(g, "tenants", []) {
		t == identity.tenant_label
	}
}

free_mig_slices := sum([g.free_slices | some g in node_gpus; g.mig_enabled; shareable(g)])

idle_gpus := count([g |
	some g in node_gpus
	count(object.get(g, "tenants", [])) == 0
	idle(g)
])

idle(g) if not g.mig_enabled

idle(g) if g.free_slices == whole_slices

findings contains {
	"rule": "gpu.no_capacity",
	"message": sprintf("node %q has %d free MIG compute slices this tenant may use (exclusive_physical_gpu=%v); the pod needs %d", [object.get(input.node, "name", ""), free_mig_slices, settings.exclusive_physical_gpu, requested_slices]),
} if {
	node_gpus
	known_profile
	valid_count
	free_mig_slices < requested_slices
}

findings contains {
	"rule": "gpu.no_capacity",
	"message": sprintf("node %q has %d idle whole GPUs; the pod needs %d", [object.get(input.node, "name", ""), idle_gpus, gpu_count]),
} if {
	node_gpus
	whole
	valid_count
	idle_gpus < gpu_count
}
