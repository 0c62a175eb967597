package runtime

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// fencePod registers the running sandbox's host veth in the fence, as the
// decision configures it. The entry is recorded in the ledger before it is
// made, so a crash in between leaves a reservation that GC can release.
func (p *Pipeline) fencePod(ctx context.Context, sb *node.Sandbox, a *Admission) error {
	if err := p.fail(StepFence); err != nil {
		return err
	}
	res, d := a.Reservation, a.Decision
	switch {
	case p.node.Fence() == nil:
		log.G(ctx).Warnf("sandbox %s: NOT FENCED: netpol.enabled = false on this node, so nothing stops its traffic to other tenants, the metadata service or outside its egress allow-list", sb.ID)
		return nil
	case sb.NetNS == "":
		log.G(ctx).Warnf("sandbox %s: host network, allowed by tier %q: the fence does not apply to it", sb.ID, res.Tier)
		return nil
	case d.Network.Isolation == "none":
		return nil
	}
	t := time.Now()
	ifindex, ifname, err := netpol.HostVeth(sb.NetNS, "")
	if err != nil {
		return fmt.Errorf("sandbox %s: find host veth: %w", sb.ID, err)
	}
	ep := netpol.Endpoint{SandboxID: sb.ID, Ifindex: ifindex, Tenant: res.Tenant, Tier: res.Tier}
	v4, v6, err := podAddrs(sb.NetNS)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if err := checkInterfaces(sb, res); err != nil {
		return err
	}
	t = starttrace.Since(ctx, "fence.netns", t)
	ep.IPv4, ep.IPv6 = v4, v6
	ep.AllowRDMA = d.RDMA == policy.RDMAOwnVF
	ep.DenyMetadata = d.Network.DenyMetadata
	if ep.DenyMetadata {
		for _, c := range d.Network.MetadataCIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				return fmt.Errorf("decision.network.metadata_cidrs: %q: %w", c, err)
			}
			ep.MetadataCIDRs = append(ep.MetadataCIDRs, pfx)
		}
	}
	if d.Network.EgressCIDRs != nil {
		ep.EgressCIDRs = []netip.Prefix{}
		for _, c := range d.Network.EgressCIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				return fmt.Errorf("decision.network.egress_cidrs: %q: %w", c, err)
			}
			ep.EgressCIDRs = append(ep.EgressCIDRs, pfx)
		}
	}
	res.Endpoint = &node.FenceRecord{Ifindex: ifindex, Ifname: ifname}
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			res.Endpoint.IPs = append(res.Endpoint.IPs, a.String())
		}
	}
	if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
		return err
	}
	t = starttrace.Since(ctx, "fence.ledger", t)
	if err := p.node.Fence().Register(ctx, ep); err != nil {
		return fmt.Errorf("sandbox %s: fence: %w", sb.ID, err)
	}
	starttrace.Since(ctx, "fence.register", t)
	return nil
}

// podAddrs reads the pod's addresses on its eth0 through a netlink socket
// opened in its network namespace.
func podAddrs(netnsPath string) (v4, v6 netip.Addr, err error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer h.Close()
	link, err := h.LinkByName(netpol.DefaultPodInterface)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %s: %w", netnsPath, netpol.DefaultPodInterface, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return v4, v6, err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case ip.Is6() && !ip.IsLinkLocalUnicast() && !v6.IsValid():
			v6 = ip
		}
	}
	if !v4.IsValid() && !v6.IsValid() {
		return v4, v6, fmt.Errorf("netns %s: %s has no address", netnsPath, netpol.DefaultPodInterface)
	}
	return v4, v6, nil
}

// RuleUnfencedInterface refuses a fenced pod whose network namespace has an
// interface besides the loopback and the pod interface (eth0) whose host
// veth the fence attaches to: a second network (Multus and the like) that
// is a macvlan, an ipvlan or an SR-IOV VF sends on a host NIC directly and
// never crosses the fence, and a second veth would need a second fence
// entry for one sandbox, which the fence does not keep.
const RuleUnfencedInterface = "network.unfenced_interface"

// checkInterfaces refuses the fenced pod of sandbox sb, reserved as res,
// when its network namespace has an interface the fence would not cover.
// CNI (Multus' delegates included) has made every interface the pod starts
// with before containerd creates the sandbox, for runc and gVisor alike.
func checkInterfaces(sb *node.Sandbox, res *node.Reservation) error {
	extra, err := unfencedInterfaces(sb.NetNS)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if len(extra) == 0 {
		return nil
	}
	return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: res.Tenant, Reasons: []policy.Reason{{
		Rule: RuleUnfencedInterface,
		Message: fmt.Sprintf("the pod's network namespace has %s besides %s: the fence covers only %s's host veth, so another interface would carry the pod's traffic past it (tier %q is fenced)",
			strings.Join(extra, ", "), netpol.DefaultPodInterface, netpol.DefaultPodInterface, res.Tier),
	}}}
}

// unfencedInterfaces lists, as "name (type)", the interfaces of the network
// namespace at netnsPath that could carry the pod's traffic past the fence:
// every one but the loopback and netpol.DefaultPodInterface that is up or
// has an address other than a link-local one. An interface down without an
// address carries nothing, and the kernel makes such devices in every
// namespace (tunl0, sit0, gre0, ... when their modules are loaded); gVisor
// skips down interfaces when it takes the namespace's at the sandbox's start.
func unfencedInterfaces(netnsPath string) ([]string, error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netns %s: list interfaces: %w", netnsPath, err)
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if a.Name == netpol.DefaultPodInterface || a.Flags&net.FlagLoopback != 0 {
			continue
		}
		carries := a.Flags&net.FlagUp != 0
		if !carries {
			addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
			if err != nil {
				return nil, fmt.Errorf("netns %s: %s: %w", netnsPath, a.Name, err)
			}
			for _, ad := range addrs {
				if ip, ok := netip.AddrFromSlice(ad.IP); ok && !ip.Unmap().IsLinkLocalUnicast() {
					carries = true
				}
			}
		}
		if carries {
			out = append(out, fmt.Sprintf("%s (%s)", a.Name, l.Type()))
		}
	}
	return out, nil
}
