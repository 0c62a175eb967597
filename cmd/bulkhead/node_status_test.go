package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/runtime/agent"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// nodeConfig writes a node's configuration file whose paths are all under
// dir (none of them created) with extra appended, and returns its path and
// the agent's socket it names.
func nodeConfig(t *testing.T, dir, extra string) (path, socket string) {
	t.Helper()
	node := filepath.Join(dir, "node")
	socket = filepath.Join(dir, "run", "agent.sock")
	doc := fmt.Sprintf("state_dir = %q\nledger_path = %q\nrunsc_root = %q\nrunc_root = %q\n%s[agent]\nsocket = %q\n[netpol]\nenabled = false\n",
		filepath.Join(node, "state"), filepath.Join(node, "ledger.db"), filepath.Join(node, "runsc"), filepath.Join(node, "runc"), extra, socket)
	path = filepath.Join(dir, "bulkhead.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, socket
}

// TestNodeStatusWithoutAgent: with no agent answering at agent.socket,
// status reads the node's files, says so first (text) or in the agent
// section (JSON), and exits 0 on a node whose ledger does not exist yet;
// it fails (exit 1) only when the files cannot be read either.
func TestNodeStatusWithoutAgent(t *testing.T) {
	const notice = "AGENT: not reachable: read-only view of the node's files ("
	for _, tc := range []struct {
		name string
		// socket makes what lies at the agent's socket: nothing, or a
		// socket no one listens on (an agent killed with -9).
		socket func(t *testing.T, path string)
		json   bool
	}{
		{"no socket", func(*testing.T, string) {}, false},
		{"no socket, json", func(*testing.T, string) {}, true},
		{"stale socket", staleSocket, false},
		{"stale socket, json", staleSocket, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, socket := nodeConfig(t, dir, "")
			tc.socket(t, socket)
			args := []string{"status", "--config", cfg}
			if tc.json {
				args = append(args, "--json")
			}
			var stdout, stderr bytes.Buffer
			if code := nodeMain(args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, stderr %q; want 0", code, stderr.String())
			}
			ledger := "none at " + filepath.Join(dir, "node", "ledger.db") + " (ledger_path)"
			if !tc.json {
				first, _, _ := strings.Cut(stdout.String(), "\n")
				if !strings.HasPrefix(first, notice) || !strings.Contains(first, socket) {
					t.Errorf("first line %q, want %q naming %s", first, notice, socket)
				}
				if !strings.Contains(stdout.String(), "LEDGER: "+ledger) {
					t.Errorf("status lacks the ledger's line %q:\n%s", ledger, stdout.String())
				}
			} else {
				var st node.Status
				if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
					t.Fatalf("%v:\n%s", err, stdout.String())
				}
				if st.Agent == nil || st.Agent.Running || st.Agent.Socket != socket || !strings.Contains(st.Agent.ReadOnly, "read-only view of the node's files") {
					t.Errorf("agent section = %+v, want not running, read-only, socket %s", st.Agent, socket)
				}
				if !strings.HasPrefix(st.Ledger, ledger) {
					t.Errorf("ledger = %q, want %q", st.Ledger, ledger)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "node")); !os.IsNotExist(err) {
				t.Errorf("status created the node's directory (%v)", err)
			}
		})
	}
}

// staleSocket leaves a socket at path that no one listens on.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
}

// TestNodeStatusFailsWhenNothingAnswers: no agent and a ledger that cannot
// be read: exit 1, and the error names both.
func TestNodeStatusFailsWhenNothingAnswers(t *testing.T) {
	dir := t.TempDir()
	cfg, socket := nodeConfig(t, dir, "")
	// A directory where the ledger's file should be.
	if err := os.MkdirAll(filepath.Join(dir, "node", "ledger.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := nodeMain([]string{"status", "--config", cfg}, &stdout, &stderr)
	msg := stderr.String()
	if code != 1 || !strings.Contains(msg, "ledger_path") || !strings.Contains(msg, "agent did not answer") || !strings.Contains(msg, socket) {
		t.Fatalf("exit %d, stderr %q; want exit 1 naming ledger_path and the agent at %s", code, msg, socket)
	}
}

// TestNodeStatusAsksTheAgent: with an agent serving the node, status is the
// agent's report: running, the bundle's revision, on the first line.
func TestNodeStatusAsksTheAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent answers root callers only")
	}
	dir := t.TempDir()
	bundle, err := filepath.Abs("../../rego")
	if err != nil {
		t.Fatal(err)
	}
	path, socket := nodeConfig(t, dir, fmt.Sprintf("[policy]\nbundle = %q\ninsecure_skip_verification = true\n", bundle))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := agent.Open(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	l, err := agent.Listen(socket)
	if err != nil {
		cancel()
		a.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"agent line", []string{"status", "--config", path}, fmt.Sprintf("AGENT: running, pid %d, socket %s", os.Getpid(), socket)},
		{"bundle line", []string{"status", "--config", path}, "BUNDLE: revision bulkhead-default-1, loaded "},
		{"json revision", []string{"status", "--json", "--config", path}, `"bundle_revision": "bulkhead-default-1"`},
		{"json running", []string{"status", "--json", "--config", path}, `"running": true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := nodeMain(tc.args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, stderr.String())
			}
			if tc.args[1] != "--json" && !strings.HasPrefix(stdout.String(), "AGENT: running") {
				t.Errorf("first line is not the agent's:\n%s", stdout.String())
			}
			if !strings.Contains(stdout.String(), tc.want) || strings.Contains(stdout.String(), "read-only view") {
				t.Errorf("status lacks %q or says it is read-only:\n%s", tc.want, stdout.String())
			}
		})
	}
}
