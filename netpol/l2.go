package netpol

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// fillLinkAddrs completes the endpoint's link-layer fields that the caller
// left unset: the pod's MAC and IPv6 link-local address, read from the pod's
// end of the host veth, and the node's router link-local address, read from
// the host veth's bridge. The pod's end is read through the netnsid the host
// namespace holds for the pod's namespace (IFLA_TARGET_NETNSID), so the
// caller needs no path to that namespace and no thread changes namespace.
func fillLinkAddrs(e *Endpoint, host netlink.Link) error {
	if e.MAC == nil || !e.LinkLocal.IsValid() {
		mac, ll, err := peerAddrs(host)
		if err != nil {
			return err
		}
		if e.MAC == nil {
			e.MAC = HardwareAddr(mac)
		}
		if !e.LinkLocal.IsValid() {
			e.LinkLocal = ll
		}
		if !e.LinkLocal.IsValid() {
			// The pod has no link-local address yet (or IPv6 is off in it):
			// the one the kernel and gVisor would form from the MAC.
			e.LinkLocal = eui64LinkLocal(net.HardwareAddr(e.MAC))
		}
	}
	if !e.RouterLinkLocal.IsValid() {
		r, err := routerLinkLocal(host)
		if err != nil {
			return err
		}
		e.RouterLinkLocal = r
	}
	return e.validate()
}

// peerAddrs returns the MAC and the first IPv6 link-local address of the
// other end of the veth host.
func peerAddrs(host netlink.Link) (net.HardwareAddr, netip.Addr, error) {
	var none netip.Addr
	if host.Type() != "veth" {
		return nil, none, fmt.Errorf("%s is a %s, not a veth: set Endpoint.MAC and Endpoint.LinkLocal", host.Attrs().Name, host.Type())
	}
	peer, nsid := host.Attrs().ParentIndex, host.Attrs().NetNsID
	if peer == 0 {
		return nil, none, fmt.Errorf("veth %s has no peer index", host.Attrs().Name)
	}
	var (
		link  netlink.Link
		addrs []netip.Addr
		err   error
	)
	if nsid < 0 {
		// Both ends in this namespace.
		if link, err = netlink.LinkByIndex(peer); err == nil {
			var as []netlink.Addr
			as, err = netlink.AddrList(link, netlink.FAMILY_V6)
			for _, a := range as {
				if ip, ok := netip.AddrFromSlice(a.IP); ok {
					addrs = append(addrs, ip)
				}
			}
		}
	} else {
		link, addrs, err = linkInNetNS(nsid, peer)
	}
	if err != nil {
		return nil, none, fmt.Errorf("peer of veth %s (index %d, netnsid %d): %w", host.Attrs().Name, peer, nsid, err)
	}
	mac := link.Attrs().HardwareAddr
	if len(mac) != 6 {
		return nil, none, fmt.Errorf("peer of veth %s has no Ethernet address", host.Attrs().Name)
	}
	for _, a := range addrs {
		if a.Is6() && a.IsLinkLocalUnicast() {
			return mac, a, nil
		}
	}
	return mac, none, nil
}

// routerLinkLocal returns the link-local address the node uses on the pod's
// link: the host veth's bridge's, or the host veth's own when it has no
// master (a routed CNI). The zero Addr when there is none.
func routerLinkLocal(host netlink.Link) (netip.Addr, error) {
	l := host
	if m := host.Attrs().MasterIndex; m != 0 {
		var err error
		if l, err = netlink.LinkByIndex(m); err != nil {
			return netip.Addr{}, fmt.Errorf("bridge of %s (index %d): %w", host.Attrs().Name, m, err)
		}
	}
	as, err := netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("addresses of %s: %w", l.Attrs().Name, err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
			return ip, nil
		}
	}
	return netip.Addr{}, nil
}

// nodeAddrs returns the addresses of the caller's network namespace (the
// node's) of global scope, loopback excluded, as host prefixes: the
// sources a pod sees for NodePort, LoadBalancer and host-network traffic
// after the node's NAT, whoever sent it. Addresses inside covered are left
// out (kube-proxy's IPVS mode puts every Service IP on the node).
func nodeAddrs(covered []netip.Prefix) ([]netip.Prefix, error) {
	as, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("node addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		ip = ip.Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() || containedIn(ip, covered) {
			continue
		}
		out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return out, nil
}

func containedIn(ip netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// eui64LinkLocal is fe80::/64 with the modified EUI-64 interface identifier
// of mac (RFC 4291 appendix A).
func eui64LinkLocal(mac net.HardwareAddr) netip.Addr {
	if len(mac) != 6 {
		return netip.Addr{}
	}
	a := [16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 0x02, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]}
	return netip.AddrFrom16(a)
}

// linkInNetNS reads interface index of the namespace the caller's namespace
// knows as nsid, and its IPv6 addresses, with one strict-checking netlink
// socket (the kernel honours IFA_TARGET_NETNSID on dumps only then).
func linkInNetNS(nsid, index int) (netlink.Link, []netip.Addr, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, nil, fmt.Errorf("netlink bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		return nil, nil, fmt.Errorf("netlink strict checking: %w", err)
	}
	target := nl.Uint32Attr(uint32(nsid))

	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, 0)
	ifi := nl.NewIfInfomsg(unix.AF_UNSPEC)
	ifi.Index = int32(index)
	req.AddData(ifi)
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, target))
	msgs, err := netlinkRoundTrip(fd, req)
	if err != nil {
		return nil, nil, fmt.Errorf("get link: %w", err)
	}
	if len(msgs) != 1 || msgs[0].Header.Type != unix.RTM_NEWLINK {
		return nil, nil, fmt.Errorf("get link: %d unexpected replies", len(msgs))
	}
	link, err := netlink.LinkDeserialize(nil, msgs[0].Data)
	if err != nil {
		return nil, nil, fmt.Errorf("get link: %w", err)
	}

	req = nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	ifa := nl.NewIfAddrmsg(unix.AF_INET6)
	ifa.Index = uint32(index)
	req.AddData(ifa)
	req.AddData(nl.NewRtAttr(unix.IFA_TARGET_NETNSID, target))
	msgs, err = netlinkRoundTrip(fd, req)
	if err != nil {
		return nil, nil, fmt.Errorf("list addresses: %w", err)
	}
	var addrs []netip.Addr
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWADDR || len(m.Data) < unix.SizeofIfAddrmsg {
			continue
		}
		if nl.DeserializeIfAddrmsg(m.Data).Index != uint32(index) {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofIfAddrmsg:])
		if err != nil {
			return nil, nil, fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFA_ADDRESS {
				if ip, ok := netip.AddrFromSlice(a.Value); ok {
					addrs = append(addrs, ip)
				}
			}
		}
	}
	return link, addrs, nil
}

// netlinkRoundTrip sends req on fd and collects its replies, up to the end
// of a dump or the single reply of a plain request.
func netlinkRoundTrip(fd int, req *nl.NetlinkRequest) ([]syscall.NetlinkMessage, error) {
	if err := unix.Sendto(fd, req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	dump := req.Flags&unix.NLM_F_DUMP != 0
	var out []syscall.NetlinkMessage
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Seq != req.Seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("short netlink error")
				}
				if errno := -int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 {
					return nil, syscall.Errno(errno)
				}
				return out, nil
			}
			out = append(out, m)
			if !dump {
				return out, nil
			}
		}
	}
}
