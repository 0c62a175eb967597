package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/containerd/log"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
)

func TestMainUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--version"}, 0, "bulkhead-agent dev"},
		{[]string{"--help"}, 0, "usage: bulkhead-agent"},
		{[]string{"--log-format", "xml"}, 2, `--log-format "xml"`},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--no-such-flag"}, 2, "no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("bulkhead-agent %v: exit %d, output %q; want exit %d and %q", tc.args, code, stdout.String()+stderr.String(), tc.code, tc.out)
		}
		// Help and version on stdout alone; usage errors on stderr alone.
		if (code == 0) != (stderr.Len() == 0) || (code == 0) != (stdout.Len() > 0) {
			t.Errorf("bulkhead-agent %v: exit %d, stdout %q, stderr %q: want help on stdout only, errors on stderr only", tc.args, code, stdout.String(), stderr.String())
		}
	}
	log.SetFormat(log.TextFormat)
}

// TestLogsCarryTheCall: with --log-format json every line the agent logs
// for a shim's call is one JSON object with the call's fields.
func TestLogsCarryTheCall(t *testing.T) {
	var buf bytes.Buffer
	log.SetFormat(log.JSONFormat)
	log.L.Logger.SetOutput(&buf)
	defer func() {
		log.SetFormat(log.TextFormat)
		log.L.Logger.SetOutput(os.Stderr)
	}()
	_, c, _ := testAgent(t)
	caller := agentapi.Caller{Runtime: agentapi.RuntimeRunc, PID: os.Getpid()}
	if _, err := c.Create(context.Background(), agentapi.CreateRequest{Caller: caller, ID: "sb-json", Bundle: sandboxBundle(t, "agents", "json")}); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if entry["container"] == "sb-json" {
			found = true
			if entry["call"] != agentapi.MethodCreate || entry["runtime"] != agentapi.RuntimeRunc || entry["shim_pid"] != float64(os.Getpid()) {
				t.Errorf("log line of the call lacks its fields: %v", entry)
			}
		}
	}
	if !found {
		t.Errorf("no log line names the refused sandbox:\n%s", buf.String())
	}
}
