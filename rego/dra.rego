# METADATA
# description: |
#   Dynamic resource allocation (pod.resource_claims): a DRA driver hands a
#   pod devices that no resource limit shows and that Bulkhead's GPU
#   placement and quotas never see. A request on a GPU device class
#   (data.bulkhead.gpu_device_classes) is a GPU request, allowed only where
#   the tier sets gpu.allow_dra; a request on any other class needs a tier
#   whose allowed_device_classes matches it. A claim whose requests could not
#   be read may be either, so only a tier that allows both admits it.
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
} if {
	some c in claims
	c.read == true
	some r in object.get(c, "requests", [])
}

gpu_class(class) if class in data.bulkhead.gpu_device_classes

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
}

findings contains {
	"rule": "workload.device_class",
	"message": sprintf("%s asks through DRA (request %q) for %s of device class %q; tier %q allows device classes %v", [r.who, r.name, r.amount, r.class, identity.tier_label, settings.allowed_device_classes]),
} if {
	some r in requests
	not gpu_class(r.class)
	not class_allowed(r.class)
}

findings contains {
	"rule": "workload.claim_unread",
	"message": sprintf("%s could not be read, so the devices it asks for are unknown; tier %q admits such a claim only when it allows every device class and GPUs through DRA", [claim_label(c), identity.tier_label]),
} if {
	not every_class_allowed
	some c in claims
	not c.read == true
}
