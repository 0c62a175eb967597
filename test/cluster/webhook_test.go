package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/deploy/image"
)

// testWebhookDeployment checks that the webhook runs as deploy/ deploys it:
// every replica of its Deployment Ready, on the image the test imported, on
// the nodes' default runtime (no RuntimeClass: runc, a real node's default),
// one per node (the preferred anti-affinity), its PodDisruptionBudget
// allowing one disruption, the caBundle its certificate rotator published
// and writes back when it is removed, and the API server's reviews answered by its pods (their /metrics on the
// probes port count the refusal Apply waited for).
func testWebhookDeployment(ctx context.Context, t *testing.T, c *Cluster) {
	out, err := c.Kubectl(ctx, "-n", webhookNamespace, "get", "deployment", webhookDeployment, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl get deployment: %v\n%s", err, out)
	}
	var dep struct {
		Spec   struct{ Replicas int }
		Status struct{ ReadyReplicas int }
	}
	if err := json.Unmarshal([]byte(out), &dep); err != nil {
		t.Fatal(err)
	}
	if dep.Spec.Replicas < 2 || dep.Status.ReadyReplicas != dep.Spec.Replicas {
		t.Errorf("Deployment %s: %d of %d replicas Ready, want every one of at least 2", webhookDeployment, dep.Status.ReadyReplicas, dep.Spec.Replicas)
	}
	out, err = c.Kubectl(ctx, "-n", webhookNamespace, "get", "pods", "-l", webhookSelector, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl get pods: %v\n%s", err, out)
	}
	var pods struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct {
				NodeName         string
				RuntimeClassName string
				Containers       []struct{ Image string }
			}
			Status struct{ PodIP string }
		}
	}
	if err := json.Unmarshal([]byte(out), &pods); err != nil {
		t.Fatal(err)
	}
	wantImage := image.Registry + "/" + image.Webhook + ":" + ImageTag
	nodes := map[string]bool{}
	denied := 0
	var addrs []netip.AddrPort
	for _, p := range pods.Items {
		nodes[p.Spec.NodeName] = true
		if p.Spec.RuntimeClassName != "" {
			t.Errorf("pod %s: runtimeClassName %q, want none (deploy/ sets none)", p.Metadata.Name, p.Spec.RuntimeClassName)
		}
		if len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != wantImage {
			t.Errorf("pod %s: containers %+v, want the one image %s", p.Metadata.Name, p.Spec.Containers, wantImage)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			t.Errorf("pod %s: pod IP %q: %v", p.Metadata.Name, p.Status.PodIP, err)
			continue
		}
		addrs = append(addrs, netip.AddrPortFrom(ip, 9090))
		n, err := metricSum(ctx, netip.AddrPortFrom(ip, 9090), "bulkhead_webhook_decisions_total", `result="denied"`)
		if err != nil {
			t.Errorf("pod %s: %v", p.Metadata.Name, err)
		}
		t.Logf("pod %s on %s (%s): %d reviews denied so far", p.Metadata.Name, p.Spec.NodeName, ip, n)
		denied += n
	}
	if len(pods.Items) != dep.Spec.Replicas || len(nodes) != len(c.Nodes) {
		t.Errorf("%d webhook pods on nodes %v, want %d, one on each of the %d nodes", len(pods.Items), nodes, dep.Spec.Replicas, len(c.Nodes))
	}
	if denied == 0 {
		t.Errorf("no webhook pod counts a denied review: the API server's reviews did not reach them")
	}
	if out, err := c.Kubectl(ctx, "-n", webhookNamespace, "get", "pdb", webhookDeployment, "-o", "jsonpath={.status.disruptionsAllowed}"); err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("PodDisruptionBudget %s: disruptionsAllowed %q (%v), want 1", webhookDeployment, out, err)
	}
	caBundle := func() string {
		ca, _ := c.Kubectl(ctx, "get", "validatingwebhookconfiguration", "bulkhead", "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}")
		return strings.TrimSpace(ca)
	}
	if caBundle() == "" {
		t.Fatal("ValidatingWebhookConfiguration bulkhead: no caBundle: the rotator did not publish it")
	}

	// The rotators watch their Secret and configuration with the rights
	// deploy/ grants (list and watch by name): a caBundle someone removes
	// is written back by a replica and counted, and no replica logs a
	// refused list or watch.
	if out, err := c.Kubectl(ctx, "patch", "validatingwebhookconfiguration", "bulkhead", "--type=json",
		"-p", `[{"op":"remove","path":"/webhooks/0/clientConfig/caBundle"}]`); err != nil {
		t.Fatalf("remove the caBundle: %v\n%s", err, out)
	}
	removed := time.Now()
	for caBundle() == "" {
		if time.Since(removed) > 2*time.Minute {
			t.Fatalf("the caBundle removed %s ago was not written back", time.Since(removed).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the removed caBundle was written back within %s", time.Since(removed).Round(10*time.Millisecond))
	repairs := 0
	for _, a := range addrs {
		n, err := metricSum(ctx, a, "bulkhead_webhook_cabundle_repairs_total", "")
		if err != nil {
			t.Errorf("%s: %v", a, err)
		}
		repairs += n
	}
	if repairs == 0 {
		t.Error("the caBundle is back but no replica counts a repair (bulkhead_webhook_cabundle_repairs_total)")
	}
	for _, p := range pods.Items {
		logs, err := c.Kubectl(ctx, "-n", webhookNamespace, "logs", p.Metadata.Name)
		if err != nil {
			t.Errorf("kubectl logs %s: %v", p.Metadata.Name, err)
		}
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "forbidden") {
				t.Errorf("pod %s: %s", p.Metadata.Name, l)
			}
		}
	}
	t.Logf("$ kubectl -n %s get pods -o wide\n%s", webhookNamespace, mustOut(c.Kubectl(ctx, "-n", webhookNamespace, "get", "pods", "-o", "wide")))
}

// metricSum sums the samples of metric whose labels contain match (any
// when empty) in the webhook's /metrics at addr (the probes port, plain
// HTTP).
func metricSum(ctx context.Context, addr netip.AddrPort, metric, match string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, fmt.Errorf("GET /metrics: %s: %s", resp.Status, b)
	}
	sum := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		name, _, _ := strings.Cut(l, " ")
		name, labels, _ := strings.Cut(name, "{")
		if name != metric || !strings.Contains(labels, match) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("/metrics line %q: %w", l, err)
		}
		sum += int(v)
	}
	return sum, sc.Err()
}
