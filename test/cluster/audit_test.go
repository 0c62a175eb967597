package cluster

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy/admission"
	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// testAudit runs `bulkhead policy audit` against the running cluster: with
// the tenants every pod was admitted under, the runc tier's trainer pod is
// not listed; with platform moved to the untrusted tier, the revision a
// security team might roll out next, it is, with the rule that refuses it.
// The tenants are signed into the audited bundle, as build.sh signs the
// cluster's: the trusted tier keeps to signed tenants, so --data could not
// carry platform.
func testAudit(ctx context.Context, t *testing.T, c *Cluster) {
	if out, err := c.Kubectl(ctx, "-n", "platform", "get", "pod", "trainer", "-o", "name"); err != nil {
		t.Skipf("no runc-tier pod to audit (the runc subtest did not run): %s", out)
	}
	audit := func(tenants string) (admission.AuditReport, int) {
		t.Helper()
		bundle := t.TempDir()
		if err := policytest.WriteBundle(bundle, filepath.Join(repoRoot(t), "rego"), tenants); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, mustLook(t, "bulkhead"), "policy", "audit", "--json",
			"--bundle", bundle, "--kubeconfig", c.Kubeconfig)
		out, err := cmd.Output()
		code := cmd.ProcessState.ExitCode()
		var rep admission.AuditReport
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			t.Fatalf("bulkhead policy audit: exit %d (%v): %v\n%s", code, err, jerr, out)
		}
		return rep, code
	}
	listed := func(rep admission.AuditReport, ns, pod string) *admission.AuditFinding {
		for i, f := range rep.Findings {
			if f.Namespace == ns && f.Pod == pod {
				return &rep.Findings[i]
			}
		}
		return nil
	}

	now, _ := audit(Tenants)
	if now.Pods == 0 {
		t.Fatalf("the audit judged no pods: %+v", now)
	}
	if f := listed(now, "platform", "trainer"); f != nil {
		t.Errorf("under the tenants it was admitted with, platform/trainer is listed: %+v", *f)
	}
	tighter := strings.Replace(Tenants, `"platform":  {"tier": "trusted"`, `"platform":  {"tier": "untrusted"`, 1)
	if tighter == Tenants {
		t.Fatal("the story's tenants changed: platform is not trusted")
	}
	next, code := audit(tighter)
	f := listed(next, "platform", "trainer")
	if f == nil || f.Tier != "untrusted" || len(f.Reasons) == 0 || code != 3 {
		t.Fatalf("with platform untrusted: exit %d, platform/trainer %+v; want it listed with its rule, exit 3\n%+v", code, f, next)
	}
	t.Logf("$ bulkhead policy audit --bundle <rego, platform untrusted>: %d pods judged, %d refused; platform/trainer: [%s] %s",
		next.Pods, next.Refused, f.Reasons[0].Rule, f.Reasons[0].Message)
}
