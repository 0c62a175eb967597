package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	bhnode "github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/test/node"
)

func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// eventually polls check until it returns "" or the context ends, and
// returns the last complaint.
func eventually(ctx context.Context, check func() string) string {
	for {
		why := check()
		if why == "" {
			return ""
		}
		select {
		case <-ctx.Done():
			return why
		case <-time.After(time.Second):
		}
	}
}

// TestCluster installs Bulkhead from deploy/ on a real two-node cluster and
// drives it through kubectl only, as a user and an operator would.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster: starts a Kubernetes cluster (not in -short)")
	}
	if err := Requirements(); err != nil {
		t.Skipf("cluster: %v", err)
	}
	if _, err := node.LookPath("bulkhead-webhook"); err != nil {
		t.Skip("cluster: needs bulkhead-webhook (make build)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "bh-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	logf := func(format string, args ...any) { t.Logf(format, args...) }
	kubeChainsBefore := kubeChains()
	started := time.Now()
	c, in, err := StartStory(ctx, dir, repoRoot(t), logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s", time.Since(started).Round(time.Second))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("component logs (tail):\n%s", c.Logs(25))
			t.Logf("webhook pods' logs (tail):\n%s", in.WebhookLogs(context.Background(), c, 25))
			t.Logf("node DaemonSet pods' logs (tail):\n%s", in.NodeLogs(context.Background(), c, 25))
		}
		if err := c.Stop(context.Background()); err != nil {
			t.Error(err)
		}
		assertGone(t, c)
		if after := kubeChains(); after != kubeChainsBefore {
			t.Errorf("iptables KUBE-* chains changed (the kubelet must leave the host's tables alone):\nbefore:\n%s\nafter:\n%s", kubeChainsBefore, after)
		}
	})
	if err := in.Apply(ctx, c); err != nil {
		t.Fatal(err)
	}
	t.Logf("bulkhead installed %s after start", time.Since(started).Round(time.Second))
	kubectl := func(args ...string) (string, error) { return c.Kubectl(ctx, args...) }
	apply := func(manifest string) (string, error) { return c.KubectlStdin(ctx, manifest, "apply", "-f", "-") }
	for _, ns := range Namespaces {
		if out, err := kubectl("create", "namespace", ns); err != nil {
			t.Fatalf("create namespace %s: %v: %s", ns, err, out)
		}
		if why := eventually(ctx, func() string {
			if out, err := kubectl("-n", ns, "get", "serviceaccount", "default"); err != nil {
				return out
			}
			return ""
		}); why != "" {
			t.Fatalf("namespace %s has no default ServiceAccount: %s", ns, why)
		}
	}

	t.Run("0-webhook-runs-as-deployed", func(t *testing.T) { testWebhookDeployment(ctx, t, c) })

	t.Run("1-gvisor-pod-runs", func(t *testing.T) {
		if out, err := apply(Pod("sandboxed", "agents", "bulkhead", nil)); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		} else {
			t.Logf("$ kubectl apply -f sandboxed.yaml\n%s", out)
		}
		if out, err := kubectl("-n", "agents", "wait", "--for=condition=Ready", "pod/sandboxed", "--timeout=180s"); err != nil {
			d, _ := kubectl("-n", "agents", "describe", "pod", "sandboxed")
			t.Fatalf("pod not Ready: %v: %s\n%s", err, out, d)
		}
		out, err := kubectl("-n", "agents", "exec", "sandboxed", "--", "dmesg")
		if err != nil || !strings.Contains(out, "gVisor") {
			t.Fatalf("kubectl exec sandboxed -- dmesg: %v\n%s\nwant the gVisor kernel's boot messages", err, out)
		}
		t.Logf("$ kubectl -n agents exec sandboxed -- dmesg\n%s", out)

		// Issue 24, hole 1: an in-place resize past the memory quota (2Gi).
		out, err = ResizePastQuota(ctx, c, "agents", "sandboxed", "3Gi")
		t.Logf("$ kubectl -n agents patch pod sandboxed --subresource resize -p '%s'\n%s", ResizePatch("3Gi"), out)
		if err != nil {
			t.Error(err)
		}
		// Issue 24, hole 3: a request annotation is fixed at create.
		out, err = kubectl("-n", "agents", "annotate", "pod", "sandboxed", "bulkhead.dev/gpu-profile=1g.18gb")
		t.Logf("$ kubectl -n agents annotate pod sandboxed bulkhead.dev/gpu-profile=1g.18gb\n%s", out)
		if err == nil || !strings.Contains(out, "[request.annotation_immutable]") {
			t.Errorf("annotating a running pod with a GPU request: err %v, want the webhook's [request.annotation_immutable]", err)
		}
	})

	t.Run("2-untrusted-pod-without-runtimeclass-rejected", func(t *testing.T) {
		out, err := apply(Pod("plain", "agents", "", nil))
		if err == nil {
			t.Fatalf("kubectl apply of an untrusted pod without runtimeClassName succeeded:\n%s", out)
		}
		t.Logf("$ kubectl apply -f plain.yaml\n%s", out)
		for _, want := range []string{`admission webhook "validate.bulkhead.dev" denied the request`, "[runtime.handler_required]", `requires runtimeClassName "bulkhead"`} {
			if !strings.Contains(out, want) {
				t.Errorf("error lacks %q", want)
			}
		}
	})

	t.Run("2b-dra-claim-judged-by-the-tier", func(t *testing.T) {
		out, err := CreateClaim(ctx, c, GPUClaim("all-gpus", "agents"), false)
		t.Logf("$ kubectl create -f all-gpus-claim.yaml   (namespace agents)\n%s", out)
		if err == nil || !strings.Contains(out, `admission webhook "validate.bulkhead.dev" denied the request`) || !strings.Contains(out, "[gpu.dra_forbidden]") {
			t.Errorf("an untrusted tenant's claim for every GPU: err %v, want the webhook's [gpu.dra_forbidden]", err)
		}
		if out, err := CreateClaim(ctx, c, GPUClaim("all-gpus", "platform"), true); err != nil {
			t.Errorf("the same claim of a trusted tenant (server dry run): %v\n%s", err, out)
		}
	})

	t.Run("3-deployment-over-sandbox-quota", func(t *testing.T) {
		if out, err := apply(QuotaDeployment); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		var events string
		if why := eventually(ctx, func() string {
			out, err := kubectl("-n", "batch", "get", "pods", "-l", "app=workers", "--field-selector=status.phase=Running", "-o", "name")
			if err != nil {
				return out
			}
			if n := len(strings.Fields(out)); n != 3 {
				return fmt.Sprintf("%d pods Running, want 3", n)
			}
			events, err = kubectl("-n", "batch", "get", "events", "--field-selector=involvedObject.kind=ReplicaSet,reason=FailedCreate", "-o", "custom-columns=MESSAGE:.message", "--no-headers")
			if err != nil || !strings.Contains(events, "[quota.sandboxes]") {
				return "no FailedCreate event of the ReplicaSet names quota.sandboxes yet: " + events
			}
			return ""
		}); why != "" {
			d, _ := kubectl("-n", "batch", "describe", "replicaset")
			t.Fatalf("%s\n%s", why, d)
		}
		if out, _ := kubectl("-n", "batch", "get", "pods", "-l", "app=workers", "-o", "jsonpath={range .items[*]}{.spec.nodeName}{\"\\n\"}{end}"); !strings.Contains(out, NodeA) || !strings.Contains(out, NodeB) {
			t.Errorf("the Deployment's pods are not spread over both nodes: %q", out)
		}
		// The ReplicaSet has tried past the quota; still exactly 3 pods exist.
		out, _ := kubectl("-n", "batch", "get", "pods", "-l", "app=workers", "-o", "name")
		if n := len(strings.Fields(out)); n != 3 {
			t.Errorf("%d pods exist, want exactly 3:\n%s", n, out)
		}
		d, _ := kubectl("-n", "batch", "describe", "replicaset", "-l", "app=workers")
		t.Logf("$ kubectl -n batch get pods\n%s", mustOut(kubectl("-n", "batch", "get", "pods")))
		t.Logf("$ kubectl -n batch describe replicaset -l app=workers\n%s", d)
		if out, err := kubectl("-n", "batch", "delete", "deployment", "workers", "--wait=true"); err != nil {
			t.Errorf("delete deployment: %v: %s", err, out)
		}
	})

	t.Run("4-exempted-namespace-refused-by-node", func(t *testing.T) {
		// The operator's mistake: the tenant's namespace added to the
		// webhook's exemptions. The node still judges with the same bundle.
		patch := `[{"op":"add","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/-","value":"agents"}]`
		if out, err := kubectl("patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p", patch); err != nil {
			t.Fatalf("exempt agents: %v: %s", err, out)
		}
		defer func() {
			unpatch := `[{"op":"test","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/2","value":"agents"},{"op":"remove","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/2"}]`
			if out, err := kubectl("patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p", unpatch); err != nil {
				t.Errorf("restore the exemptions: %v: %s", err, out)
			}
		}()
		out, err := apply(Pod("whole-gpu", "agents", "bulkhead", map[string]string{"bulkhead.dev/gpu-profile": "whole"}))
		if err != nil {
			t.Fatalf("kubectl apply in an exempted namespace: %v\n%s", err, out)
		}
		t.Logf("$ kubectl apply -f whole-gpu.yaml\n%s", out)
		var describe string
		if why := eventually(ctx, func() string {
			describe, _ = kubectl("-n", "agents", "describe", "pod", "whole-gpu")
			if !strings.Contains(describe, "FailedCreatePodSandBox") || !strings.Contains(describe, "bulkhead refused") {
				return "no FailedCreatePodSandBox event naming the refusal yet"
			}
			return ""
		}); why != "" {
			t.Fatalf("%s:\n%s", why, describe)
		}
		t.Logf("$ kubectl -n agents describe pod whole-gpu\n%s", describe)
		if !strings.Contains(describe, "gpu.whole_forbidden") {
			t.Errorf("the refusal does not name gpu.whole_forbidden")
		}
		if out, err := kubectl("-n", "agents", "delete", "pod", "whole-gpu", "--wait=true"); err != nil {
			t.Errorf("delete pod: %v: %s", err, out)
		}
	})

	t.Run("5-webhook-down-fails-closed", func(t *testing.T) {
		if err := in.StopWebhook(ctx, c); err != nil {
			t.Fatal(err)
		}
		out, err := apply(Pod("while-down", "agents", "bulkhead", nil))
		t.Logf("$ kubectl -n bulkhead-system scale deployment bulkhead-webhook --replicas=0; kubectl apply -f while-down.yaml\n%s", out)
		if err == nil {
			t.Errorf("pod created while the webhook was down (failurePolicy: Fail)")
		}
		for _, want := range []string{`failed calling webhook "validate.bulkhead.dev"`, `no endpoints available for service "bulkhead-webhook"`} {
			if !strings.Contains(out, want) {
				t.Errorf("error lacks %q", want)
			}
		}
		if err := in.StartWebhook(ctx, c); err != nil {
			t.Fatalf("restart the webhook: %v", err)
		}
	})

	t.Run("runc-tier-trusted-pod-with-mig-slice", func(t *testing.T) {
		for _, bin := range []string{"containerd-shim-bulkhead-runc-v1", "runc"} {
			if _, err := node.LookPath(bin); err != nil {
				t.Skipf("runc tier: needs %s (make build tools)", bin)
			}
		}
		if out, err := apply(OnNode(Pod("trainer", "platform", "bulkhead-runc", map[string]string{"bulkhead.dev/gpu-profile": "3g.71gb"}), NodeA)); err != nil {
			t.Fatalf("kubectl apply: %v\n%s", err, out)
		}
		if out, err := kubectl("-n", "platform", "wait", "--for=condition=Ready", "pod/trainer", "--timeout=180s"); err != nil {
			d, _ := kubectl("-n", "platform", "describe", "pod", "trainer")
			t.Fatalf("pod not Ready: %v: %s\n%s", err, out, d)
		}
		// The container's own process: exec'd processes take containerd's
		// stored spec, which the shim does not rewrite (test/e2e says so too).
		env, err := kubectl("-n", "platform", "exec", "trainer", "--", "sh", "-c", `tr '\0' '\n' </proc/1/environ`)
		uuid := strings.TrimPrefix(grepLines(env, "NVIDIA_VISIBLE_DEVICES="), "NVIDIA_VISIBLE_DEVICES=")
		if err != nil || !strings.HasPrefix(uuid, "MIG-") {
			t.Errorf("the pod's environment: %v\n%s\nwant NVIDIA_VISIBLE_DEVICES=MIG-...", err, env)
		}
		onNode, _ := kubectl("-n", "platform", "get", "pod", "trainer", "-o", "jsonpath={.spec.nodeName}")
		w := c.Node(onNode)
		if w == nil {
			t.Fatalf("pod trainer runs on %q, not a node of the cluster", onNode)
		}
		status, err := w.NodeStatus(ctx, "")
		if err != nil || uuid == "" || !strings.Contains(string(status), uuid) || !strings.Contains(string(status), "3g.71gb") {
			t.Errorf("bulkhead node status does not list the pod's 3g.71gb instance %q: %v\n%s", uuid, err, status)
		}
		host, _ := os.ReadFile("/proc/sys/kernel/osrelease")
		if rel, err := kubectl("-n", "platform", "exec", "trainer", "--", "cat", "/proc/sys/kernel/osrelease"); err != nil || strings.TrimSpace(rel) != strings.TrimSpace(string(host)) {
			t.Errorf("kernel in the runc pod: %q (%v), want the host's %q", rel, err, host)
		}
		t.Logf("$ kubectl -n platform exec trainer -- sh -c \"tr '\\0' '\\n' </proc/1/environ\" | grep NVIDIA\n%s", grepLines(env, "NVIDIA"))
		t.Logf("$ bulkhead node status\n%s", status)
	})

	t.Run("11-audit-against-a-new-revision", func(t *testing.T) { testAudit(ctx, t, c) })
	t.Run("7-traffic-matrix-across-nodes", func(t *testing.T) { testTrafficMatrix(ctx, t, c) })
	t.Run("7b-roce-across-nodes-granted-pairs-only", func(t *testing.T) { testRoCEAcrossNodes(ctx, t, c) })
	t.Run("8-api-server-down-30s", func(t *testing.T) { testAPIServerOutage(ctx, t, c) })
	t.Run("9-quota-burst-across-nodes", func(t *testing.T) { testQuotaBurst(ctx, t, c) })
	t.Run("10-dra-mig-claims-on-the-gpu-node", func(t *testing.T) { testDRAClaims(ctx, t, c) })
	t.Run("12-node-daemonset-rollout-keeps-running-pods", func(t *testing.T) { testNodeRollout(ctx, t, c) })
	t.Run("13-rbac-each-identity-owns-its-objects", func(t *testing.T) { testRBAC(ctx, t, c) })

	t.Run("6-uninstall-leaves-nothing", func(t *testing.T) {
		// The node file the installer wrote, kept for `bulkhead node
		// status` after the DaemonSet's remove has deleted /etc/bulkhead.
		kept := map[string]string{}
		for _, w := range c.Nodes {
			kept[w.Name] = filepath.Join(c.Dir(), w.Name, "config-before-uninstall.toml")
			if err := copyFile(w.Node.HostPath("/etc/bulkhead/config.toml"), kept[w.Name], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := in.Uninstall(ctx, c, Namespaces...); err != nil {
			t.Fatal(err)
		}
		out, err := kubectl("get", "validatingwebhookconfigurations,mutatingwebhookconfigurations,runtimeclasses,clusterroles,clusterrolebindings,namespaces", "-o", "name")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if l := grepLines(out, "bulkhead"); l != "" {
			t.Errorf("cluster-scoped objects left:\n%s", l)
		}
		out, err = kubectl("get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies,poddisruptionbudgets,endpointslices,events", "-A", "-o", "name")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if l := grepLines(out, "bulkhead"); l != "" {
			t.Errorf("namespaced objects left:\n%s", l)
		}
		if out, _ := kubectl("get", "nodes", "--show-labels"); strings.Contains(out, "bulkhead.dev/node") {
			t.Errorf("node label left:\n%s", out)
		}
		// Each node: every sandbox removed by the kubelet (its GC removes
		// the sandboxes of deleted pods), the ledger, the fence and the
		// MIG mock empty, no shim left.
		for _, w := range c.Nodes {
			if why := eventually(ctx, func() string {
				resp, err := w.Node.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
				if err != nil {
					return err.Error()
				}
				if len(resp.Items) != 0 {
					return fmt.Sprintf("%d sandboxes left on node %s", len(resp.Items), w.Name)
				}
				return ""
			}); why != "" {
				t.Errorf("%s", why)
			}
			status, err := w.NodeStatus(ctx, kept[w.Name])
			t.Logf("$ bulkhead node status   (node %s, its config.toml before the uninstall)\n%s", w.Name, status)
			if err != nil || !strings.Contains(status, "no sandboxes on this node") || strings.Contains(status, "MIG-") {
				t.Errorf("bulkhead node status of %s after uninstall: %v", w.Name, err)
			}
			// The DaemonSet's remove: the runtimes out of containerd, the
			// host binaries and /etc/bulkhead's files gone.
			for _, p := range []string{"/etc/containerd/conf.d/bulkhead.toml", "/usr/local/bin/containerd-shim-bulkhead-v1",
				"/usr/local/bin/containerd-shim-bulkhead-runc-v1", "/usr/local/bin/runsc", "/usr/local/bin/bulkhead-runc", "/etc/bulkhead/config.toml"} {
				if _, err := os.Stat(w.Node.HostPath(p)); err == nil {
					t.Errorf("node %s: %s left after the DaemonSet's remove", w.Name, p)
				}
			}
			if b, err := os.ReadFile(w.Node.HostPath("/etc/containerd/config.toml")); err != nil || strings.Contains(string(b), "conf.d/bulkhead.toml") || strings.Contains(string(b), "io.containerd.bulkhead") {
				t.Errorf("node %s: containerd's config.toml still imports or names Bulkhead's runtimes (%v):\n%s", w.Name, err, b)
			}
			l, err := bhnode.OpenLedger(w.Node.HostPath("/var/lib/bulkhead/ledger.db"))
			if err != nil {
				t.Fatal(err)
			}
			_ = l.View(func(tx *bhnode.LedgerTx) error {
				res, err := tx.List()
				if err != nil || len(res) != 0 {
					t.Errorf("node %s ledger: %d reservations left (%v)", w.Name, len(res), err)
				}
				return nil
			})
			for _, p := range w.Node.Processes() {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				if s := strings.ReplaceAll(string(cmd), "\x00", " "); strings.Contains(s, "shim") || strings.Contains(s, "runsc") {
					t.Errorf("process left on %s: %d %s", w.Name, p, s)
				}
			}
		}
	})
}

// assertGone checks what Stop must have removed.
func assertGone(t *testing.T, c *Cluster) {
	t.Helper()
	dir := c.Dir()
	links := []string{c.opts.Link}
	var cgroupRoots []string
	for _, w := range c.Nodes {
		links = append(links, w.opts.Node.Bridge)
		cgroupRoots = append(cgroupRoots, w.CgroupRoot)
	}
	if pids := node.ProcessesUnder(dir); len(pids) > 0 {
		t.Errorf("processes left under %s: %v", dir, pids)
	}
	if m := node.MountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts left under %s: %v", dir, m)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s left", dir)
	}
	for _, h := range v1Hierarchies() {
		for _, cg := range cgroupRoots {
			if _, err := os.Stat(filepath.Join(h, cg)); err == nil {
				t.Errorf("cgroup %s left", filepath.Join(h, cg))
			}
		}
	}
	for _, tbl := range proxyTables {
		if exec.Command("nft", "list", "table", tbl[0], tbl[1]).Run() == nil {
			t.Errorf("nft table %s %s left", tbl[0], tbl[1])
		}
	}
	for _, l := range links {
		if err := exec.Command("ip", "link", "show", l).Run(); err == nil {
			t.Errorf("link %s left", l)
		}
	}
}

// kubeChains lists the host's iptables lines that name KUBE- chains.
func kubeChains() string {
	var out []string
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		b, _ := exec.Command(save).Output()
		if l := grepLines(string(b), "KUBE-"); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func mustOut(s string, _ error) string { return s }

func mustLook(t *testing.T, bin string) string {
	p, err := node.LookMockPath(bin)
	if err != nil {
		t.Fatalf("needs %s (make build)", bin)
	}
	return p
}
