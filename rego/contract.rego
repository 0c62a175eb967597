# METADATA
# description: Refuses inputs this bundle was not written for (docs/policy.md, contract v1).
package bulkhead.contract

# kinds are the decisions a bundle is asked for: a node starting a pod
# sandbox, a node creating one container in a sandbox it already admitted,
# and the API server admitting a pod.
kinds := {"sandbox", "container", "admission"}

# version and kind are read as references, not object.get(input, ...), so
# that the compiled plan sees these rules depend on two fields of input
# alone and keeps their findings across decisions.
default version := ""

version := input.version

default kind := ""

kind := input.kind

# per_container holds for a container created in a sandbox already admitted:
# input.request is empty and input.usage zero, because quota and GPU were
# settled when the sandbox was created. Rules that charge resources skip it.
per_container if kind == "container"

findings contains {
	"rule": "input.version_unsupported",
	"message": sprintf("input.version is %q; this bundle understands contract \"v1\"", [version]),
} if {
	version != "v1"
}

findings contains {
	"rule": "input.kind_invalid",
	"message": sprintf("input.kind is %q; want \"sandbox\", \"container\" or \"admission\"", [kind]),
} if {
	not kind in kinds
}
