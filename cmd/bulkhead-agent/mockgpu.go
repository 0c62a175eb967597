//go:build bulkhead_mockgpu

package main

// Built with the tag bulkhead_mockgpu (make build: bin/mockgpu), the agent
// runs pods on a simulated GPU node (mig.backend = "mock") for the demo and
// the tests; production builds leave the mock out.
import _ "github.com/bulkhead-runtime/bulkhead/mig/mocknode/register"
