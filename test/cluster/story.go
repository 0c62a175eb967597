package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// Tenants of the story the test and the demo tell: agents (untrusted, a
// memory quota of 2Gi) for the sandbox, the refusals, the in-place resize
// and the operator's mistake, batch (untrusted, a sandbox quota of 3) for
// the Deployment, platform (trusted) for runc with a MIG slice, analytics
// (untrusted) as agents' neighbour in the traffic matrix across the nodes,
// burst (untrusted, a sandbox quota of 3) for concurrent creates spread over
// both nodes, training (standard, RDMA on its own VF like platform) as
// platform's granted neighbour in the RoCE matrix across the nodes. The memory quotas stay below a node's allocatable memory: the
// API server itself refuses a resize past that, before any webhook.
const Tenants = `{"bulkhead": {"tenants": {
  "agents":    {"tier": "untrusted", "namespaces": ["agents"], "egress_cidrs": ["10.96.0.0/12"],
                "quota": {"sandboxes": 10, "gpu_slices": 6, "memory": "2Gi"}},
  "batch":     {"tier": "untrusted", "namespaces": ["batch"],
                "quota": {"sandboxes": 3, "gpu_slices": 0, "memory": "64Gi"}},
  "platform":  {"tier": "trusted", "namespaces": ["platform"]},
  "analytics": {"tier": "untrusted", "namespaces": ["analytics"],
                "quota": {"sandboxes": 10, "gpu_slices": 0, "memory": "2Gi"}},
  "burst":     {"tier": "untrusted", "namespaces": ["burst"],
                "quota": {"sandboxes": 3, "gpu_slices": 0, "memory": "64Gi"}},
  "training":  {"tier": "standard", "namespaces": ["training"]}
}}}`

// Namespaces are the story's namespaces, one per tenant.
var Namespaces = []string{"agents", "batch", "platform", "analytics", "burst", "training"}

// sandboxPod is a pod an untrusted tenant may run on the bulkhead
// RuntimeClass: limits, the local image (nothing can be pulled here).
const sandboxPod = `apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
%s
spec:
  %s
  terminationGracePeriodSeconds: 2
  containers:
    - name: main
      image: bulkhead.local/busybox:v1
      imagePullPolicy: Never
      command: ["/bin/sh", "-c", "exec sleep 3600"]
      resources:
        limits:
          cpu: 100m
          memory: 64Mi
`

// Pod is a pod of the local busybox image in namespace ns, on runtimeClass
// (none when empty), with annotations.
func Pod(name, ns, runtimeClass string, annotations map[string]string) string {
	var ann string
	if len(annotations) > 0 {
		ann = "  annotations:\n"
		for k, v := range annotations {
			ann += fmt.Sprintf("    %s: %q\n", k, v)
		}
	}
	rc := ""
	if runtimeClass != "" {
		rc = "runtimeClassName: " + runtimeClass
	}
	return fmt.Sprintf(sandboxPod, name, ns, ann, rc)
}

// QuotaDeployment asks for 5 sandboxes of tenant batch, whose quota is 3,
// spread over the nodes.
const QuotaDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: workers
  namespace: batch
spec:
  replicas: 5
  selector:
    matchLabels: {app: workers}
  template:
    metadata:
      labels: {app: workers}
    spec:
      runtimeClassName: bulkhead
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector:
            matchLabels: {app: workers}
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: bulkhead.local/busybox:v1
          imagePullPolicy: Never
          command: ["/bin/sh", "-c", "exec sleep 3600"]
          resources:
            limits:
              cpu: 100m
              memory: 64Mi
`

// The story's two nodes: the scheduler spreads its pods over both, and
// the fence of each learns the other's pods from the API server. NodeA is
// the GPU node (two mock H200s, published to the scheduler through DRA);
// NodeB has no GPU.
const (
	NodeA = "node-a"
	NodeB = "node-b"
)

// gpuNodeGPUs is NodeA's mock H200s: NodeA is the GPU node the
// DaemonSet's installer finds (InstallOptions.GPUNodes); NodeB has none.
const gpuNodeGPUs = 2

// StartStory prepares Bulkhead's install (PrepareInstall) with Tenants and
// starts a two-node cluster for it in dir (NodeA, NodeB). The pod ranges
// and the links are derived from the process id, so that concurrent runs
// never meet. Stop removes all of it; on error nothing is left.
func StartStory(ctx context.Context, dir, repoRoot string, log func(string, ...any)) (*Cluster, *Install, error) {
	return startStory(ctx, dir, repoRoot, log, 24)
}

// startStory is StartStory with each node's IPv4 pod range of prefixLen
// bits (24 to 29): a small range makes a churn of pods reuse addresses.
func startStory(ctx context.Context, dir, repoRoot string, log func(string, ...any), prefixLen int) (*Cluster, *Install, error) {
	if prefixLen < 24 || prefixLen > 29 {
		return nil, nil, fmt.Errorf("story: node prefix length %d: want 24 to 29", prefixLen)
	}
	pid := os.Getpid()
	id := pid % 100000
	// The cluster's pod ranges, of which each node has a /24 and a /64.
	block := (pid % 16) * 16
	cidr4 := fmt.Sprintf("10.190.%d.0/20", block)
	cidr6 := fmt.Sprintf("fd19:%x::/48", pid%0x10000)
	in, err := PrepareInstall(ctx, InstallOptions{Dir: dir, RepoRoot: repoRoot, TenantsJSON: Tenants, Log: log,
		GPUNodes: []string{NodeA}, MockGPUs: gpuNodeGPUs})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	opts := Options{
		Dir:                 dir,
		AdmissionKubeconfig: in.AdmissionKubeconfig,
		Link:                fmt.Sprintf("bhn%d", id),
		APIServerAddress:    fmt.Sprintf("10.192.%d.1", pid%250),
		ClusterCIDRs:        []string{cidr4, cidr6},
		Log:                 log,
	}
	for i, name := range []string{NodeA, NodeB} {
		opts.Nodes = append(opts.Nodes, NodeOptions{
			Name:    name,
			Address: fmt.Sprintf("10.192.%d.%d", pid%250, 10+i),
			Node: node.Options{
				BinDir: node.BinDirs(), Bridge: fmt.Sprintf("bhc%d%c", id, 'a'+i),
				Subnet:  fmt.Sprintf("10.190.%d.0/%d", block+1+i, prefixLen),
				Subnet6: fmt.Sprintf("fd19:%x:0:%d::/64", pid%0x10000, 1+i),
				Routed:  true,
			},
		})
	}
	c, err := Start(ctx, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return c, in, nil
}

// ResizePatch resizes a story pod's main container in place to memory
// (kubectl patch --subresource resize). Requests move with the limit: a
// story pod is Guaranteed (requests default to its limits) and the API
// server refuses a resize that would change its QoS class.
func ResizePatch(memory string) string {
	return fmt.Sprintf(`{"spec":{"containers":[{"name":"main","resources":{"requests":{"memory":%q},"limits":{"memory":%q}}}]}}`, memory, memory)
}

// ResizePastQuota resizes pod ns/name to memory, more than its tenant's
// memory quota, and returns kubectl's output; the error says why the API
// server did not refuse it as the webhook should (issue 24, hole 1: on
// c746b90 no rule routed pods/resize to the webhook, and the resize went
// through).
func ResizePastQuota(ctx context.Context, c *Cluster, ns, name, memory string) (string, error) {
	out, err := c.Kubectl(ctx, "-n", ns, "patch", "pod", name, "--subresource", "resize", "--type=strategic", "-p", ResizePatch(memory))
	if err == nil {
		return out, fmt.Errorf("kubectl patch --subresource resize to %s past the tenant's memory quota succeeded", memory)
	}
	for _, want := range []string{`admission webhook "validate.bulkhead.dev" denied the request`, "resize of pod", "[quota.memory]"} {
		if !strings.Contains(out, want) {
			return out, fmt.Errorf("the resize was refused, but not by the webhook's memory quota: no %q", want)
		}
	}
	return out, nil
}

// GPUClaim is a DRA ResourceClaim asking for every device of the GPU class
// gpu.nvidia.com (no DeviceClass need exist for the API server to store it).
func GPUClaim(name, ns string) string {
	return fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: %s
  namespace: %s
spec:
  devices:
    requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.nvidia.com
          allocationMode: All
`, name, ns)
}

// CreateClaim creates manifest, a ResourceClaim, with kubectl (a server
// dry run when dryRun) and returns its output. Issue 24: claims are judged
// on their own, so one a pod's tier refuses cannot be swapped in under a
// name the pod already references.
func CreateClaim(ctx context.Context, c *Cluster, manifest string, dryRun bool) (string, error) {
	args := []string{"create", "-f", "-"}
	if dryRun {
		args = append(args, "--dry-run=server")
	}
	return c.KubectlStdin(ctx, manifest, args...)
}

// probePod is a sandboxed pod on one node that answers netprobe (the test
// image's probe) on TCP 8080, UDP 9090 and UDP 4791 (RoCEv2).
const probePod = `apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {app: %s}
spec:
  runtimeClassName: bulkhead
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: bulkhead.local/busybox:v1
      imagePullPolicy: Never
      command: ["netprobe", "serve", "tcp:8080", "udp:9090", "udp:4791"]
      resources:
        limits:
          cpu: 100m
          memory: 64Mi
`

// ProbePod is a gVisor pod name of namespace ns on node nodeName that
// answers netprobe on TCP 8080, UDP 9090 and UDP 4791; it is labelled
// app=name.
func ProbePod(name, ns, nodeName string) string {
	return fmt.Sprintf(probePod, name, ns, name, nodeName)
}

// StaticProbePod is ProbePod as a static pod manifest (a kubelet's
// staticPodPath): the kubelet runs it without asking the API server, and
// names it name-<node>.
func StaticProbePod(name, ns string) string {
	return strings.Replace(fmt.Sprintf(probePod, name, ns, name, "unused"), "  nodeSelector: {kubernetes.io/hostname: unused}\n", "", 1)
}

// ProbeService is a dual-stack ClusterIP Service name of namespace ns in
// front of the pod labelled app=pod: TCP 8080 and UDP 9090.
func ProbeService(name, ns, pod string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: %s
spec:
  type: ClusterIP
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {app: %s}
  ports:
    - {name: tcp, protocol: TCP, port: 8080, targetPort: 8080}
    - {name: udp, protocol: UDP, port: 9090, targetPort: 9090}
`, name, ns, pod)
}

// OnNode pins the pod of manifest (one of Pod's) to node nodeName.
func OnNode(manifest, nodeName string) string {
	return strings.Replace(manifest, "spec:\n", "spec:\n  nodeSelector: {kubernetes.io/hostname: "+nodeName+"}\n", 1)
}

// BurstPod is a sandboxed pod of namespace ns pinned to nodeName, for
// concurrent creates against a quota.
func BurstPod(name, ns, nodeName string) string {
	return OnNode(Pod(name, ns, "bulkhead", nil), nodeName)
}
