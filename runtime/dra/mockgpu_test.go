package dra

// The tests open nodes with mig.backend = "mock"; production builds link it
// only under the tag bulkhead_mockgpu.
import _ "github.com/bulkhead-runtime/bulkhead/mig/mocknode/register"
