//go:build bulkhead_failpoints

package runtime

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// A failpoints build (go build -tags bulkhead_failpoints) reads FailAtEnv,
// so the end-to-end tests can fail or hang a real shim at any step.
func init() {
	failAtFromEnv = func() string { return os.Getenv(FailAtEnv) }
	failpointHook = func(at, step string) error {
		if strings.HasPrefix(at, "@") {
			// "@path": the step is read from a file, so a test can change
			// it without restarting containerd.
			b, _ := os.ReadFile(at[1:])
			at = strings.TrimSpace(string(b))
		}
		if hang, ok := strings.CutPrefix(at, "hang:"); ok && hang == step {
			// Stand still so a test can kill -9 the shim mid-create.
			time.Sleep(5 * time.Minute)
			return fmt.Errorf("pipeline step %q: test hang expired", step)
		}
		if at != "" && at == step {
			return fmt.Errorf("injected failure at pipeline step %q (%s)", step, FailAtEnv)
		}
		return nil
	}
}
