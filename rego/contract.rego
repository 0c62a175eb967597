# METADATA
# description: Refuses inputs this bundle was not written for (docs/policy.md, contract v1).
package bulkhead.contract

kinds := {"sandbox", "admission"}

findings contains {
	"rule": "input.version_unsupported",
	"message": sprintf("input.version is %q; this bundle understands contract \"v1\"", [object.get(input, "version", "")]),
} if {
	object.get(input, "version", "") != "v1"
}

findings contains {
	"rule": "input.kind_invalid",
	"message": sprintf("input.kind is %q; want \"sandbox\" or \"admission\"", [object.get(input, "kind", "")]),
} if {
	not object.get(input, "kind", "") in kinds
}
