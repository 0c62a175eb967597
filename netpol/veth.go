package netpol

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// DefaultPodInterface is the pod-side interface CNI plugins create.
const DefaultPodInterface = "eth0"

// HostVeth finds the host-side veth of a pod: it reads the peer index
// (IFLA_LINK) of podIf inside the network namespace at netnsPath (the OCI
// spec's linux.namespaces entry of type "network") and finds that interface
// in the caller's network namespace, checking that it points back. podIf ""
// means DefaultPodInterface. The caller's thread is never moved between
// namespaces: the pod side is read through a netlink socket opened there.
func HostVeth(netnsPath, podIf string) (ifindex int, name string, err error) {
	if podIf == "" {
		podIf = DefaultPodInterface
	}
	if netnsPath == "" {
		return 0, "", fmt.Errorf("netpol: host veth: netns path is empty")
	}
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return 0, "", fmt.Errorf("netpol: host veth: open netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, "", fmt.Errorf("netpol: host veth: netlink in %s: %w", netnsPath, err)
	}
	defer h.Close()
	pod, err := h.LinkByName(podIf)
	if err != nil {
		return 0, "", fmt.Errorf("netpol: host veth: %s in %s: %w", podIf, netnsPath, err)
	}
	if pod.Type() != "veth" {
		return 0, "", fmt.Errorf("netpol: host veth: %s in %s is a %s, not a veth", podIf, netnsPath, pod.Type())
	}
	peer := pod.Attrs().ParentIndex
	if peer == 0 {
		return 0, "", fmt.Errorf("netpol: host veth: %s in %s has no peer index", podIf, netnsPath)
	}
	if pod.Attrs().NetNsID < 0 {
		return 0, "", fmt.Errorf("netpol: host veth: the peer of %s in %s is in the pod's own namespace", podIf, netnsPath)
	}
	host, err := netlink.LinkByIndex(peer)
	if err != nil {
		return 0, "", fmt.Errorf("netpol: host veth: peer index %d of %s in %s: %w", peer, podIf, netnsPath, err)
	}
	// Interface indexes are per namespace: confirm the match points back.
	if host.Type() != "veth" || host.Attrs().ParentIndex != pod.Attrs().Index {
		return 0, "", fmt.Errorf("netpol: host veth: interface %d (%s) here is not the peer of %s in %s", peer, host.Attrs().Name, podIf, netnsPath)
	}
	return peer, host.Attrs().Name, nil
}
