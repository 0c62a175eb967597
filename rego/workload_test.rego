package bulkhead.workload_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.workload

rules(doc) := r if {
	r := {f.rule | some f in workload.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

privileged(doc) := json.patch(doc, [{"op": "add", "path": "/pod/containers/0/privileged", "value": true}])

device(doc, path) := json.patch(doc, [{"op": "add", "path": "/pod/containers/0/devices", "value": [path]}])

test_workload_table if {
	cases := [
		[fx.agent, set()],
		[privileged(fx.agent), {"workload.privileged"}],
		[privileged(fx.research), {"workload.privileged"}],
		[privileged(fx.platform), set()],
		[object.union(fx.agent, {"pod": {"host_network": true}}), {"workload.host_namespace"}],
		[object.union(fx.research, {"pod": {"host_pid": true}}), {"workload.host_namespace"}],
		[object.union(fx.research, {"pod": {"host_ipc": true}}), {"workload.host_namespace"}],
		[object.union(fx.platform, {"pod": {"host_network": true}}), set()],
		[device(fx.agent, "/dev/kvm"), {"workload.device_forbidden"}],
		[device(fx.research, "/dev/nvidia0"), {"workload.device_forbidden"}],
		[device(fx.platform, "/dev/nvidia0"), set()],
		[device(fx.agent, "/dev/infiniband/uverbs0"), set()],
	]
	every c in cases {
		rules(c[0]) == c[1]
	}
}

test_unpinned_image_warns_only_where_required if {
	unpinned := json.patch(fx.agent, [{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:1.36"}])
	rules(unpinned) == {"workload.image_unpinned"}
	some f in workload.findings with input as unpinned with data.bulkhead.tenants as fx.tenants
	f.enforcement == "warn"
	research := json.patch(fx.research, [{"op": "replace", "path": "/pod/containers/0/image", "value": "busybox:1.36"}])
	rules(research) == set()
}

test_message_names_container_and_tier if {
	some f in workload.findings with input as privileged(fx.agent) with data.bulkhead.tenants as fx.tenants
	f.message == `container "main" is privileged; tier "untrusted" forbids privileged containers`
}

# A pod without containers (or without the field) has nothing to judge in
# them; its host namespaces are still judged.
test_pod_without_containers if {
	bare := json.remove(fx.agent, ["/pod/containers"])
	rules(bare) == set()
	rules(object.union(bare, {"pod": {"host_pid": true}})) == {"workload.host_namespace"}
}
