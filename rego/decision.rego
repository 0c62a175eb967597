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

# reason_precedence ranks the families of rule ids (a rule id's part before
# its first dot) in decision.reasons, so that the first deny reason is the
# one that decided: each family is judged in the light of those before it.
#   input     the document is not one this policy can judge at all;
#   tenant,   who the pod is: without a tenant there is no tier, and every
#   identity  rule that follows from the tier fires against the lockdown;
#   runtime   where the pod runs (gVisor or runc) bounds what it may touch;
#   workload  what its containers ask of the host;
#   rdma, gpu the devices it requests;
#   quota     whether the tenant has room for what it requests;
#   network   the tier's and the tenant's network settings.
# A family not listed here (a security team's own) follows these. Every
# reader shows reasons in this order: bulkhead policy eval, the webhook's
# refusals and the node's (docs/policy.md, "Decision").
reason_precedence := {
	"input": 0, "tenant": 1, "identity": 2, "runtime": 3, "workload": 4,
	"rdma": 5, "gpu": 6, "quota": 7, "network": 8,
}

rank_of_rule(rule) := object.get(reason_precedence, substring(rule, 0, indexof(rule, ".")), count(reason_precedence))

# Deny (and any unknown mode, which counts as deny) before warn before audit.
rank_of_mode := {"warn": 1, "audit": 2}

# rows sort the reasons: by enforcement, then by family as above, then by
# rule id, then by message. Lookups with object.get rather than functions
# with else: the compiled plan then pays a few steps per finding, and
# hardly an allocation.
rows := {[object.get(rank_of_mode, m, 0), rank_of_rule(f.rule), f.rule, f.message, m] |
	some f in findings
	m := mode(f)
}

reasons := [{"rule": row[2], "message": row[3], "enforcement": row[4]} | some row in sort(rows)]

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
