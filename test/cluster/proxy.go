package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// kube-proxy routes the cluster's Services for pods, as on any node: one
// process for the host, since the nodes share its network namespace and
// its nftables, in nftables mode so that everything it programs lives in
// tables of its own (ip and ip6 "kube-proxy"), which Stop deletes, and the
// host's iptables chains stay untouched. clusterCIDR is the pods' ranges:
// a pod's connection to a ClusterIP keeps its source address (no
// masquerade), so the backend pod's fence judges the sending pod. The
// conntrack and OOM settings are left as the host has them (zero: do not
// touch), since a test must not retune the machine's conntrack table.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
clusterCIDR: %s
detectLocalMode: ClusterCIDR
nodePortAddresses: [%s]
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`

// proxyTables are the nftables tables kube-proxy's nftables mode owns.
var proxyTables = [][2]string{{"ip", "kube-proxy"}, {"ip6", "kube-proxy"}}

// startProxy starts kube-proxy for the host and waits until it has
// programmed the Services once (/healthz).
func (c *Cluster) startProxy(ctx context.Context) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("cluster: kube-proxy's nftables mode needs nft (Debian nftables: make deps)")
	}
	for _, t := range proxyTables {
		if exec.CommandContext(ctx, "nft", "list", "table", t[0], t[1]).Run() == nil {
			return fmt.Errorf("cluster: nft table %s %s exists: another cluster's kube-proxy runs on this host (one test cluster with Services at a time)", t[0], t[1])
		}
	}
	kc, err := c.kubeconfig("kube-proxy", "system:kube-proxy")
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	metrics, err := freePort()
	if err != nil {
		return err
	}
	first := c.Nodes[0]
	var nodePorts []string
	for _, w := range c.Nodes {
		nodePorts = append(nodePorts, fmt.Sprintf("%q", w.Address+"/32"))
	}
	conf := filepath.Join(c.dir, "kube-proxy.yaml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(kubeProxyConfig, kc, first.Name, first.Address, healthz, metrics,
		strings.Join(c.opts.ClusterCIDRs, ","), strings.Join(nodePorts, ", "))), 0o644); err != nil {
		return err
	}
	p, err := c.run("kube-proxy", "--config="+conf)
	if err != nil {
		return err
	}
	c.proxy = true
	return waitFor(ctx, p, "kube-proxy /healthz", 2*time.Minute, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz: %s", resp.Status)
		}
		return nil
	})
}

// removeProxyTables deletes kube-proxy's tables once it has stopped (it
// leaves them behind on SIGTERM, as on a node it must); it returns what it
// could not delete, or "".
func (c *Cluster) removeProxyTables() string {
	if !c.proxy {
		return ""
	}
	var left []string
	for _, t := range proxyTables {
		if exec.Command("nft", "list", "table", t[0], t[1]).Run() != nil {
			continue
		}
		if out, err := exec.Command("nft", "delete", "table", t[0], t[1]).CombinedOutput(); err != nil {
			left = append(left, fmt.Sprintf("nft table %s %s: %v: %s", t[0], t[1], err, strings.TrimSpace(string(out))))
		}
	}
	return strings.Join(left, "; ")
}
