// Command demo-cluster tells test/cluster's story to a person: a private
// one-node Kubernetes cluster, Bulkhead installed from deploy/ as
// docs/install.md says, then what `kubectl` shows a tenant and an operator
// at each step; it uninstalls and tears everything down on exit or Ctrl-C.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/bulkhead-runtime/bulkhead/test/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case interrupted:
		fmt.Fprintln(os.Stderr, "\ndemo-cluster interrupted: everything it started was torn down (exit 130)")
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "\ndemo-cluster failed: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

// repoRoot is the checkout the demo installs from: the working directory
// when it holds deploy/ (make runs it from the root), else the source's.
func repoRoot() string {
	if _, err := os.Stat("deploy/kustomization.yaml"); err == nil {
		wd, _ := os.Getwd()
		return wd
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

func run(ctx context.Context) error {
	if err := cluster.Requirements(); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bh-demo-cluster-")
	if err != nil {
		return err
	}
	say("Starting a two-node Kubernetes cluster (etcd, API server, controller manager, scheduler, kube-proxy; nodes %s and %s, each a kubelet on its own containerd; Bulkhead goes on them through its DaemonSet) in %s", cluster.NodeA, cluster.NodeB, dir)
	c, in, err := cluster.StartStory(ctx, dir, repoRoot(), func(f string, a ...any) { fmt.Printf("    "+f+"\n", a...) })
	if err != nil {
		return err
	}
	defer func() {
		say("Tearing the cluster down")
		if err := c.Stop(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	if err := in.Apply(ctx, c); err != nil {
		return err
	}
	// show runs kubectl and prints what the user sees; an error is part of
	// the story, not the demo's failure.
	show := func(args ...string) {
		quoted := make([]string, len(args))
		for i, a := range args {
			quoted[i] = a
			if strings.ContainsAny(a, " '\"[]{}<>|\\") {
				quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
			}
		}
		fmt.Printf("\n$ kubectl %s\n", strings.Join(quoted, " "))
		out, _ := c.Kubectl(ctx, args...)
		fmt.Print(out)
	}
	apply := func(file, manifest string) {
		fmt.Printf("\n$ kubectl apply -f %s\n", file)
		out, _ := c.KubectlStdin(ctx, manifest, "apply", "-f", "-")
		fmt.Print(out)
	}
	waitFor := func(check func() bool) {
		for i := 0; i < 120 && ctx.Err() == nil && !check(); i++ {
			time.Sleep(time.Second)
		}
	}
	say("Bulkhead installed from deploy/: the webhook's Deployment, and on each node the DaemonSet whose installer registered the runtimes and whose agent serves them")
	show("-n", "bulkhead-system", "get", "pods", "-o", "wide")
	for _, ns := range []string{"agents", "batch", "platform", "analytics"} {
		show("create", "namespace", ns)
		waitFor(func() bool { _, err := c.Kubectl(ctx, "-n", ns, "get", "serviceaccount", "default"); return err == nil })
	}

	say("1. An untrusted tenant's pod on RuntimeClass bulkhead runs in a gVisor sandbox")
	apply("sandboxed.yaml", cluster.Pod("sandboxed", "agents", "bulkhead", nil))
	show("-n", "agents", "wait", "--for=condition=Ready", "pod/sandboxed", "--timeout=180s")
	show("-n", "agents", "exec", "sandboxed", "--", "dmesg")

	say("2. The same tenant without runtimeClassName: refused at kubectl apply, with the rule")
	apply("plain.yaml", cluster.Pod("plain", "agents", "", nil))

	say("3. A Deployment of 5 replicas, the tenant's sandbox quota is 3")
	apply("workers.yaml", cluster.QuotaDeployment)
	waitFor(func() bool {
		out, _ := c.Kubectl(ctx, "-n", "batch", "get", "pods", "--field-selector=status.phase=Running", "-o", "name")
		return len(strings.Fields(out)) == 3
	})
	show("-n", "batch", "get", "pods")
	show("-n", "batch", "get", "events", "--field-selector=involvedObject.kind=ReplicaSet,reason=FailedCreate")
	show("-n", "batch", "delete", "deployment", "workers")

	say("4. The operator's mistake: the tenant's namespace exempted from the webhook. The node still refuses")
	show("patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p",
		`[{"op":"add","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/-","value":"agents"}]`)
	apply("whole-gpu.yaml", cluster.Pod("whole-gpu", "agents", "bulkhead", map[string]string{"bulkhead.dev/gpu-profile": "whole"}))
	waitFor(func() bool {
		out, _ := c.Kubectl(ctx, "-n", "agents", "describe", "pod", "whole-gpu")
		return strings.Contains(out, "FailedCreatePodSandBox")
	})
	show("-n", "agents", "get", "events", "--field-selector=involvedObject.name=whole-gpu,reason=FailedCreatePodSandBox")
	show("patch", "validatingwebhookconfiguration", "bulkhead", "--type=json", "-p",
		`[{"op":"remove","path":"/webhooks/0/namespaceSelector/matchExpressions/0/values/2"}]`)
	show("-n", "agents", "delete", "pod", "whole-gpu")

	say("5. The webhook down, failurePolicy Fail: no pod is admitted unjudged")
	if err := in.StopWebhook(ctx, c); err != nil {
		return err
	}
	show("-n", "bulkhead-system", "get", "deployment", "bulkhead-webhook")
	apply("while-down.yaml", cluster.Pod("while-down", "agents", "bulkhead", nil))
	if err := in.StartWebhook(ctx, c); err != nil {
		return err
	}

	say("6. A trusted tenant on runc (RuntimeClass bulkhead-runc) with a MIG slice of a mock H200 on %s", cluster.NodeA)
	apply("trainer.yaml", cluster.OnNode(cluster.Pod("trainer", "platform", "bulkhead-runc", map[string]string{"bulkhead.dev/gpu-profile": "3g.71gb"}), cluster.NodeA))
	show("-n", "platform", "wait", "--for=condition=Ready", "pod/trainer", "--timeout=180s")
	show("-n", "platform", "exec", "trainer", "--", "sh", "-c", `tr '\0' '\n' </proc/1/environ | grep NVIDIA`)

	say("7. Across the nodes: each node's fence knows the other's pods from the API server")
	apply("xa.yaml", cluster.ProbePod("xa", "agents", cluster.NodeA))
	apply("xb.yaml", cluster.ProbePod("xb", "agents", cluster.NodeB))
	apply("yb.yaml", cluster.ProbePod("yb", "analytics", cluster.NodeB))
	for _, p := range [][2]string{{"agents", "xa"}, {"agents", "xb"}, {"analytics", "yb"}} {
		show("-n", p[0], "wait", "--for=condition=Ready", "pod/"+p[1], "--timeout=180s")
	}
	show("get", "pods", "-A", "-o", "wide", "-l", "app in (xa,xb,yb)")
	ipOf := func(ns, name string) string {
		out, _ := c.Kubectl(ctx, "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.podIP}")
		return out
	}
	xb, yb := ipOf("agents", "xb"), ipOf("analytics", "yb")
	say("   Same tenant (agents) from %s to %s: passes", cluster.NodeA, cluster.NodeB)
	show("-n", "agents", "exec", "xa", "--", "netprobe", "tcp", xb+":8080")
	say("   Another tenant (analytics) on %s: dropped by the fence", cluster.NodeB)
	show("-n", "agents", "exec", "xa", "--", "netprobe", "tcp", yb+":8080")

	say("8. Uninstall as docs/install.md says")
	if err := in.Uninstall(ctx, c, "agents", "batch", "platform", "analytics"); err != nil {
		return err
	}
	show("get", "validatingwebhookconfigurations,runtimeclasses,namespaces")
	return ctx.Err()
}
