# METADATA
# description: |
#   Chooses the sandbox runtime from the pod's RuntimeClass handler. Tiers
#   list the runtimes they may use; untrusted tenants get gVisor only and a
#   pod that names no handler is refused for them.
package bulkhead.runtime

import data.bulkhead.identity

# The pod's fields are read by path with defaults, not with object.get on
# input.pod, and no message names the pod (the decision is about it): the
# findings then depend on the handler and the namespace alone, and the
# engine keeps them for the next pod of the same tenant and handler.
default handler := ""

handler := input.pod.runtime_handler

# runtime_of_handler is the runtime the pod would actually run under.
runtime_of_handler := data.bulkhead.default_handler_runtime if handler == ""

runtime_of_handler := data.bulkhead.handlers[handler] if handler != ""

permitted if runtime_of_handler in identity.settings.runtimes

default selected := "gvisor"

selected := runtime_of_handler if permitted

findings contains {
	"rule": "runtime.handler_required",
	"message": sprintf("pod names no RuntimeClass; tier %q requires runtimeClassName %q (gVisor)", [identity.tier_label, "bulkhead"]),
} if {
	handler == ""
	identity.settings.require_handler
}

findings contains {
	"rule": "runtime.unknown_handler",
	"message": sprintf("runtime handler %q is not in data.bulkhead.handlers", [handler]),
} if {
	handler != ""
	not data.bulkhead.handlers[handler]
}

findings contains {
	"rule": sprintf("runtime.%s_forbidden", [runtime_of_handler]),
	"message": sprintf("tier %q may not run pods under %s (handler %q); allowed: %v", [identity.tier_label, runtime_of_handler, handler, identity.settings.runtimes]),
} if {
	not permitted
	not handler_missing_is_refused
}

handler_missing_is_refused if {
	handler == ""
	identity.settings.require_handler
}

findings contains {
	"rule": "runtime.runc_used",
	"message": sprintf("tenant %q runs a pod outside gVisor (handler %q)", [identity.tenant_label, handler]),
	"enforcement": "audit",
} if {
	permitted
	runtime_of_handler == "runc"
}
