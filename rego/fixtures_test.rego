# Shared inputs and tenants for the tests of the default bundle.
package bulkhead.fixtures_test

tenants := {
	"agents": {
		"tier": "untrusted",
		"namespaces": ["agents"],
		"egress_cidrs": ["10.96.0.0/12"],
		"quota": {"sandboxes": 3, "gpu_slices": 4, "memory": "8Gi"},
	},
	"research": {
		"tier": "standard",
		"namespaces": ["research"],
		"quota": {"sandboxes": 50, "gpu_slices": 28, "memory": "512Gi"},
	},
	"platform": {"tier": "trusted", "namespaces": ["platform"]},
}

node := {"name": "node-a", "gpus": [
	{"index": 0, "model": "NVIDIA H200", "mig_enabled": true, "free_slices": 7},
	{"index": 1, "model": "NVIDIA H200", "mig_enabled": false, "free_slices": 7},
]}

# pod(ns, handler) is a minimal, allowed sandbox input for namespace ns: one
# container with a 1Gi memory limit, the pod's total.
pod(ns, handler) := {
	"version": "v1",
	"kind": "sandbox",
	"namespace": ns,
	"pod": {
		"name": "p",
		"runtime_handler": handler,
		"containers": [{"name": "main", "image": "registry.local/app@sha256:00", "memory_bytes": 1073741824}],
	},
	"request": {"memory_bytes": 1073741824},
	"usage": {"sandboxes": 0, "gpu_slices": 0, "memory_bytes": 0},
	"node": node,
}

agent := pod("agents", "bulkhead")

research := pod("research", "bulkhead")

platform := pod("platform", "runc")

with_gpu(doc, profile, n) := object.union(doc, {"request": {"gpu": {"profile": profile, "count": n}}})

# per_container(doc) is doc as a node's check of one container in a sandbox
# it already admitted: kind container, an empty request and zero usage.
per_container(doc) := json.patch(doc, [
	{"op": "replace", "path": "/kind", "value": "container"},
	{"op": "add", "path": "/request", "value": {}},
	{"op": "add", "path": "/usage", "value": {"sandboxes": 0, "gpu_slices": 0, "memory_bytes": 0}},
])

# container(doc, fields) merges fields into doc's first container.
container(doc, fields) := json.patch(doc, [{"op": "replace", "path": "/pod/containers/0", "value": object.union(doc.pod.containers[0], fields)}])

# mount(doc, host_path, read_only) binds host_path into doc's first container.
mount(doc, host_path, read_only) := container(doc, {"mounts": [{"host_path": host_path, "path": "/host", "read_only": read_only}]})

# volume(doc, name, host_path) declares a hostPath volume, mounted nowhere.
volume(doc, name, host_path) := object.union(doc, {"pod": {"volumes": [{"name": name, "type": "hostPath", "host_path": host_path}]}})

# rules(d) is the set of rule ids of decision d.
rules(d) := {r.rule | some r in d.reasons}
