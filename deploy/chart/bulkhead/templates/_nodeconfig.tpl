{{/*
/etc/bulkhead/config.toml on every node, and what GPU nodes append to it:
deploy/node/config.toml and deploy/node/gpu.toml with the values put in.
With the default values they are those files, byte for byte
(deploy/chart_test.go).
*/}}
{{- define "bulkhead.nodeConfig" -}}
# Bulkhead node configuration, installed on every node as
# /etc/bulkhead/config.toml by the bulkhead-node DaemonSet. The node agent
# reads it when it starts, the shims when containerd starts a pod with
# runtime handler "bulkhead" or "bulkhead-runc".
runsc_path = "/usr/local/bin/runsc"
# runc for the bulkhead-runc handler: Bulkhead's own build (v1.5.3, seccomp),
# installed beside the host's runc, which it leaves alone.
runc_path = "/usr/local/bin/bulkhead-runc"
runc_root = "/run/bulkhead/runc"
runsc_root = "/run/bulkhead/runsc"
state_dir = "/run/bulkhead"
ledger_path = "/var/lib/bulkhead/ledger.db"

# Where the kubelet and containerd keep each pod's own files. A bind mount
# from under them (the pod's volumes, token, /etc/hosts, resolv.conf) is
# the pod's; any other bind source is a host path that the policy judges.
# Change them only if your kubelet (--root-dir) or containerd (root, state)
# use other directories.
kubelet_root = "/var/lib/kubelet"
containerd_root = "/var/lib/containerd"
containerd_state = "/run/containerd"

# The node agent (bulkhead-agent, the DaemonSet's agent container). The
# shims call it on this socket for every pod and refuse the pod when it does
# not answer. Its Prometheus /metrics is served on the node's network at
# port 9470, the port deploy/monitoring's Service bulkhead-node-metrics
# scrapes: decisions by tenant and rule, fence drops, quota use. Anyone
# who reaches the node's address can read it; set "127.0.0.1:9470" (and
# scrape through a node-local agent) or "" where tenants' names and counts
# must not leave the node.
[agent]
metrics_address = ":9470"
# The other defaults, which this file keeps:
# socket = "/run/bulkhead/agent.sock"
# # "": the pod's service account (Kubernetes Events on refused pods).
# kubeconfig = ""
# # "": $NODE_NAME (the DaemonSet sets it to the pod's spec.nodeName),
# # else the host name.
# node_name = ""

# The DRA kubelet plugin (driver mig.bulkhead.dev) the agent hosts: it
# publishes this node's MIG slices as ResourceSlices for the scheduler and
# prepares the slices ResourceClaims on DeviceClass mig.bulkhead.dev are
# allocated (docs/mig.md, "The kubelet plugin"). It needs a [mig] backend,
# mig.cdi_spec_dir and the API server (agent.kubeconfig or the pod's service
# account); both directories must be the kubelet's, writable by the agent.
# Off by default:
# [dra]
# enabled = true
# registrar_dir = "/var/lib/kubelet/plugins_registry"
# plugin_dir = "/var/lib/kubelet/plugins/mig.bulkhead.dev"

[runsc]
platform = "systrap"
network = "sandbox"
extra_flags = []

[policy]
bundle = "/etc/bulkhead/bundle.tar.gz"
key_file = "/etc/bulkhead/keys/bundle.pem"
key_id = {{ .Values.policy.keyID | quote }}
scope = {{ .Values.policy.scope | quote }}
# The shims keep the compiled policy in <state_dir>/policy-cache and
# authenticate each entry with this node's secret key, which the first shim
# creates (0600). It must lie outside state_dir; by default it is
# plan-cache.key beside ledger_path.
# plan_cache_key = "/var/lib/bulkhead/plan-cache.key"

# The eBPF tenant fence. It is on unless this says enabled = false, and a
# pod start on a node whose fence cannot be loaded is refused. Turning it
# off removes cross-tenant, metadata and egress enforcement: every pod start
# then logs a warning and `bulkhead node status` says FENCE: DISABLED.
[netpol]
enabled = true
pin_dir = "/sys/fs/bpf/bulkhead"
# The cluster's pod and service ranges: traffic to them is judged by tenant,
# traffic elsewhere by each tenant's egress allow-list. Set them to your
# cluster's --cluster-cidr and --service-cluster-ip-range, and add the
# network your nodes' addresses come from (their InternalIPs): a NodePort
# or LoadBalancer connection that another node masquerades arrives from
# that node's address, which is then owned by no tenant and passes only as a
# tier's shared service, instead of counting as a client outside the cluster
# (docs/netpol.md, "NodePort, LoadBalancer and host-network clients"). This
# node's own addresses are treated so whatever this list says.
cluster_cidrs = {{ include "bulkhead.tomlStrings" .Values.node.netpol.clusterCIDRs }}

# Per tier, the addresses every pod of the tier may reach whatever its
# tenant: cluster DNS (the kube-dns Service IP), the API server's Service IP
# if pods of the tier call it, and the node's CNI gateway. Keep the
# untrusted tier's list to DNS alone unless its pods need more.
[netpol.shared_services]
untrusted = {{ include "bulkhead.tomlStrings" .Values.node.netpol.sharedServices.untrusted }}
standard = {{ include "bulkhead.tomlStrings" .Values.node.netpol.sharedServices.standard }}
trusted = {{ include "bulkhead.tomlStrings" .Values.node.netpol.sharedServices.trusted }}
{{- end -}}

{{- define "bulkhead.gpuConfig" -}}
# GPU nodes: appended to config.toml by the node installer on the nodes
# where GPU_NODE (daemonset.yaml) says so: "auto" (the default) on every node
# whose host has an NVIDIA driver loaded (/proc/driver/nvidia/version),
# "true" on every node, "false" on none. config.toml must not define these
# tables itself (deploy/gpu_test.go checks it).
#
# The agent owns the node's MIG instances through NVML: it creates and
# destroys GPU and compute instances, records them in its ledger and never
# changes a GPU's MIG mode (the administrator's, docs/install.md).
[mig]
backend = {{ .Values.node.gpu.mig.backend | quote }}
# A pod's slice reaches its containers as a CDI device (bulkhead.dev/gpu=…),
# one spec per sandbox, removed with the reservation.
cdi_spec_dir = "/var/run/cdi"

# The DRA kubelet plugin (driver and DeviceClass mig.bulkhead.dev): it
# publishes the node's MIG slices as ResourceSlices and prepares the slices
# the scheduler allocates (docs/mig.md, "The kubelet plugin"). Both
# directories are the kubelet's, mounted writable into the agent.
[dra]
enabled = {{ .Values.node.gpu.dra.enabled }}
registrar_dir = "/var/lib/kubelet/plugins_registry"
plugin_dir = "/var/lib/kubelet/plugins/mig.bulkhead.dev"
{{- end -}}
