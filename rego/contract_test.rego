package bulkhead.contract_test

import data.bulkhead.contract
import data.bulkhead.fixtures_test as fx

test_v1_sandbox_container_and_admission_accepted if {
	count(contract.findings) == 0 with input as fx.agent
	count(contract.findings) == 0 with input as object.union(fx.agent, {"kind": "admission"})
	count(contract.findings) == 0 with input as fx.per_container(fx.agent)
}

test_only_kind_container_is_per_container if {
	contract.per_container with input as fx.per_container(fx.agent)
	not contract.per_container with input as fx.agent
	not contract.per_container with input as object.union(fx.agent, {"kind": "admission"})
}

test_wrong_version_refused if {
	some f in contract.findings with input as object.union(fx.agent, {"version": "v2"})
	f.rule == "input.version_unsupported"
}

test_missing_version_refused if {
	some f in contract.findings with input as object.remove(fx.agent, ["version"])
	f.rule == "input.version_unsupported"
}

test_unknown_kind_refused if {
	some f in contract.findings with input as object.union(fx.agent, {"kind": "exec"})
	f.rule == "input.kind_invalid"
}

test_missing_kind_refused if {
	some f in contract.findings with input as object.remove(fx.agent, ["kind"])
	f.rule == "input.kind_invalid"
	f.message == `input.kind is ""; want "sandbox", "container" or "admission"`
}
