package bulkhead.dra_mig_test

import data.bulkhead.dra
import data.bulkhead.fixtures_test as fx
import data.bulkhead.gpu

# A claim on Bulkhead's own DRA class is a GPU request judged like the
# bulkhead.dev/gpu-profile annotation: the tier's profile caps, its quota,
# and the runtime (no MIG slice in gVisor), once it pins one profile.

admission(doc) := object.union(doc, {"kind": "admission"})

with_claims(doc, cs) := object.union(doc, {"pod": {"resource_claims": cs}})

mig_claim(name, selectors) := {"name": name, "template_name": "mig", "read": true, "requests": [{
	"name": "gpu", "device_class": "mig.bulkhead.dev", "allocation_mode": "ExactCount", "count": 1,
	"selectors": selectors,
}]}

pin(profile) := [sprintf(`device.attributes["mig.bulkhead.dev"].profile == %q`, [profile])]

rules(doc) := r if {
	r := {f.rule | some f in array.concat([f | some f in dra.findings], [f | some f in gpu.findings])} with input as doc with data.bulkhead.tenants as fx.tenants
}

requested(doc) := r if {
	r := gpu.request with input as doc with data.bulkhead.tenants as fx.tenants
}

test_mig_claims_table if {
	cases := [
		# The trusted tier's runc pod: the annotation's rules find nothing.
		[with_claims(admission(fx.platform), [mig_claim("gpu", pin("3g.71gb"))]), set()],
		# gVisor: a claimed slice has no whole-GPU fallback.
		[with_claims(admission(fx.agent), [mig_claim("gpu", pin("1g.18gb"))]), {"gpu.mig_in_gvisor"}],
		[with_claims(admission(fx.research), [mig_claim("gpu", pin("1g.18gb"))]), {"gpu.mig_in_gvisor"}],
		# Not pinned: no selector, another form, two selectors, All.
		[with_claims(admission(fx.platform), [mig_claim("gpu", [])]), {"gpu.dra_profile_unpinned"}],
		[with_claims(admission(fx.platform), [mig_claim("gpu", [`device.attributes["mig.bulkhead.dev"].profile != "1g.18gb"`])]), {"gpu.dra_profile_unpinned"}],
		[with_claims(admission(fx.platform), [mig_claim("gpu", array.concat(pin("1g.18gb"), pin("3g.71gb")))]), {"gpu.dra_profile_unpinned"}],
		[with_claims(admission(fx.platform), [{"name": "gpu", "template_name": "mig", "read": true, "requests": [{"name": "gpu", "device_class": "mig.bulkhead.dev", "allocation_mode": "All", "selectors": pin("1g.18gb")}]}]), {"gpu.dra_profile_unpinned"}],
		# A profile the catalogue does not know.
		[with_claims(admission(fx.platform), [mig_claim("gpu", pin("9g.999gb"))]), {"gpu.profile_unknown"}],
		# One per pod for now, and not beside the annotation.
		[with_claims(admission(fx.platform), [mig_claim("a", pin("1g.18gb")), mig_claim("b", pin("1g.18gb"))]), {"gpu.count"}],
		[object.union(with_claims(admission(fx.platform), [mig_claim("gpu", pin("1g.18gb"))]), {"request": {"gpu": {"profile": "1g.18gb", "count": 1}}}), {"gpu.count"}],
	]
	every c in cases {
		got := rules(c[0])
		got == c[1]
	}
}

test_the_claim_is_the_request if {
	requested(with_claims(admission(fx.platform), [mig_claim("gpu", pin("3g.71gb"))])) == {"profile": "3g.71gb", "count": 1, "claim": true}
	gpu.requested_slices == 3 with input as with_claims(admission(fx.platform), [mig_claim("gpu", pin("3g.71gb"))]) with data.bulkhead.tenants as fx.tenants
}

test_other_classes_are_not_mig_claims if {
	not requested(with_claims(admission(fx.platform), [{"name": "gpu", "template_name": "x", "read": true, "requests": [{"name": "gpu", "device_class": "gpu.nvidia.com", "allocation_mode": "ExactCount", "count": 1, "selectors": pin("1g.18gb")}]}]))
}
