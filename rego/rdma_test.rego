package bulkhead.rdma_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.rdma

with_rdma(doc) := object.union(doc, {"request": {"rdma": true}})

rules(doc) := r if {
	r := {f.rule | some f in rdma.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

answer(doc) := a if {
	a := rdma.decision with input as doc with data.bulkhead.tenants as fx.tenants
}

test_rdma_table if {
	cases := [
		[fx.agent, set(), "deny"],
		[with_rdma(fx.agent), {"rdma.forbidden"}, "deny"],
		[with_rdma(fx.research), set(), "own-vf"],
		[with_rdma(fx.platform), set(), "own-vf"],
		[fx.research, set(), "deny"],
	]
	every c in cases {
		rules(c[0]) == c[1]
		answer(c[0]) == c[2]
	}
}

test_raw_infiniband_device_refused_in_every_tier if {
	every doc in [fx.agent, fx.research, fx.platform] {
		dev := json.patch(doc, [{"op": "add", "path": "/pod/containers/0/devices", "value": ["/dev/infiniband/uverbs0"]}])
		rules(dev) == {"rdma.device_forbidden"}
	}
}
