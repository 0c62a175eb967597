package runtime

import "fmt"

// FailAtEnv names the pipeline step that fails on purpose ("hang:STEP"
// stands still there instead), or "@path" of a file that says so. Only a
// shim built with the bulkhead_failpoints tag (bin/failpoints, for the
// end-to-end tests) reads it; a production shim ignores it.
const FailAtEnv = "BULKHEAD_TEST_FAIL_AT"

// fail is where each pipeline step may be made to fail on purpose, which
// proves that a failure at every step unwinds completely. failAt is set
// only by this package's tests and, in a failpoints build, by FailAtEnv.
func (p *Pipeline) fail(step string) error {
	if failpointHook != nil {
		return failpointHook(p.failAt, step)
	}
	if p.failAt != "" && p.failAt == step {
		return fmt.Errorf("injected failure at pipeline step %q", step)
	}
	return nil
}

// failpointHook and failAtFromEnv are replaced in failpoints builds.
var (
	failpointHook func(at, step string) error
	failAtFromEnv = func() string { return "" }
)
