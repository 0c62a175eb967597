//go:build bulkhead_mockgpu

package main

// Built with the tag bulkhead_mockgpu (make build: bin/mockgpu), the CLI
// reads a mock node's GPUs (mig.backend = "mock") for `bulkhead node status`
// on the demo's and the tests' nodes; production builds leave the mock out.
import _ "github.com/bulkhead-runtime/bulkhead/mig/mocknode/register"
