package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// Tenants of the story the test and the demo tell: agents (untrusted) for
// the sandbox, the refusals and the operator's mistake, batch (untrusted, a
// sandbox quota of 3) for the Deployment, platform (trusted) for runc with
// a MIG slice.
const Tenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"], "egress_cidrs": ["10.96.0.0/12"],
               "quota": {"sandboxes": 10, "gpu_slices": 6, "memory": "64Gi"}},
  "batch":    {"tier": "untrusted", "namespaces": ["batch"],
               "quota": {"sandboxes": 3, "gpu_slices": 0, "memory": "64Gi"}},
  "platform": {"tier": "trusted", "namespaces": ["platform"]}
}}}`

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

// QuotaDeployment asks for 5 sandboxes of tenant batch, whose quota is 3.
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

// StartStory prepares Bulkhead's install (PrepareInstall) with Tenants and
// starts a cluster for it in dir: the pod subnet, the webhook's link and
// the fence's pin directory are derived from the process id, so that
// concurrent runs never meet. Stop removes all of it; on error nothing is
// left.
func StartStory(ctx context.Context, dir, repoRoot string, log func(string, ...any)) (*Cluster, *Install, error) {
	id := os.Getpid() % 100000
	subnet := fmt.Sprintf("10.190.%d.0/24", os.Getpid()%250)
	pinDir := filepath.Join("/sys/fs/bpf", "bh-cluster-"+filepath.Base(dir))
	in, err := PrepareInstall(ctx, InstallOptions{
		Dir: dir, RepoRoot: repoRoot, TenantsJSON: Tenants,
		Link: fmt.Sprintf("bhw%d", id), Address: fmt.Sprintf("10.191.%d.1", os.Getpid()%250), Log: log,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	c, err := Start(ctx, Options{
		Dir:                 dir,
		AdmissionKubeconfig: in.AdmissionKubeconfig,
		Node: node.Options{
			BinDir: node.BinDirs(), Bridge: fmt.Sprintf("bhc%d", id), Subnet: subnet,
			PipelineEnabled: true, ShimConfig: in.ShimConfig(filepath.Join(dir, "shim"), subnet, pinDir),
		},
		RemoveAfterStop: []string{pinDir},
		Log:             log,
	})
	if err != nil {
		in.Close()
		_ = os.RemoveAll(pinDir)
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	c.OnStop(in.Close)
	return c, in, nil
}
