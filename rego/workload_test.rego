package bulkhead.workload_test

import data.bulkhead.fixtures_test as fx
import data.bulkhead.workload

rules(doc) := r if {
	r := {f.rule | some f in workload.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

messages(doc) := m if {
	m := {f.message | some f in workload.findings} with input as doc with data.bulkhead.tenants as fx.tenants
}

# standard_with(fields) is the default standard tier with fields changed.
standard_with(fields) := object.union(data.bulkhead.tiers.standard, fields)

rules_in_standard(doc, fields) := r if {
	r := {f.rule | some f in workload.findings} with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.tiers.standard as standard_with(fields)
}

messages_in_standard(doc, fields) := m if {
	m := {f.message | some f in workload.findings} with input as doc
		with data.bulkhead.tenants as fx.tenants
		with data.bulkhead.tiers.standard as standard_with(fields)
}

privileged(doc) := fx.container(doc, {"privileged": true})

device(doc, path) := fx.container(doc, {"devices": [path]})

cdi(doc, key, value) := object.union(doc, {"pod": {"annotations": {key: value}}})

caps(doc, names) := fx.container(doc, {"added_capabilities": names})

sysctl(doc, name) := object.union(doc, {"pod": {"sysctls": {name: "1"}}})

# ephemeral(doc, fields) adds an ephemeral container with fields to doc.
ephemeral(doc, fields) := json.patch(doc, [{"op": "add", "path": "/pod/containers/-", "value": object.union({"name": "debug", "image": "registry.local/debug@sha256:11", "ephemeral": true}, fields)}])

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
		# CDI devices asked for by annotation: only where every device is allowed.
		[cdi(fx.agent, "cdi.k8s.io/gpu", "bulkhead.dev/gpu=GPU-1"), {"workload.cdi_device"}],
		[cdi(fx.research, "cdi.k8s.io/x", "vendor.com/device=a,vendor.com/device=b"), {"workload.cdi_device"}],
		[cdi(fx.platform, "cdi.k8s.io/gpu", "bulkhead.dev/gpu=GPU-1"), set()],
		[cdi(fx.agent, "example.com/cdi.k8s.io", "x"), set()],
		[cdi(fx.agent, "cdi.k8s.io.example.com/x", "x"), set()],
		[device(fx.research, "/dev/nvidia0"), {"workload.device_forbidden"}],
		[device(fx.platform, "/dev/nvidia0"), set()],
		# RDMA devices are bulkhead.rdma's to judge.
		[device(fx.agent, "/dev/infiniband/uverbs0"), set()],
		[device(fx.agent, "/dev/infiniband"), set()],
		[device(fx.platform, "/dev/infiniband"), set()],
		# "/dev/**" matches /dev itself, and nothing beside it.
		[device(fx.platform, "/dev"), set()],
		[device(fx.platform, "/devices/x"), {"workload.device_forbidden"}],
		[device(fx.platform, "/sys/kernel"), {"workload.device_forbidden"}],
		# A device path that is not clean and absolute is refused in every tier.
		[device(fx.platform, "//dev/kvm"), {"workload.device_forbidden"}],
		[device(fx.platform, "/dev/../etc/shadow"), {"workload.device_forbidden"}],
		[device(fx.platform, "dev/kvm"), {"workload.device_forbidden"}],
		[device(fx.agent, "//dev/infiniband/uverbs0"), {"workload.device_forbidden"}],
	]
	every c in cases {
		rules(c[0]) == c[1]
	}
}

# Every host path the security review found admitted for an untrusted pod,
# as a mount and as a volume mounted nowhere.
review_host_paths := ["/", "/var/lib/kubelet/pods", "/etc/bulkhead", "/var/lib/bulkhead", "/dev/infiniband", "/dev/infiniband/uverbs0"]

test_host_paths_refused_below_trusted if {
	every doc in [fx.agent, fx.research] {
		every path in review_host_paths {
			rules(fx.mount(doc, path, false)) == {"workload.host_path"}
			rules(fx.mount(doc, path, true)) == {"workload.host_path"}
			rules(fx.volume(doc, "host", path)) == {"workload.host_path"}
		}
	}
}

test_host_paths_allowed_in_trusted if {
	every path in review_host_paths {
		rules(fx.mount(fx.platform, path, false)) == set()
		rules(fx.volume(fx.platform, "host", path)) == set()
	}
}

# A host path that is not clean and absolute is refused in every tier, the
# trusted one (which allows "/") included.
test_unclean_host_paths_refused_in_every_tier if {
	unclean := [
		"//dev/infiniband/uverbs0", "/dev//infiniband", "/var/lib/./kubelet", "/data/../etc",
		"/etc/", "/etc/.", "/etc/..", "/..", "etc/bulkhead", "", "./x",
	]
	every doc in [fx.agent, fx.research, fx.platform] {
		every path in unclean {
			rules(fx.mount(doc, path, true)) == {"workload.host_path"}
			rules(fx.volume(doc, "host", path)) == {"workload.host_path"}
		}
	}
}

test_clean_path if {
	every p in ["/", "/a", "/a/b", "/.a", "/..a", "/a..", "/a.b/c", "/...", "/a/.x/..y"] {
		workload.clean_path(p)
	}
	every p in ["", "a", "//", "/a/", "/a//b", "/./a", "/a/.", "/a/..", "/../a", 7] {
		not workload.clean_path(p)
	}
}

test_host_path_table if {
	data_ro := {"allowed_host_paths": ["/data", "/models"], "host_paths_writable": false}
	data_rw := {"allowed_host_paths": ["/data"], "host_paths_writable": true}
	cases := [
		# [input, tier fields, rule ids]
		[fx.mount(fx.research, "/data", true), data_ro, set()],
		[fx.mount(fx.research, "/data/set/1", true), data_ro, set()],
		[fx.mount(fx.research, "/models", true), data_ro, set()],
		[fx.mount(fx.research, "/database", true), data_ro, {"workload.host_path"}],
		[fx.mount(fx.research, "/", true), data_ro, {"workload.host_path"}],
		[fx.mount(fx.research, "/data/set", false), data_ro, {"workload.host_path"}],
		[fx.mount(fx.research, "/data/set", false), data_rw, set()],
		[fx.mount(fx.research, "/data/../etc", true), data_ro, {"workload.host_path"}],
		[fx.volume(fx.research, "d", "/data/set"), data_ro, set()],
		[fx.volume(fx.research, "e", "/etc"), data_ro, {"workload.host_path"}],
		# "/" allows every clean path, read-only unless writable.
		[fx.mount(fx.research, "/etc", true), {"allowed_host_paths": ["/"]}, set()],
		[fx.mount(fx.research, "/etc", false), {"allowed_host_paths": ["/"]}, {"workload.host_path"}],
		# A prefix written unclean allows nothing.
		[fx.mount(fx.research, "/data/x", true), {"allowed_host_paths": ["/data/"]}, {"workload.host_path"}],
	]
	every c in cases {
		rules_in_standard(c[0], c[1]) == c[2]
	}
}

test_volumes_without_host_path_are_not_judged if {
	doc := object.union(fx.agent, {"pod": {"volumes": [
		{"name": "scratch", "type": "emptyDir"},
		{"name": "token", "type": "secret"},
	]}})
	rules(doc) == set()
}

# A hostPath volume without its path, or another volume naming a host path,
# is judged too.
test_odd_volumes_judged if {
	no_path := object.union(fx.platform, {"pod": {"volumes": [{"name": "h", "type": "hostPath"}]}})
	messages(no_path) == {`volume "h" is host path "", which is not a clean absolute path; tier "trusted" allows any clean absolute host path`}
	other := object.union(fx.agent, {"pod": {"volumes": [{"name": "x", "type": "secret", "host_path": "/etc"}]}})
	messages(other) == {`volume "x" is host path "/etc"; tier "untrusted" allows no host paths`}
}

test_host_path_messages if {
	messages(fx.mount(fx.agent, "/", false)) == {`container "main" mounts host path "/" (read-write); tier "untrusted" allows no host paths`}
	messages(fx.mount(fx.agent, "/etc/bulkhead", true)) == {`container "main" mounts host path "/etc/bulkhead" (read-only); tier "untrusted" allows no host paths`}
	messages(fx.volume(fx.agent, "root", "/")) == {`volume "root" is host path "/"; tier "untrusted" allows no host paths`}
	messages(fx.mount(fx.platform, "//dev/infiniband/uverbs0", false)) == {`container "main" mounts host path "//dev/infiniband/uverbs0" (read-write), which is not a clean absolute path; tier "trusted" allows any clean absolute host path`}
	data_ro := {"allowed_host_paths": ["/data"], "host_paths_writable": false}
	messages_in_standard(fx.mount(fx.research, "/data/x", false), data_ro) == {`container "main" mounts host path "/data/x" read-write; tier "standard" allows only host paths equal to or under one of ["/data"], read-only`}
	messages_in_standard(fx.mount(fx.research, "/etc", true), data_ro) == {`container "main" mounts host path "/etc" (read-only); tier "standard" allows only host paths equal to or under one of ["/data"], read-only`}
	messages_in_standard(fx.mount(fx.research, "/etc", false), {"allowed_host_paths": ["/"]}) == {`container "main" mounts host path "/etc" read-write; tier "standard" allows any clean absolute host path, read-only`}
	messages_in_standard(fx.mount(fx.research, "/etc/", true), {"allowed_host_paths": ["/data"], "host_paths_writable": true}) == {`container "main" mounts host path "/etc/" (read-only), which is not a clean absolute path; tier "standard" allows only host paths equal to or under one of ["/data"]`}
}

test_capability_table if {
	cases := [
		[caps(fx.agent, ["SYS_ADMIN"]), {"workload.capability"}],
		[caps(fx.agent, ["NET_ADMIN"]), {"workload.capability"}],
		[caps(fx.agent, ["NET_RAW"]), {"workload.capability"}],
		[caps(fx.research, ["SYS_ADMIN", "NET_ADMIN", "NET_RAW"]), {"workload.capability"}],
		[caps(fx.agent, ["ALL"]), {"workload.capability"}],
		[caps(fx.agent, ["all"]), {"workload.capability"}],
		[caps(fx.agent, ["CAP_SYS_ADMIN"]), {"workload.capability"}],
		[caps(fx.agent, ["cap_sys_ptrace"]), {"workload.capability"}],
		[caps(fx.agent, [7]), {"workload.capability"}],
		# Kubernetes' baseline set, in any spelling.
		[caps(fx.agent, ["CHOWN", "NET_BIND_SERVICE", "SYS_CHROOT"]), set()],
		[caps(fx.agent, ["cap_chown", "CAP_KILL", "Setuid"]), set()],
		[caps(fx.platform, ["SYS_ADMIN", "NET_ADMIN", "NET_RAW", "ALL", "cap_bpf"]), set()],
	]
	every c in cases {
		rules(c[0]) == c[1]
	}
}

test_capability_messages if {
	messages(caps(fx.agent, ["cap_sys_admin", "NET_RAW", "CHOWN"])) == {
		`container "main" adds capability SYS_ADMIN; tier "untrusted" allows adding only ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]`,
		`container "main" adds capability NET_RAW; tier "untrusted" allows adding only ["AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"]`,
	}
}

# The tier's list is compared the same way: any case, with or without CAP_.
test_tier_capabilities_normalised if {
	rules_in_standard(caps(fx.research, ["SYS_ADMIN"]), {"allowed_capabilities": ["cap_sys_admin"]}) == set()
	rules_in_standard(caps(fx.research, ["NET_ADMIN"]), {"allowed_capabilities": ["cap_sys_admin"]}) == {"workload.capability"}
	rules_in_standard(caps(fx.research, ["ALL"]), {"allowed_capabilities": ["all"]}) == set()
	rules_in_standard(caps(fx.research, ["CHOWN"]), {"allowed_capabilities": []}) == {"workload.capability"}
}

test_host_port_table if {
	ports := {"host_ports": [8080, 9090]}
	rules(fx.container(fx.agent, ports)) == {"workload.host_port"}
	rules(fx.container(fx.research, ports)) == {"workload.host_port"}
	rules(fx.container(fx.platform, ports)) == set()
	rules(fx.container(fx.agent, {"host_ports": []})) == set()
	messages(fx.container(fx.agent, ports)) == {
		`container "main" binds host port 8080; tier "untrusted" forbids host ports`,
		`container "main" binds host port 9090; tier "untrusted" forbids host ports`,
	}
}

test_sysctl_table if {
	cases := [
		[sysctl(fx.agent, "kernel.msgmax"), {"workload.sysctl"}],
		[sysctl(fx.research, "net.core.somaxconn"), {"workload.sysctl"}],
		[sysctl(fx.research, "kernel.shm_rmid_forced"), set()],
		[sysctl(fx.agent, "net.ipv4.ip_unprivileged_port_start"), set()],
		[sysctl(fx.agent, "net.ipv4.tcp_keepalive_probes"), set()],
		# The slash spelling is not in the list: refused, never widened.
		[sysctl(fx.agent, "net/ipv4/tcp_syncookies"), {"workload.sysctl"}],
		[sysctl(fx.platform, "kernel.msgmax"), set()],
	]
	every c in cases {
		rules(c[0]) == c[1]
	}
	some m in messages(sysctl(fx.agent, "kernel.msgmax"))
	startswith(m, `pod sets sysctl kernel.msgmax="1"; tier "untrusted" allows only ["kernel.shm_rmid_forced", `)
}

test_unconfined_table if {
	cases := [
		[fx.container(fx.agent, {"seccomp_profile": "Unconfined"}), {"workload.unconfined"}],
		[fx.container(fx.agent, {"apparmor_profile": "Unconfined"}), {"workload.unconfined"}],
		[fx.container(fx.research, {"seccomp_profile": "unconfined"}), {"workload.unconfined"}],
		[fx.container(fx.agent, {"seccomp_profile": "RuntimeDefault", "apparmor_profile": "Localhost"}), set()],
		[fx.container(fx.agent, {"seccomp_profile": 1}), set()],
		[fx.container(fx.platform, {"seccomp_profile": "Unconfined", "apparmor_profile": "Unconfined"}), set()],
	]
	every c in cases {
		rules(c[0]) == c[1]
	}
	messages(fx.container(fx.agent, {"seccomp_profile": "Unconfined", "apparmor_profile": "Unconfined"})) == {
		`container "main" runs with seccomp profile Unconfined; tier "untrusted" forbids Unconfined profiles`,
		`container "main" runs with AppArmor profile Unconfined; tier "untrusted" forbids Unconfined profiles`,
	}
}

# Ephemeral (debug) containers are judged like any other.
test_ephemeral_containers_judged_alike if {
	rules(ephemeral(fx.agent, {"privileged": true})) == {"workload.privileged"}
	messages(ephemeral(fx.agent, {"privileged": true})) == {`ephemeral container "debug" is privileged; tier "untrusted" forbids privileged containers`}
	rules(ephemeral(fx.agent, {"mounts": [{"host_path": "/", "path": "/host"}]})) == {"workload.host_path"}
	rules(ephemeral(fx.agent, {"added_capabilities": ["SYS_PTRACE"]})) == {"workload.capability"}
	rules(ephemeral(fx.platform, {"privileged": true, "added_capabilities": ["SYS_PTRACE"]})) == set()
}

# The node's per-container check (kind container) judges the container the
# same way.
test_container_kind_judged_alike if {
	rules(fx.per_container(privileged(fx.agent))) == {"workload.privileged"}
	rules(fx.per_container(fx.mount(fx.agent, "/var/lib/kubelet/pods", true))) == {"workload.host_path"}
	rules(fx.per_container(fx.agent)) == set()
}

# The whole pod the security review found admitted: every rule fires for an
# untrusted tenant, and the trusted tier allows all but the unclean path.
review_pod(doc) := object.union(doc, {"pod": {
	"volumes": [
		{"name": "root", "type": "hostPath", "host_path": "/"},
		{"name": "pods", "type": "hostPath", "host_path": "/var/lib/kubelet/pods"},
		{"name": "etc", "type": "hostPath", "host_path": "/etc/bulkhead"},
		{"name": "state", "type": "hostPath", "host_path": "/var/lib/bulkhead"},
		{"name": "verbs", "type": "hostPath", "host_path": "//dev/infiniband/uverbs0"},
	],
	"containers": [{
		"name": "main",
		"image": "registry.local/app@sha256:00",
		"mounts": [
			{"host_path": "/", "path": "/host"},
			{"host_path": "/var/lib/kubelet/pods", "path": "/pods"},
			{"host_path": "/etc/bulkhead", "path": "/bh", "read_only": true},
			{"host_path": "/var/lib/bulkhead", "path": "/state"},
			{"host_path": "/dev/infiniband", "path": "/ib"},
		],
		"added_capabilities": ["SYS_ADMIN", "NET_ADMIN", "NET_RAW"],
	}],
}})

test_review_pod if {
	every doc in [fx.agent, fx.research] {
		rules(review_pod(doc)) == {"workload.host_path", "workload.capability"}
		count(messages(review_pod(doc))) == 13
	}
	messages(review_pod(fx.platform)) == {`volume "verbs" is host path "//dev/infiniband/uverbs0", which is not a clean absolute path; tier "trusted" allows any clean absolute host path`}
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
# them; its host namespaces, volumes and sysctls are still judged.
test_pod_without_containers if {
	bare := json.remove(fx.agent, ["/pod/containers"])
	rules(bare) == set()
	rules(object.union(bare, {"pod": {"host_pid": true}})) == {"workload.host_namespace"}
	rules(fx.volume(bare, "root", "/")) == {"workload.host_path"}
	rules(sysctl(bare, "kernel.msgmax")) == {"workload.sysctl"}
}

# A tier that leaves the new settings out gets lockdown's: no host paths,
# read-only, the baseline capabilities, no host ports, the safe sysctls,
# no Unconfined profile.
test_sparse_tier_locks_host_access_down if {
	tiers := {"minimal": {"runtimes": ["gvisor"]}}
	tenants := {"agents": {"tier": "minimal", "namespaces": ["agents"]}}
	doc := fx.container(review_pod(fx.agent), {"host_ports": [80], "seccomp_profile": "Unconfined"})
	rs := {f.rule | some f in workload.findings} with input as sysctl(doc, "kernel.msgmax")
		with data.bulkhead.tenants as tenants
		with data.bulkhead.tiers as tiers
	rs == {"workload.host_path", "workload.capability", "workload.host_port", "workload.sysctl", "workload.unconfined"}
}

# volumes(doc, vs) declares the volumes vs, each [name, type].
volumes(doc, vs) := object.union(doc, {"pod": {"volumes": [{"name": v[0], "type": v[1]} | some v in vs]}})

# Issue 24: inline nfs, iscsi, fc, flexVolume... passed below trusted. Below
# trusted only Pod Security "restricted"'s volume types pass; trusted
# allows any; hostPath volumes stay workload.host_path's alone.
test_volume_type_table if {
	restricted := [["c", "configMap"], ["s", "csi"], ["d", "downwardAPI"], ["e", "emptyDir"], ["x", "ephemeral"], ["p", "persistentVolumeClaim"], ["j", "projected"], ["t", "secret"]]
	cases := [
		# [doc, volumes, rule ids]
		[fx.agent, restricted, set()],
		[fx.research, restricted, set()],
		[fx.agent, [["n", "nfs"]], {"workload.volume_type"}],
		[fx.agent, [["i", "iscsi"]], {"workload.volume_type"}],
		[fx.research, [["f", "fc"]], {"workload.volume_type"}],
		[fx.research, [["flex", "flexVolume"]], {"workload.volume_type"}],
		[fx.agent, [["r", "rbd"]], {"workload.volume_type"}],
		[fx.agent, [["g", "gitRepo"]], {"workload.volume_type"}],
		[fx.agent, [["img", "image"]], {"workload.volume_type"}],
		[fx.agent, [["u", "unknown"]], {"workload.volume_type"}],
		[fx.agent, [["typeless", ""]], {"workload.volume_type"}],
		[fx.platform, [["n", "nfs"], ["i", "iscsi"], ["flex", "flexVolume"], ["u", "unknown"]], set()],
	]
	every c in cases {
		rules(volumes(c[0], c[1])) == c[2]
	}

	# hostPath is judged by its path only, in every tier.
	rules(fx.volume(fx.agent, "h", "/")) == {"workload.host_path"}
	rules(fx.volume(fx.platform, "h", "/var/log")) == set()
}

test_volume_type_message if {
	messages(volumes(fx.agent, [["data", "nfs"]])) == {`volume "data" is of type nfs; tier "untrusted" allows only volume types ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"]`}
}

# A tier may list more types, or none; one that leaves the key out gets
# "restricted"'s list.
test_volume_types_from_the_tier if {
	rules_in_standard(volumes(fx.research, [["n", "nfs"]]), {"allowed_volume_types": ["nfs"]}) == set()
	rules_in_standard(volumes(fx.research, [["e", "emptyDir"]]), {"allowed_volume_types": []}) == {"workload.volume_type"}
	rules_in_standard(volumes(fx.research, [["i", "iscsi"]]), {"allowed_volume_types": ["*"]}) == set()
	sparse_tier_rules(volumes(fx.agent, [["e", "emptyDir"], ["p", "persistentVolumeClaim"]])) == set()
	sparse_tier_rules(volumes(fx.agent, [["n", "nfs"]])) == {"workload.volume_type"}
}

sparse_tier_rules(doc) := r if {
	r := {f.rule | some f in workload.findings} with input as doc
		with data.bulkhead.tenants as {"agents": {"tier": "minimal", "namespaces": ["agents"]}}
		with data.bulkhead.tiers as {"minimal": {"runtimes": ["gvisor"]}}
}

# On a node (kind container) a volume the node cannot tell from a claim's
# (may_be_claim) passes where the tier allows claims; one of a type no
# PersistentVolume has is judged as at admission.
test_volume_type_on_the_node if {
	rules(on_node(fx.agent, [{"name": "pv-1", "type": "nfs", "may_be_claim": true}])) == set()
	rules(on_node(fx.agent, [{"name": "pv-1", "type": "iscsi", "may_be_claim": true}])) == set()
	rules(on_node(fx.agent, [{"name": "repo", "type": "gitRepo"}])) == {"workload.volume_type"}
	rules(on_node(fx.agent, [{"name": "img", "type": "image"}])) == {"workload.volume_type"}
	rules(on_node(fx.agent, [{"name": "pv-1", "type": "nfs", "may_be_claim": "yes"}])) == {"workload.volume_type"}
	claimable := [{"name": "pv-1", "type": "nfs", "may_be_claim": true}]
	rules_in_standard(on_node(fx.research, claimable), {"allowed_volume_types": ["emptyDir"]}) == {"workload.volume_type"}
	rules_in_standard(on_node(fx.research, claimable), {"allowed_volume_types": ["ephemeral"]}) == set()
}

on_node(doc, vs) := fx.per_container(object.union(doc, {"pod": {"volumes": vs}}))
