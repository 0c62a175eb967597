# METADATA
# description: |
#   data.bulkhead.decision: the one document Bulkhead reads (contract v1,
#   docs/policy.md). Every rule package adds findings; each finding becomes a
#   reason whose enforcement (deny, warn, audit) comes from
#   data.bulkhead.enforcement, else the rule's own default, else deny.
package bulkhead

import data.bulkhead.contract
import data.bulkhead.dra
import data.bulkhead.gpu
import data.bulkhead.identity
import data.bulkhead.network
import data.bulkhead.quota
import data.bulkhead.rdma
import data.bulkhead.runtime
import data.bulkhead.workload

findings := union({
	contract.findings, identity.findings, runtime.findings, gpu.findings,
	quota.findings, workload.findings, network.findings, rdma.findings,
	dra.findings,
})

mode(f) := m if {
	m := data.bulkhead.enforcement[f.rule]
} else := m if {
	m := f.enforcement
} else := "deny"

# rows sort the reasons by rule id, then message.
rows := {[f.rule, f.message, mode(f)] | some f in findings}

reasons := [{"rule": row[0], "message": row[1], "enforcement": row[2]} | some row in sort(rows)]

# An enforcement mode outside deny/warn/audit counts as deny: fail closed.
denied := [r | some r in reasons; not r.enforcement in {"warn", "audit"}]

allow := count(denied) == 0

warnings := [sprintf("%s: %s", [r.rule, r.message]) | some r in reasons; r.enforcement == "warn"]

decision := {
	"allow": allow,
	"reasons": reasons,
	"tenant": identity.tenant_label,
	"tier": identity.tier_label,
	"runtime": runtime.selected,
	"gpu": gpu.decision,
	"network": network.decision,
	"rdma": rdma.decision,
	"warnings": warnings,
}
