package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// mains are the subcommands' entry points with their output redirectable.
var mains = map[string]func(args []string, stdout, stderr io.Writer) int{
	"mig":    migMain,
	"netpol": netpolMain,
	"node":   nodeMain,
	"policy": policyMain,
}

// TestCLIHelpAndUsage: --help exits 0 everywhere, usage errors exit 2, and
// neither opens anything (the node's config path here does not exist).
func TestCLIHelpAndUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string // in stdout or stderr
	}{
		{[]string{"mig", "--help"}, 0, "usage: bulkhead mig"},
		{[]string{"mig", "plan", "--help"}, 0, "-request"},
		{[]string{"mig", "simulate", "-h"}, 0, "-arrivals"},
		{[]string{"mig"}, 2, "usage: bulkhead mig"},
		{[]string{"mig", "bogus"}, 2, `unknown subcommand "bogus"`},
		{[]string{"netpol", "--help"}, 0, "usage: bulkhead netpol"},
		{[]string{"netpol", "help"}, 0, "usage: bulkhead netpol"},
		{[]string{"netpol"}, 2, "usage: bulkhead netpol"},
		{[]string{"netpol", "frobnicate"}, 2, "usage: bulkhead netpol"},
		{[]string{"netpol", "stats"}, 2, "usage: bulkhead netpol"},
		{[]string{"node", "--help"}, 0, "usage: bulkhead node"},
		{[]string{"node", "-h"}, 0, "usage: bulkhead node"},
		{[]string{"node", "help"}, 0, "usage: bulkhead node"},
		{[]string{"node", "status", "--help"}, 0, "-config"},
		{[]string{"node"}, 2, "usage: bulkhead node"},
		{[]string{"node", "bogus"}, 2, `unknown subcommand "bogus"`},
		{[]string{"node", "status", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"node", "status", "--bogus"}, 2, "flag provided but not defined: -bogus"},
		{[]string{"policy", "--help"}, 0, "bulkhead policy eval"},
		{[]string{"policy", "eval", "--help"}, 0, "-bundle"},
		{[]string{"policy", "verify", "-h"}, 0, "-key-id"},
		{[]string{"policy", "test", "--help"}, 0, "-threshold"},
		{[]string{"policy"}, 2, "usage:"},
		{[]string{"policy", "bogus"}, 2, `unknown subcommand "bogus"`},
		{[]string{"policy", "eval"}, 2, "--bundle and --input are required"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Setenv(config.PathEnv, filepath.Join(t.TempDir(), "absent.toml"))
			var stdout, stderr bytes.Buffer
			code := mains[tc.args[0]](tc.args[1:], &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout.String(), stderr.String(), tc.code, tc.want)
			}
		})
	}
}

// TestCLIErrorsNameFlags: refusals name the flag or config key the user
// wrote, never a Go field, and invalid values are refused rather than
// replaced by defaults.
func TestCLIErrorsNameFlags(t *testing.T) {
	input := writeJSON(t, agentInput("bulkhead"))
	for _, tc := range []struct {
		args    []string
		code    int
		want    string
		notWant string
	}{
		{[]string{"policy", "eval", "--bundle", "/nonexistent", "--input", input}, exitError, "--bundle", "Options."},
		{[]string{"policy", "eval", "--bundle", "../../rego", "--input", input, "--evaluator", "fast"}, exitUsage, `--evaluator "fast": want plan or topdown`, "Options."},
		{[]string{"policy", "eval", "--bundle", "../../rego", "--input", input, "--key", "x", "--key-id", "x"}, exitUsage, "--key-id and --scope are required with --key", "Options."},
		{[]string{"policy", "eval", "--bundle", "../../rego", "--input", input, "--key", "x", "--key-id", "x", "--scope", "s"}, exitError, "--key: ", "Options."},
		{[]string{"policy", "eval", "--bundle", "../../rego", "--input", input, "--data", "/nonexistent.json"}, exitError, "--data", "Options."},
		{[]string{"mig", "simulate", "--gpu", "h200", "--synthetic", "1", "--load", "0"}, 2, "--load 0: must be a number above 0", ""},
		{[]string{"mig", "simulate", "--gpu", "h200", "--synthetic", "1", "--load", "-1"}, 2, "--load -1", ""},
		{[]string{"mig", "simulate", "--gpu", "h200", "--synthetic", "1", "--arrivals", "0"}, 2, "--arrivals 0: must be 1..100000", ""},
		{[]string{"mig", "simulate", "--gpu", "h200", "--synthetic", "1", "--isolated", "2"}, 2, "--isolated 2", ""},
		{[]string{"node", "status", "--config", "/nonexistent/bulkhead.toml"}, 1, "--config: config /nonexistent/bulkhead.toml", ""},
		{[]string{"netpol", "-pin-dir", "/nonexistent/bulkhead", "endpoints"}, 1, "no fence on this node: nothing pinned in /nonexistent/bulkhead (-pin-dir)", ""},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := mains[tc.args[0]](tc.args[1:], &stdout, &stderr)
			msg := stderr.String()
			if code != tc.code || !strings.Contains(msg, tc.want) || (tc.notWant != "" && strings.Contains(msg, tc.notWant)) {
				t.Fatalf("exit %d, stderr %q; want exit %d, %q and not %q", code, msg, tc.code, tc.want, tc.notWant)
			}
		})
	}
}

// TestNodeStatusReadOnly: status on a node that has neither ledger nor fence
// says so in one line each and creates nothing.
func TestNodeStatusReadOnly(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "node") // does not exist: status must not create it
	cfg := filepath.Join(dir, "bulkhead.toml")
	// The agent's socket is the test's own: none answers there.
	doc := fmt.Sprintf("state_dir = %q\nledger_path = %q\n[agent]\nsocket = %q\n[pipeline]\nenabled = false\n[netpol]\nenabled = true\npin_dir = %q\nlock_path = %q\n",
		filepath.Join(node, "state"), filepath.Join(node, "ledger.db"), filepath.Join(dir, "agent.sock"), filepath.Join(node, "pins"), filepath.Join(node, "netpol.lock"))
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := nodeMain([]string{"status", "--config", cfg}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{
		"FENCE: enabled, none pinned yet at " + filepath.Join(node, "pins") + " (netpol.pin_dir)",
		"LEDGER: none at " + filepath.Join(node, "ledger.db") + " (ledger_path): no Bulkhead pod has run on this node",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, stdout.String())
		}
	}
	if _, err := os.Stat(node); !os.IsNotExist(err) {
		t.Fatalf("status created %s (%v)", node, err)
	}
}

// TestNodeStatusNeedsNoPolicyKey: status never loads the policy, so a
// configuration whose bundle has no key_file (or whose runsc section the
// shim would refuse) does not stop it; a key status does read still does.
func TestNodeStatusNeedsNoPolicyKey(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra string
		code  int
		want  string
	}{
		{"bundle without key_file", "[policy]\nbundle = \"/etc/bulkhead/bundle.tar.gz\"\n", 0, "LEDGER: none at"},
		{"pipeline on, no bundle", "[pipeline]\nenabled = true\n", 0, "LEDGER: none at"},
		{"runsc platform the shim refuses", "[runsc]\nplatform = \"xen\"\n", 0, "LEDGER: none at"},
		{"bad mig backend", "[mig]\nbackend = \"cuda\"\n", 1, `--config: config`},
		{"unknown key", "[policy]\nkey_fil = \"/k\"\n", 1, "unknown key(s) policy.key_fil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			node := filepath.Join(dir, "node")
			cfg := filepath.Join(dir, "bulkhead.toml")
			doc := fmt.Sprintf("state_dir = %q\nledger_path = %q\n%s[netpol]\nenabled = false\n[agent]\nsocket = %q\n",
				filepath.Join(node, "state"), filepath.Join(node, "ledger.db"), tc.extra, filepath.Join(dir, "agent.sock"))
			if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			code := nodeMain([]string{"status", "--config", cfg}, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout.String(), stderr.String(), tc.code, tc.want)
			}
			if _, err := os.Stat(node); !os.IsNotExist(err) {
				t.Fatalf("status created %s (%v)", node, err)
			}
		})
	}
}

func TestPrintStatusTables(t *testing.T) {
	st := &node.Status{
		Fence:   "enabled",
		Tenants: []node.TenantStatus{{Tenant: "agents", Tier: "untrusted", Sandboxes: 2, MemoryBytes: 1 << 30}, {Tenant: "research", Tier: "standard", Sandboxes: 1}},
		Drops: map[string]netpol.Stats{
			"research": {Drops: map[netpol.Reason]uint64{}},
			"agents":   {Drops: map[netpol.Reason]uint64{netpol.Reasons()[3]: 9, netpol.Reasons()[4]: 3}},
		},
	}
	var b bytes.Buffer
	printStatus(&b, st)
	out := b.String()
	for _, want := range []string{
		"TENANT    TIER       SANDBOXES",
		"agents    untrusted  2          0           1024 MiB",
		"  agents    tenant=9 rdma=3\n",
		"  research  none\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\t") || strings.Contains(out, "map[") {
		t.Errorf("status shows raw tabs or Go maps:\n%s", out)
	}
	b.Reset()
	printStatus(&b, &node.Status{Fence: "enabled", LedgerPath: "/l.db"})
	if !strings.Contains(b.String(), "no sandboxes on this node (ledger /l.db)") {
		t.Errorf("empty node: %q", b.String())
	}
}

// TestPolicyEvalDecisiveReasonFirst: without --data no tenant owns the
// namespace, and eval lists that first, before the GPU rules the lockdown
// tier then fails: the bundle's order (rego/decision.rego), not the CLI's.
func TestPolicyEvalDecisiveReasonFirst(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := policyMain([]string{"eval", "--bundle", "../../rego", "--input", "../../rego/examples/input.agent.json"}, &stdout, &stderr)
	if code != exitDeny {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitDeny, stderr.String())
	}
	var d policy.Decision
	if err := json.Unmarshal(stdout.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Reasons) < 2 || d.Reasons[0].Rule != "tenant.unknown_namespace" {
		t.Fatalf("reasons %+v: want tenant.unknown_namespace first of several", d.Reasons)
	}
}
