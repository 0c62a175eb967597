// Command bulkhead-agent is Bulkhead's node agent: one process per node
// that holds the policy, the ledger, the GPU backend and the fence, and
// serves the node's shims (package runtime/agent).
package main

import (
	"os"

	"github.com/bulkhead-runtime/bulkhead/runtime/agent"
)

func main() {
	os.Exit(agent.Main(os.Args[1:], os.Stdout, os.Stderr))
}
