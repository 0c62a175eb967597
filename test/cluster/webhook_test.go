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

	"github.com/bulkhead-runtime/bulkhead/deploy/image"
)

// testWebhookDeployment checks that the webhook runs as deploy/ deploys it:
// every replica of its Deployment Ready, on the image the test imported, on
// the nodes' default runtime (no RuntimeClass: runc, a real node's default),
// one per node (the preferred anti-affinity), its PodDisruptionBudget
// allowing one disruption, the caBundle its certificate rotator published,
// and the API server's reviews answered by its pods (their /metrics on the
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
		n, err := deniedReviews(ctx, netip.AddrPortFrom(ip, 9090))
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
	ca, err := c.Kubectl(ctx, "get", "validatingwebhookconfiguration", "bulkhead", "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}")
	if err != nil || strings.TrimSpace(ca) == "" {
		t.Errorf("ValidatingWebhookConfiguration bulkhead: no caBundle (%v): the rotator did not publish it", err)
	}
	t.Logf("$ kubectl -n %s get pods -o wide\n%s", webhookNamespace, mustOut(c.Kubectl(ctx, "-n", webhookNamespace, "get", "pods", "-o", "wide")))
}

// deniedReviews sums bulkhead_webhook_decisions_total{result="denied"} of
// the webhook's /metrics at addr (the probes port, plain HTTP).
func deniedReviews(ctx context.Context, addr netip.AddrPort) (int, error) {
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
		if !strings.HasPrefix(l, "bulkhead_webhook_decisions_total{") || !strings.Contains(l, `result="denied"`) {
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
