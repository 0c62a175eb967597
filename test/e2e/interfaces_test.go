package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/test/node"
)

// secondNetwork attaches every pod the node starts from now on to a second
// CNI network, as Multus does: containerd with max_conf_num = 2 runs the
// conflist conf as the pod's eth1, in the same CNI ADD as eth0 and so before
// the shim creates the sandbox. containerd restarts to read it.
func secondNetwork(ctx context.Context, t *testing.T, pn *pipelineNode, conf string) {
	t.Helper()
	cfgPath := filepath.Join(pn.Dir(), "containerd.toml")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "max_conf_num = 2") {
		b = []byte(strings.Replace(string(b), "max_conf_num = 1", "max_conf_num = 2", 1))
		if !strings.Contains(string(b), "max_conf_num = 2") {
			t.Fatal("containerd.toml: no max_conf_num = 1 to raise")
		}
		if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(pn.Dir(), "cni", "20-second.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pn.RestartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
}

// hostVethPair makes a veth pair up in the host namespace (this kernel has
// no dummy device) to be a macvlan's master, removed with the test.
func hostVethPair(t *testing.T, name string) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "add", name, "type", "veth", "peer", "name", name+"p").CombinedOutput(); err != nil {
		t.Fatalf("ip link add %s: %v %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	for _, l := range []string{name, name + "p"} {
		if out, err := exec.Command("ip", "link", "set", l, "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set %s up: %v %s", l, err, out)
		}
	}
}

// TestExtraPodInterfaceRefused: a fenced pod whose network namespace has a
// second interface (Multus-style: a macvlan on a host NIC, or a second
// veth) is refused with [network.unfenced_interface] naming it, through CRI,
// on both runtimes, and nothing of it is left. Before, only eth0 was
// registered and the second network carried the pod's traffic to another
// tenant past the fence: the test shows that when a pod is admitted.
func TestExtraPodInterfaceRefused(t *testing.T) {
	if _, err := os.Stat("/usr/lib/cni/macvlan"); err != nil {
		t.Skip("needs the CNI macvlan plugin (Debian containernetworking-plugins)")
	}
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tag := fmt.Sprintf("%d", os.Getpid()%100000)
	master := "bhmv" + tag
	hostVethPair(t, master)
	macvlan := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "second-%s", "plugins": [{"type": "macvlan", "master": %q, "mode": "bridge",
  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "192.168.%d.0/24"}]]}}]}`,
		tag, master, filepath.Join(pn.Dir(), "cni-ipam-second"), 100+os.Getpid()%100)
	bridge := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "second-%s", "plugins": [{"type": "bridge", "bridge": %q,
  "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "192.168.%d.0/24"}]]}}]}`,
		tag, "bhsb"+tag, filepath.Join(pn.Dir(), "cni-ipam-second"), 100+os.Getpid()%100)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "bhsb"+tag).Run() })

	type pod struct {
		handler, ns string
	}
	pods := []pod{{node.Handler, "agents"}, {node.Handler, "research"}}
	if runcTierMissing() == "" {
		pods = append(pods, pod{node.RuncHandler, "platform"})
	}
	for _, second := range []struct{ name, conf, iface string }{
		{"macvlan", macvlan, "eth1 (macvlan)"},
		{"veth", bridge, "eth1 (veth)"},
	} {
		secondNetwork(ctx, t, pn, second.conf)
		admitted := map[string]string{} // namespace -> sandbox id
		for _, p := range pods {
			cfg := podConfig(pn.Node, "multi-"+second.name+"-"+p.ns, p.ns, nil)
			id, err := runPodOn(ctx, pn.Node, p.handler, cfg)
			if err != nil {
				if !strings.Contains(err.Error(), "[network.unfenced_interface] ") || !strings.Contains(err.Error(), second.iface) {
					t.Errorf("%s pod of %s on %s: %v, want a refusal naming [network.unfenced_interface] and %s", second.name, p.ns, p.handler, err, second.iface)
				} else {
					t.Logf("refused as expected: %v", err)
				}
				continue
			}
			t.Cleanup(func() { _ = removePod(context.Background(), pn.Node, id) })
			t.Errorf("%s pod of %s on %s admitted with %s in its network namespace; only eth0 is fenced", second.name, p.ns, p.handler, second.iface)
			admitted[p.ns] = id
		}
		if a, r := admitted["agents"], admitted["research"]; a != "" && r != "" && second.name == "macvlan" {
			showCrossing(ctx, t, pn, a, r)
		}
		if len(admitted) == 0 {
			if res := pn.ledger(t); len(res) != 0 {
				t.Errorf("ledger after the refusals: %d reservations left", len(res))
			}
		}
	}
}

// showCrossing reports whether pod a (tenant agents) reaches pod r (tenant
// research) over their second network, where the fence does not look.
func showCrossing(ctx context.Context, t *testing.T, pn *pipelineNode, a, r string) {
	t.Helper()
	cfgA := podConfig(pn.Node, "multi-macvlan-agents", "agents", nil)
	cfgR := podConfig(pn.Node, "multi-macvlan-research", "research", nil)
	ca, err := startContainer(ctx, pn.Node, a, cfgA, "main", "exec sleep 3600")
	if err != nil {
		t.Fatal(err)
	}
	cr, err := startContainer(ctx, pn.Node, r, cfgR, "main", "exec netprobe serve tcp:8080")
	if err != nil {
		t.Fatal(err)
	}
	out, err := execSync(ctx, pn.Node, cr, "sh", "-c", "ip -o -4 addr show dev eth1 | sed -n 's/.* inet \\([0-9.]*\\)\\/.*/\\1/p'")
	ip := strings.TrimSpace(out)
	if err != nil || ip == "" {
		t.Fatalf("research pod's eth1 address: %q, %v", out, err)
	}
	time.Sleep(300 * time.Millisecond) // server listening
	if _, err := execSync(ctx, pn.Node, ca, "netprobe", "tcp", ip+":8080"); err == nil {
		t.Errorf("agents reached research at %s:8080 over eth1 (macvlan): the fence never saw it", ip)
	} else {
		t.Logf("agents did not reach research over eth1: %v", err)
	}
}

// TestInterfaceAddedAfterSandboxRefusesContainers: an interface added to a
// fenced runc pod's network namespace after its sandbox was created (as
// Multus' dynamic networks or a host agent would) refuses the pod's next
// container with [network.unfenced_interface] naming it; the containers
// created before it keep running. A runc container uses every interface of
// its namespace at once, so the create is the last point the node can say
// no. (A gVisor sandbox copied its interfaces when it started and never
// sees a later one.)
func TestInterfaceAddedAfterSandboxRefusesContainers(t *testing.T) {
	if msg := runcTierMissing(); msg != "" {
		t.Skip(msg)
	}
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := podConfig(pn.Node, "late-interface", "platform", nil)
	id, err := runPodOn(ctx, pn.Node, node.RuncHandler, cfg)
	if err != nil {
		t.Fatalf("runc pod of platform: %v", err)
	}
	t.Cleanup(func() { _ = removePod(context.Background(), pn.Node, id) })
	first, err := startContainer(ctx, pn.Node, id, cfg, "first", "exec sleep 3600")
	if err != nil {
		t.Fatalf("first container, before any second interface: %v", err)
	}
	st, err := pn.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	nsPath := sandboxNetNS(t, st.GetInfo())
	peer := fmt.Sprintf("bhlate%d", os.Getpid()%100000)
	// eth1 in the pod, its peer in the host's namespace (PID 1's).
	if out, err := exec.Command("nsenter", "--net="+nsPath, "ip", "link", "add", "eth1", "type", "veth", "peer", "name", peer, "netns", "1").CombinedOutput(); err != nil {
		t.Fatalf("add eth1 to the pod: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", peer).Run() })
	if out, err := exec.Command("nsenter", "--net="+nsPath, "ip", "link", "set", "eth1", "up").CombinedOutput(); err != nil {
		t.Fatalf("set eth1 up: %v %s", err, out)
	}
	_, err = startContainer(ctx, pn.Node, id, cfg, "second", "exec sleep 3600")
	if err == nil {
		t.Fatal("second container created with eth1 added to the pod's namespace after its sandbox: only eth0 is fenced")
	}
	if !strings.Contains(err.Error(), "[network.unfenced_interface] ") || !strings.Contains(err.Error(), "eth1 (veth)") {
		t.Fatalf("second container: %v, want a refusal naming [network.unfenced_interface] and eth1 (veth)", err)
	}
	t.Logf("refused as expected: %v", err)
	if _, err := execSync(ctx, pn.Node, first, "true"); err != nil {
		t.Errorf("the first container no longer runs: %v", err)
	}
}
