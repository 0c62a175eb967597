package policy

import (
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Capabilities returns the Rego capabilities Bulkhead compiles bundles with:
// this OPA version's builtins minus every non-deterministic one (http.send,
// net.lookup_ip_addr, time.now_ns, rand.intn, uuid.rfc4122, opa.runtime,
// io.jwt.decode_verify, ...), and no network access for the compiler. A
// decision must depend on the bundle and the input alone, so that the node and
// the admission webhook agree and a decision log entry can be replayed.
func Capabilities() *ast.Capabilities {
	caps := ast.CapabilitiesForThisVersion()
	caps.Builtins = slices.DeleteFunc(caps.Builtins, func(b *ast.Builtin) bool {
		return b.Nondeterministic
	})
	// An empty, non-nil AllowNet forbids every host (nil would allow all).
	caps.AllowNet = []string{}
	return caps
}
