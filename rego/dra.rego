# METADATA
# description: |
#   Dynamic resource allocation (pod.resource_claims): a DRA driver hands a
#   pod devices that no resource limit shows and that Bulkhead's GPU
#   placement and quotas never see. A request on a GPU device class
#   (data.bulkhead.gpu_device_classes) is a GPU request, allowed only where
#   the tier sets gpu.allow_dra; a request on any other class needs a tier
#   whose allowed_device_classes matches it. A claim whose requests could not
#   be read may be either, so only a tier that allows both admits it.
#   Bulkhead's own class (data.bulkhead.mig_device_class) is neither: its
#   driver places the slice through Bulkhead's ledger, so a request on it is
#   a GPU request judged like the bulkhead.dev/gpu-profile annotation
#   (bulkhead.gpu), provided it pins one MIG profile.
package bulkhead.dra

import data.bulkhead.identity

settings := identity.settings

default claims := []

claims := input.pod.resource_claims

# claim_label(c) names claim c and where it comes from in messages.
claim_label(c) := sprintf("resource claim %q (template %q)", [object.get(c, "name", ""), c.template_name]) if {
	c.template_name
} else := sprintf("resource claim %q (claim %q)", [object.get(c, "name", ""), c.claim_name]) if {
	c.claim_name
} else := sprintf("resource claim %q", [object.get(c, "name", "")])

# amount(r) says how many devices request r asks for.
amount(r) := "every matching device on the node" if {
	r.allocation_mode == "All"
} else := sprintf("%v device(s)", [object.get(r, "count", 1)])

# requests are the read requests of every claim, each with its claim's label.
requests contains {
	"who": claim_label(c),
	"name": object.get(r, "name", ""),
	"class": object.get(r, "device_class", ""),
	"amount": amount(r),
	"mode": object.get(r, "allocation_mode", ""),
	"count": object.get(r, "count", 1),
	"selectors": object.get(r, "selectors", []),
} if {
	some c in claims
	c.read == true
	some r in object.get(c, "requests", [])
}

gpu_class(class) if class in data.bulkhead.gpu_device_classes

mig_class(class) if class == data.bulkhead.mig_device_class

# mig_requests are the requests on Bulkhead's own class, in a stable order.
mig_requests := sort([[r.who, r.name, r] | some r in requests; mig_class(r.class)])

# selector_profile(e) is the MIG profile CEL expression e pins, in the form
# Bulkhead's driver documents (mig/dra.ProfileSelector):
# device.attributes["mig.bulkhead.dev"].profile == "3g.71gb".
selector_profile(e) := m[0][1] if {
	m := regex.find_all_string_submatch_n(`^device\.attributes\["mig\.bulkhead\.dev"\]\.profile == "([^"]+)"$`, e, 1)
	count(m) == 1
}

# mig_profile(r) is the one profile request r pins: exactly one selector,
# in that form, for exactly one device.
mig_profile(r) := selector_profile(r.selectors[0]) if {
	count(r.selectors) == 1
	r.mode != "All"
	r.count == 1
}

gpus_allowed if settings.gpu.allow_dra == true

# "*" allows every class; other patterns are globs with "." as separator
# ("*.example.com").
class_allowed(_) if "*" in settings.allowed_device_classes

class_allowed(class) if {
	is_string(class)
	some pattern in settings.allowed_device_classes
	glob.match(pattern, ["."], class)
}

# every_class_allowed: the tier would admit whatever an unread claim asks.
every_class_allowed if {
	gpus_allowed
	"*" in settings.allowed_device_classes
}

findings contains {
	"rule": "gpu.dra_forbidden",
	"message": sprintf("%s asks through DRA (request %q) for %s of GPU device class %q; tier %q takes GPUs only through %s", [r.who, r.name, r.amount, r.class, identity.tier_label, "nvidia.com/gpu limits or bulkhead.dev/gpu-profile"]),
} if {
	not gpus_allowed
	some r in requests
	gpu_class(r.class)
	not mig_class(r.class)
}

findings contains {
	"rule": "workload.device_class",
	"message": sprintf("%s asks through DRA (request %q) for %s of device class %q; tier %q allows device classes %v", [r.who, r.name, r.amount, r.class, identity.tier_label, settings.allowed_device_classes]),
} if {
	some r in requests
	not gpu_class(r.class)
	not mig_class(r.class)
	not class_allowed(r.class)
}

findings contains {
	"rule": "gpu.dra_profile_unpinned",
	"message": sprintf("%s asks through DRA (request %q) for %s of Bulkhead's MIG class %q without pinning one profile; a request there asks for one device with exactly one selector %s", [r.who, r.name, r.amount, r.class, `device.attributes["mig.bulkhead.dev"].profile == "<profile>"`]),
} if {
	some r in requests
	mig_class(r.class)
	not mig_profile(r)
}

findings contains {
	"rule": "gpu.count",
	"message": sprintf("%d requests ask through DRA for Bulkhead's MIG slices; one per pod is supported for now (%v)", [count(mig_requests), [sprintf("%s request %q", [e[0], e[1]]) | some e in mig_requests]]),
} if count(mig_requests) > 1

findings contains {
	"rule": "workload.claim_unread",
	"message": sprintf("%s could not be read, so the devices it asks for are unknown; tier %q admits such a claim only when it allows every device class and GPUs through DRA", [claim_label(c), identity.tier_label]),
} if {
	not every_class_allowed
	some c in claims
	not c.read == true
}
