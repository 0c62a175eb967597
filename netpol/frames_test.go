package netpol

import (
	"encoding/binary"
	"net/netip"
)

// Hand-built frames for the verdict tests. Checksums are left zero: the
// fence never reads them.

var (
	podMAC   = []byte{0x02, 0, 0, 0, 0, 0x01}
	peerMAC  = []byte{0x02, 0, 0, 0, 0, 0x02}
	otherMAC = []byte{0x02, 0, 0, 0, 0, 0x05} // tenant B's pod
)

// fromMAC returns frame with its Ethernet source set to mac.
func fromMAC(mac []byte, frame []byte) []byte {
	f := append([]byte{}, frame...)
	copy(f[6:12], mac)
	return f
}

// nd6 is a neighbour discovery message with hop limit 255, as RFC 4861
// requires; target "" leaves the target field out (RS, RA).
func nd6(src, dst string, kind byte, target string) []byte {
	return hopLimit(255, ipv6(src, dst, protoICMPv6, icmp6(kind, target)))
}

// hopLimit sets the IPv6 hop limit of frame.
func hopLimit(n byte, frame []byte) []byte {
	f := append([]byte{}, frame...)
	f[ethHdrLen+7] = n
	return f
}

func ether(ethType uint16, payload []byte) []byte {
	b := append(append([]byte{}, peerMAC...), podMAC...)
	b = binary.BigEndian.AppendUint16(b, ethType)
	return append(b, payload...)
}

type v4opts struct {
	ihl     int    // header length in words; 0 means 5
	fragOff uint16 // fragment offset in 8-byte units
	version int    // 0 means 4
}

func ipv4(src, dst string, proto byte, l4 []byte, o v4opts) []byte {
	ihl := o.ihl
	if ihl == 0 {
		ihl = 5
	}
	version := o.version
	if version == 0 {
		version = 4
	}
	h := make([]byte, ihl*4)
	h[0] = byte(version<<4 | ihl&0xf)
	binary.BigEndian.PutUint16(h[2:], uint16(len(h)+len(l4)))
	binary.BigEndian.PutUint16(h[6:], o.fragOff&0x1fff)
	h[8] = 64
	h[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return ether(ethTypeIPv4, append(h, l4...))
}

// ext is one IPv6 extension header: its type and its 8-byte body.
type ext struct {
	kind    byte
	fragOff uint16 // for a fragment header
}

func ipv6(src, dst string, proto byte, l4 []byte, exts ...ext) []byte {
	h := make([]byte, ipv6HdrLen)
	h[0] = 6 << 4
	h[7] = 64
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	var chain []byte
	next := proto
	for i := len(exts) - 1; i >= 0; i-- {
		e := make([]byte, 8)
		e[0] = next
		if exts[i].kind == 44 {
			binary.BigEndian.PutUint16(e[2:], exts[i].fragOff<<3)
		}
		chain = append(e, chain...)
		next = exts[i].kind
	}
	h[6] = next
	binary.BigEndian.PutUint16(h[4:], uint16(len(chain)+len(l4)))
	return ether(ethTypeIPv6, append(append(h, chain...), l4...))
}

func udp(sport, dport uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint16(b, 8+4)
	return append(b, 0, 0, 'd', 'a', 't', 'a')
}

func tcp(sport, dport uint16) []byte {
	b := binary.BigEndian.AppendUint16(nil, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = append(b, make([]byte, 16)...)
	b[12] = 5 << 4
	b[13] = 0x02 // SYN
	return b
}

func icmpEcho() []byte { return []byte{8, 0, 0, 0, 0, 1, 0, 1} }

// icmp6 returns an ICMPv6 message; for ND types the target address follows.
func icmp6(kind byte, target string) []byte {
	b := []byte{kind, 0, 0, 0, 0, 0, 0, 0}
	if target != "" {
		t := netip.MustParseAddr(target).As16()
		b = append(b, t[:]...)
	}
	return b
}

func arp(senderIP, targetIP string) []byte {
	return arpFrom(podMAC, senderIP, targetIP)
}

// arpFrom is an ARP request whose sender hardware address is mac.
func arpFrom(mac []byte, senderIP, targetIP string) []byte {
	b := []byte{0, 1, 8, 0, 6, 4, 0, 1}
	b = append(b, mac...)
	s := netip.MustParseAddr(senderIP).As4()
	b = append(b, s[:]...)
	b = append(b, 0, 0, 0, 0, 0, 0)
	t := netip.MustParseAddr(targetIP).As4()
	b = append(b, t[:]...)
	return ether(ethTypeARP, b)
}

// ndOpts appends neighbour discovery options to an ND frame (nd6) and
// sets its IPv6 payload length to match.
func ndOpts(frame []byte, opts ...[]byte) []byte {
	f := append([]byte{}, frame...)
	for _, o := range opts {
		f = append(f, o...)
	}
	binary.BigEndian.PutUint16(f[ethHdrLen+4:], uint16(len(f)-ethHdrLen-ipv6HdrLen))
	return f
}

// lla is a link-layer address option: kind 1 (source) or 2 (target).
func lla(kind byte, mac []byte) []byte { return append([]byte{kind, 1}, mac...) }

// ndOpt is an option of kind with units*8 bytes, its body zero.
func ndOpt(kind, units byte, size int) []byte {
	o := make([]byte, size)
	o[0], o[1] = kind, units
	return o
}

// trailer appends n bytes past the IPv6 payload, as Ethernet padding would.
func trailer(frame []byte, n int) []byte {
	return append(append([]byte{}, frame...), make([]byte, n)...)
}
