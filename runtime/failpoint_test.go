package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProductionAgentIgnoresFailpoints: the node agent built
// without the bulkhead_failpoints tag contains no trace of FailAtEnv, so
// no environment variable can make a production agent fail or hang.
func TestProductionAgentIgnoresFailpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		tags string
		want bool
	}{{"", false}, {"bulkhead_failpoints", true}} {
		bin := filepath.Join(dir, "agent-"+tc.tags)
		args := []string{"build", "-o", bin}
		if tc.tags != "" {
			args = append(args, "-tags", tc.tags)
		}
		cmd := exec.Command("go", append(args, "../cmd/bulkhead-agent")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", args, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), "test hang expired"); got != tc.want {
			t.Errorf("tags %q: failpoint code linked = %v, want %v", tc.tags, got, tc.want)
		}
	}
}
