package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/policy/admission"
)

// Usage errors of policy audit are refused before any cluster is reached.
func TestPolicyAuditUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.kubeconfig")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"policy", "audit", "--help"}, 0, "-exclude-namespaces"},
		{[]string{"policy", "audit"}, 2, "--bundle is required"},
		{[]string{"policy", "audit", "--bundle", "b", "--key-id", "k"}, 2, "need --key"},
		{[]string{"policy", "audit", "--bundle", "b", "--key", "k.pem"}, 2, "required with --key"},
		{[]string{"policy", "audit", "--bundle", "b", "--evaluator", "fast"}, 2, `--evaluator "fast"`},
		{[]string{"policy", "audit", "--bundle", "b", "--timeout", "0s"}, 2, "--timeout 0s: must be above 0"},
		{[]string{"policy", "audit", "--bundle", "b", "--kubeconfig", missing}, 1, "--kubeconfig"},
	} {
		t.Run(strings.Join(tc.args[2:], " "), func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			if code != tc.code || !strings.Contains(stdout+stderr, tc.want) {
				t.Errorf("exit %d, want %d with %q\nstdout: %s\nstderr: %s", code, tc.code, tc.want, stdout, stderr)
			}
		})
	}
}

// The report names each refused pod once with every rule that refuses it.
func TestPrintAudit(t *testing.T) {
	var out bytes.Buffer
	printAudit(&out, admission.AuditReport{Revision: "r2", Pods: 4, Refused: 1, Errors: 1, Findings: []admission.AuditFinding{
		{Namespace: "platform", Pod: "on-runc", Tenant: "platform", Tier: "untrusted", Reasons: []policy.Reason{
			{Rule: "runtime.untrusted_requires_gvisor", Message: "untrusted pods run in gVisor"},
			{Rule: "gpu.mig_in_gvisor", Message: "no MIG in gVisor"},
		}},
		{Namespace: "agents", Pod: "odd", Error: "bad annotation"},
	}})
	for _, want := range []string{
		"bundle revision r2: 4 running pods judged, 1 would be refused, 1 could not be judged",
		"platform   on-runc  platform  untrusted  runtime.untrusted_requires_gvisor",
		"gpu.mig_in_gvisor", "not judged: bad annotation",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
