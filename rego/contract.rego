# METADATA
# description: Refuses inputs this bundle was not written for (docs/policy.md, contract v1).
package bulkhead.contract

kinds := {"sandbox", "admission"}

# version and kind are read as references, not object.get(input, ...), so
# that the compiled plan sees these rules depend on two fields of input
# alone and keeps their findings across decisions.
default version := ""

version := input.version

default kind := ""

kind := input.kind

findings contains {
	"rule": "input.version_unsupported",
	"message": sprintf("input.version is %q; this bundle understands contract \"v1\"", [version]),
} if {
	version != "v1"
}

findings contains {
	"rule": "input.kind_invalid",
	"message": sprintf("input.kind is %q; want \"sandbox\" or \"admission\"", [kind]),
} if {
	not kind in kinds
}
