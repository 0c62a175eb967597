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
		every path in ["/dev/infiniband/uverbs0", "/dev/infiniband", "/dev/infiniband/rdma_cm"] {
			rules(fx.container(doc, {"devices": [path]})) == {"rdma.device_forbidden"}
		}
	}
}

# A host path of /dev/infiniband or under it (hostPath "/" with subPath
# "dev/infiniband" resolves to it) is a raw RDMA device too, in every tier.
test_infiniband_host_path_refused_in_every_tier if {
	every doc in [fx.agent, fx.research, fx.platform] {
		every path in ["/dev/infiniband", "/dev/infiniband/uverbs0"] {
			rules(fx.mount(doc, path, true)) == {"rdma.device_forbidden"}
			rules(fx.per_container(fx.mount(doc, path, false))) == {"rdma.device_forbidden"}
		}
	}
}

test_near_infiniband_paths_are_not_rdma if {
	every path in ["/dev/infinibandx", "/dev/infini", "/dev", "/"] {
		rules(fx.container(fx.platform, {"devices": [path]})) == set()
		rules(fx.mount(fx.platform, path, true)) == set()
	}
}

test_device_message_names_container_and_path if {
	ms := {f.message | some f in rdma.findings} with input as fx.mount(fx.agent, "/dev/infiniband", true) with data.bulkhead.tenants as fx.tenants
	ms == {`container "main" mounts host path /dev/infiniband; RDMA devices come only through bulkhead.dev/rdma as the tenant's own VF`}
	debug := json.patch(fx.agent, [{"op": "add", "path": "/pod/containers/-", "value": {"name": "debug", "ephemeral": true, "devices": ["/dev/infiniband/uverbs0"]}}])
	ds := {f.message | some f in rdma.findings} with input as debug with data.bulkhead.tenants as fx.tenants
	ds == {`ephemeral container "debug" asks for /dev/infiniband/uverbs0 directly; RDMA devices come only through bulkhead.dev/rdma as the tenant's own VF`}
}
