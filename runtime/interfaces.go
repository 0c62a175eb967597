package runtime

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// RuleUnfencedInterface refuses a fenced pod whose network namespace has an
// interface besides the loopback and the pod interface (eth0) whose host
// veth the fence attaches to: a second network (Multus and the like) that
// is a macvlan, an ipvlan or an SR-IOV VF sends on a host NIC directly and
// never crosses the fence, and a second veth would need a second fence
// entry for one sandbox, which the fence does not keep.
const RuleUnfencedInterface = "network.unfenced_interface"

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
