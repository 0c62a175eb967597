package netpol

import (
	"encoding/binary"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Verdicts returned by the fence. Under TCX, TCX_NEXT hands the packet to the
// next program on the interface (the CNI's); under clsact/cls_bpf with
// direct-action the same value is TC_ACT_UNSPEC, which continues with the next
// filter. TCX_DROP and TC_ACT_SHOT are both 2.
const (
	verdictNext = -1
	verdictDrop = 2
)

// Reason is why the fence dropped a packet. Every drop increments exactly one
// per-tenant, per-reason, per-CPU counter.
type Reason uint32

const (
	// ReasonMalformed: a truncated frame or a bad IP header.
	ReasonMalformed Reason = iota
	// ReasonEthertype: neither IPv4, IPv6 nor ARP, or a VLAN-tagged frame.
	ReasonEthertype
	// ReasonSpoof: the pod sent from an address that is not its own.
	ReasonSpoof
	// ReasonTenant: the peer belongs to another tenant.
	ReasonTenant
	// ReasonRDMA: RoCEv2 (UDP 4791) without an RDMA grant on both ends of one tenant.
	ReasonRDMA
	// ReasonMetadata: a cloud credential endpoint (Endpoint.MetadataCIDRs),
	// for a tier that denies them.
	ReasonMetadata
	// ReasonEgress: a peer outside the cluster that is not on the pod's egress allow-list.
	ReasonEgress
	// ReasonCluster: an in-cluster or link-local address that no tenant owns
	// and that is not a shared service of the pod's tier.
	ReasonCluster
	// ReasonND: neighbour discovery or MLD that a host has no business
	// sending or receiving: a router advertisement or redirect from a pod or
	// not from the node's router, a hop limit other than 255, a destination
	// that is not a neighbour-discovery address, a solicitation for an
	// address that is not the pod's.
	ReasonND
	// ReasonDst: a packet delivered to the pod whose destination is not the
	// pod's own address, broadcast or multicast.
	ReasonDst

	numReasons
)

var reasonNames = [numReasons]string{"malformed", "ethertype", "spoof", "tenant", "rdma", "metadata", "egress", "cluster", "nd", "dst"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Reasons lists every drop reason in counter order.
func Reasons() []Reason {
	out := make([]Reason, numReasons)
	for i := range out {
		out[i] = Reason(i)
	}
	return out
}

// Endpoint flags, stored in endpointValue.Flags and in owner.Flags.
const (
	flagRDMA             = 1 << 0
	flagDenyMetadata     = 1 << 1
	flagEgressRestricted = 1 << 2
	flagHasIPv4          = 1 << 3
	flagHasIPv6          = 1 << 4
	// flagRemote marks an owner that is not a pod of this node: a tenant
	// range configured in Options or, with flagRemotePod, a remote pod.
	flagRemote = 1 << 5
	// flagClsact records that the endpoint's programs are clsact filters, not TCX links.
	flagClsact = 1 << 6
	// flagHasLinkLocal: endpointValue.LinkLocal holds the pod's IPv6 link-local address.
	flagHasLinkLocal = 1 << 7
	// flagHasRouter: endpointValue.Router holds the node's link-local address,
	// the only source of router advertisements, redirects and MLD queries.
	flagHasRouter = 1 << 8
	// flagRemotePod marks a remote pod's address (Manager.SetRemote), kept
	// apart from the configured ranges so that neither replaces the other.
	flagRemotePod = 1 << 9
)

// Map names; each map is pinned under Options.PinDir with this name.
const (
	mapEndpoints = "endpoints"
	mapTenantV4  = "tenant_v4"
	mapTenantV6  = "tenant_v6"
	mapOwnerV4   = "owner_v4"
	mapOwnerV6   = "owner_v6"
	mapServiceV4 = "service_v4"
	mapServiceV6 = "service_v6"
	mapEgressV4  = "egress_v4"
	mapEgressV6  = "egress_v6"
	mapClusterV4 = "cluster_v4"
	mapClusterV6 = "cluster_v6"
	mapDrops     = "drops"
	mapTenantIDs = "tenant_ids"
	mapTierIDs   = "tier_ids"
	// mapOwnerMAC says which tenant's pod a MAC address is: the sender of
	// an ARP message delivered to a pod is judged by it.
	mapOwnerMAC = "owner_mac"
	// mapMetadataV4/V6 hold, scoped by ifindex, the credential endpoints a
	// pod that denies metadata may not exchange packets with.
	mapMetadataV4 = "metadata_v4"
	mapMetadataV6 = "metadata_v6"
)

// Sizes of the node-wide maps.
const (
	maxEndpoints = 1 << 17
	maxPrefixes  = 1 << 17
	maxNames     = 1 << 16
	// maxCounters has room for 16 reasons of every tenant.
	maxCounters = maxNames * 16
	// nameLen bounds tenant and tier names (and so map keys).
	nameLen = 64
	// sandboxLen bounds sandbox ids kept in the endpoint map.
	sandboxLen = 64
)

// endpointValue is the endpoints map value, keyed by the host-side ifindex.
// The programs read the first 72 bytes; the rest is bookkeeping for the Manager.
type endpointValue struct {
	Tenant    uint32
	Flags     uint32
	Tier      uint32
	IPv4      [4]byte
	IPv6      [16]byte
	LinkLocal [16]byte
	Router    [16]byte
	MAC       [6]byte
	_         [2]byte
	Ifname    [16]byte
	Sandbox   [sandboxLen]byte
}

// endpointValueSize is the size of endpointValue in the map.
const endpointValueSize = 152

// Offsets into endpointValue read by the programs.
const (
	epTenant    = 0
	epFlags     = 4
	epTier      = 8
	epIPv4      = 12
	epIPv6      = 16
	epLinkLocal = 32
	epRouter    = 48
	epMAC       = 64
)

// owner is the value of the tenant LPM tries: who owns an address.
type owner struct {
	Tenant  uint32
	Flags   uint32
	Ifindex uint32
}

// Keys of the LPM tries. Unscoped keys map an address to a tenant or mark it
// in-cluster; scoped keys prefix the address with a tier id (shared services)
// or an ifindex (egress allow-list), so one trie serves every tier or pod.
type (
	lpmKeyV4 struct {
		Prefixlen uint32
		Addr      [4]byte
	}
	lpmKeyV6 struct {
		Prefixlen uint32
		Addr      [16]byte
	}
	scopedKeyV4 struct {
		Prefixlen uint32
		Scope     uint32
		Addr      [4]byte
	}
	scopedKeyV6 struct {
		Prefixlen uint32
		Scope     uint32
		Addr      [16]byte
	}
)

// dropKey is the key of the drop counters (layout 2; layout 1 packed both
// in one word, tenant<<4|reason).
type dropKey struct {
	Tenant uint32
	Reason uint32
}

// nameKey is the key of the tenant and tier name maps.
type nameKey [nameLen]byte

// mapSpecs returns the specifications of every map the programs and the
// Manager use. pin selects whether they are pinned by name.
func mapSpecs(pin bool) map[string]*ebpf.MapSpec {
	pinning := ebpf.PinNone
	if pin {
		pinning = ebpf.PinByName
	}
	lpm := func(name string, keySize, valueSize uint32) *ebpf.MapSpec {
		return &ebpf.MapSpec{Name: name, Type: ebpf.LPMTrie, KeySize: keySize, ValueSize: valueSize,
			MaxEntries: maxPrefixes, Flags: flagNoPrealloc, Pinning: pinning}
	}
	specs := []*ebpf.MapSpec{
		{Name: mapEndpoints, Type: ebpf.Hash, KeySize: 4, ValueSize: endpointValueSize, MaxEntries: maxEndpoints,
			Flags: flagNoPrealloc, Pinning: pinning},
		lpm(mapTenantV4, 8, 12),
		lpm(mapTenantV6, 20, 12),
		// Single addresses (every pod's, link-local ones included) are
		// looked up by exact match: at 100k pods a hash lookup costs a
		// fraction of a trie walk. Each pod has up to two IPv6 addresses.
		{Name: mapOwnerV4, Type: ebpf.Hash, KeySize: 4, ValueSize: 12, MaxEntries: maxEndpoints,
			Flags: flagNoPrealloc, Pinning: pinning},
		{Name: mapOwnerV6, Type: ebpf.Hash, KeySize: 16, ValueSize: 12, MaxEntries: 2 * maxEndpoints,
			Flags: flagNoPrealloc, Pinning: pinning},
		lpm(mapServiceV4, 12, 1),
		lpm(mapServiceV6, 24, 1),
		lpm(mapEgressV4, 12, 1),
		lpm(mapEgressV6, 24, 1),
		lpm(mapClusterV4, 8, 1),
		lpm(mapClusterV6, 20, 1),
		{Name: mapDrops, Type: ebpf.PerCPUHash, KeySize: 8, ValueSize: 8, MaxEntries: maxCounters,
			Flags: flagNoPrealloc, Pinning: pinning},
		{Name: mapTenantIDs, Type: ebpf.Hash, KeySize: nameLen, ValueSize: 4, MaxEntries: maxNames, Pinning: pinning},
		{Name: mapTierIDs, Type: ebpf.Hash, KeySize: nameLen, ValueSize: 4, MaxEntries: 256, Pinning: pinning},
		{Name: mapOwnerMAC, Type: ebpf.Hash, KeySize: 8, ValueSize: 12, MaxEntries: maxEndpoints,
			Flags: flagNoPrealloc, Pinning: pinning},
		lpm(mapMetadataV4, 12, 1),
		lpm(mapMetadataV6, 24, 1),
	}
	out := make(map[string]*ebpf.MapSpec, len(specs))
	for _, s := range specs {
		out[s.Name] = s
	}
	return out
}

// flagNoPrealloc is BPF_F_NO_PREALLOC: LPM tries require it, and it keeps the
// large hashes from reserving memory for entries a node never has.
const flagNoPrealloc = 1

// Direction says which hook of the host-side veth a program serves.
type Direction int

const (
	// FromPod is the host veth's ingress: packets the pod sends.
	FromPod Direction = iota
	// ToPod is the host veth's egress: packets delivered to the pod.
	ToPod
)

func (d Direction) String() string {
	if d == FromPod {
		return "from-pod"
	}
	return "to-pod"
}

// programSpecs returns the two fence programs.
func programSpecs() map[string]*ebpf.ProgramSpec {
	return map[string]*ebpf.ProgramSpec{
		programName(FromPod): {Name: programName(FromPod), Type: ebpf.SchedCLS, License: "GPL",
			AttachType: ebpf.AttachTCXIngress, Instructions: fenceProgram(FromPod)},
		programName(ToPod): {Name: programName(ToPod), Type: ebpf.SchedCLS, License: "GPL",
			AttachType: ebpf.AttachTCXEgress, Instructions: fenceProgram(ToPod)},
	}
}

// collectionSpec is the whole datapath: maps and programs.
func collectionSpec(pin bool) *ebpf.CollectionSpec {
	return &ebpf.CollectionSpec{Maps: mapSpecs(pin), Programs: programSpecs()}
}

// be16 and be32 turn a value in network byte order into the integer a native
// load of those packet bytes yields, so programs compare without byte swaps.
func be16(v uint16) int32 {
	return int32(binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, v)))
}

func be32(v uint32) int32 {
	return int32(binary.NativeEndian.Uint32(binary.BigEndian.AppendUint32(nil, v)))
}

// __sk_buff offsets (include/uapi/linux/bpf.h).
const (
	skbLen         = 0
	skbVlanPresent = 20
	skbIfindex     = 40
	skbData        = 76
	skbDataEnd     = 80
)

// Stack slots (offsets from R10).
const (
	stIfindex = -4 // u32 ifindex, the endpoints key
	// stDropKey is the drop counter key (dropKey: tenant, then reason). The
	// drop path ends the program, so it may reuse the ifindex's slot.
	stDropKey = -8
	stDropVal = -16 // u64 initial counter value
	stKeyV4   = -32 // 12-byte v4 LPM key
	stPeerV6  = -48 // 16-byte saved IPv6 peer
	stKeyV6   = -72 // 24-byte v6 LPM key
)

// Well-known values.
const (
	ethHdrLen   = 14
	ethTypeIPv4 = 0x0800
	ethTypeIPv6 = 0x86dd
	ethTypeARP  = 0x0806
	// arpLen is an ARP message for IPv4 over Ethernet (RFC 826): the only
	// kind a pod sends or receives.
	arpLen = 28
	// ethFrameMin is the shortest Ethernet frame without its FCS: a NIC
	// pads shorter ones (an ARP message among them) to it with zeros.
	ethFrameMin   = 60
	protoUDP      = 17
	protoICMPv6   = 58
	roceV2Port    = 4791
	ipv4HdrMin    = 20
	ipv6HdrLen    = 40
	maxExtHeaders = 4
	// maxNDOptions bounds the options of one neighbour discovery message
	// the pod sends (hosts send one or two: a link-layer address, a nonce).
	maxNDOptions = 6
)

// fenceProgram assembles the program for one direction. Registers:
//
//	R6 skb, R7 endpoint value, R8 IPv4 peer (later: drop reason),
//	R9 1 when the packet is RoCEv2, R2/R3 packet start/end,
//	R4 the L4 header (IPv6) or the packet start plus the IPv4 header length.
func fenceProgram(dir Direction) asm.Instructions {
	p := &prog{}
	p.emit(
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R1, asm.R6, skbIfindex, asm.Word),
		asm.StoreMem(asm.RFP, stIfindex, asm.R1, asm.Word),
		asm.LoadMapPtr(asm.R1, 0).WithReference(mapEndpoints),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stIfindex),
		asm.FnMapLookupElem.Call(),
		// An interface Bulkhead does not manage is untouched.
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R1, asm.R6, skbVlanPresent, asm.Word),
		asm.JNE.Imm(asm.R1, 0, p.dropLabel(ReasonEthertype)),
	)
	p.loadPacket()
	p.need(asm.R2, ethHdrLen)
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, 12, asm.Half),
		asm.JEq.Imm(asm.R1, be16(ethTypeIPv4), "l2"),
		asm.JEq.Imm(asm.R1, be16(ethTypeIPv6), "l2"),
		asm.JEq.Imm(asm.R1, be16(ethTypeARP), "l2"),
		asm.Ja.Label(p.dropLabel(ReasonEthertype)),
	)
	p.at("l2")
	if dir == FromPod {
		// The pod sends only from its own MAC: a frame from another pod's
		// would teach the bridge to deliver that pod's traffic here.
		p.macDiffers(asm.R2, 6, p.dropLabel(ReasonSpoof))
	}
	p.emit(
		asm.JEq.Imm(asm.R1, be16(ethTypeIPv4), "ipv4"),
		asm.JEq.Imm(asm.R1, be16(ethTypeIPv6), "ipv6"),
		asm.Ja.Label("arp"),
	)
	p.arp(dir)
	p.ipv4(dir)
	p.ipv6(dir)
	p.tenantMatch()
	p.epilogue()
	return p.insns
}

type prog struct {
	insns asm.Instructions
	// label is the symbol for the next emitted instruction.
	label string
	// uniq numbers generated labels.
	uniq int
	// drops records which drop reasons have a jump target to emit.
	drops [numReasons]bool
}

func (p *prog) emit(insns ...asm.Instruction) {
	for _, ins := range insns {
		if p.label != "" {
			ins = ins.WithSymbol(p.label)
			p.label = ""
		}
		p.insns = append(p.insns, ins)
	}
}

// at places label on the next instruction.
func (p *prog) at(label string) {
	if p.label != "" {
		// Two labels on one spot: chain them with a no-op jump.
		p.emit(asm.Ja.Label(label))
	}
	p.label = label
}

func (p *prog) newLabel(base string) string {
	p.uniq++
	return fmt.Sprintf("%s_%d", base, p.uniq)
}

func (p *prog) dropLabel(r Reason) string {
	p.drops[r] = true
	return "drop_" + r.String()
}

// loadPacket sets R2 and R3 to the packet's start and end.
func (p *prog) loadPacket() {
	p.emit(
		asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
	)
}

// need drops the packet as malformed unless n bytes from base are present.
func (p *prog) need(base asm.Register, n int32) {
	p.emit(
		asm.Mov.Reg(asm.R1, base),
		asm.Add.Imm(asm.R1, n),
		asm.JGT.Reg(asm.R1, asm.R3, p.dropLabel(ReasonMalformed)),
	)
}

// flagClear jumps to label when the endpoint lacks flag. Clobbers R1.
func (p *prog) flagClear(flag int32, label string) {
	skip := p.newLabel("has_flag")
	p.emit(
		asm.LoadMem(asm.R1, asm.R7, epFlags, asm.Word),
		asm.JSet.Imm(asm.R1, flag, skip),
		asm.Ja.Label(label),
	)
	p.at(skip)
}

// lookup calls bpf_map_lookup_elem on mapName with the key at stack offset key.
func (p *prog) lookup(mapName string, key int16) {
	p.emit(
		asm.LoadMapPtr(asm.R1, 0).WithReference(mapName),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.FnMapLookupElem.Call(),
	)
}

// peerFamily selects the peer address a scoped lookup keys on.
type peerFamily bool

const (
	peerV4 peerFamily = false // the IPv4 peer in R8
	peerV6 peerFamily = true  // the IPv6 peer saved at stPeerV6
)

// lookupScoped calls bpf_map_lookup_elem on the scoped LPM trie mapName
// (egress, metadata: scoped by ifindex; service: by tier) with the key
// {the u32 scope at scope+scopeOff, the peer of family f}, built at stKeyV4
// or stKeyV6. Clobbers R1.
func (p *prog) lookupScoped(mapName string, f peerFamily, scope asm.Register, scopeOff int16) {
	key, bits := int16(stKeyV4), int32(32+32)
	if f == peerV6 {
		key, bits = stKeyV6, 32+128
	}
	p.emit(
		asm.StoreImm(asm.RFP, key, int64(bits), asm.Word),
		asm.LoadMem(asm.R1, scope, scopeOff, asm.Word),
		asm.StoreMem(asm.RFP, key+4, asm.R1, asm.Word),
	)
	if f == peerV6 {
		p.copyWords(asm.RFP, key+8, asm.RFP, stPeerV6, 4)
	} else {
		p.emit(asm.StoreMem(asm.RFP, key+8, asm.R8, asm.Word))
	}
	p.lookup(mapName, key)
}

// lookupOwner finds who owns the address in the LPM key at stack offset key:
// a pod's address by exact match in hash (jumping to tenant_match with R0 at
// its owner), otherwise R0 is the trie's longest match, or 0.
func (p *prog) lookupOwner(hash, trie string, key int16) {
	p.lookup(hash, key+4)
	p.emit(asm.JNE.Imm(asm.R0, 0, "tenant_match"))
	p.lookup(trie, key)
}

// copyWords copies n 32-bit words from src+srcOff to dst+dstOff through R1.
func (p *prog) copyWords(dst asm.Register, dstOff int16, src asm.Register, srcOff int16, n int) {
	for i := range int16(n) {
		p.emit(
			asm.LoadMem(asm.R1, src, srcOff+4*i, asm.Word),
			asm.StoreMem(dst, dstOff+4*i, asm.R1, asm.Word),
		)
	}
}

// wordsDiffer jumps to label unless the 16 bytes at a+aOff equal those at
// b+bOff, compared as two double words (packet loads may be unaligned; the
// map value and stack offsets used are multiples of 8). Clobbers R1 and R5.
func (p *prog) wordsDiffer(a asm.Register, aOff int16, b asm.Register, bOff int16, label string) {
	for i := range int16(2) {
		p.emit(
			asm.LoadMem(asm.R1, a, aOff+8*i, asm.DWord),
			asm.LoadMem(asm.R5, b, bOff+8*i, asm.DWord),
			asm.JNE.Reg(asm.R1, asm.R5, label),
		)
	}
}

// linkLocalV6 jumps to label when the address at r+off is in fe80::/10.
// Clobbers R1.
func (p *prog) linkLocalV6(r asm.Register, off int16, label string) {
	p.emit(
		asm.LoadMem(asm.R1, r, off, asm.Half),
		asm.And.Imm(asm.R1, be16(0xffc0)),
		asm.JEq.Imm(asm.R1, be16(0xfe80), label),
	)
}

// macDiffers jumps to label unless the 6 bytes at r+off are the endpoint's
// MAC. Clobbers R4 and R5.
func (p *prog) macDiffers(r asm.Register, off int16, label string) {
	p.emit(
		asm.LoadMem(asm.R4, r, off, asm.Word),
		asm.LoadMem(asm.R5, asm.R7, epMAC, asm.Word),
		asm.JNE.Reg32(asm.R4, asm.R5, label),
		asm.LoadMem(asm.R4, r, off+4, asm.Half),
		asm.LoadMem(asm.R5, asm.R7, epMAC+4, asm.Half),
		asm.JNE.Reg32(asm.R4, asm.R5, label),
	)
}

// unspecifiedV6 jumps to label when the address at r+off is ::. Clobbers R1.
func (p *prog) unspecifiedV6(r asm.Register, off int16, label string) {
	notZero := p.newLabel("not_zero")
	for i := range int16(4) {
		p.emit(
			asm.LoadMem(asm.R1, r, off+4*i, asm.Word),
			asm.JNE.Imm32(asm.R1, 0, notZero),
		)
	}
	p.emit(asm.Ja.Label(label))
	p.at(notZero)
}

// ownAddressV6 jumps to ok when the IPv6 address at r+off is the endpoint's
// own global or link-local address, and to fail otherwise. Clobbers R1, R5.
func (p *prog) ownAddressV6(r asm.Register, off int16, ok, fail string) {
	notGlobal := p.newLabel("not_global")
	p.flagClear(flagHasIPv6, notGlobal)
	p.wordsDiffer(r, off, asm.R7, epIPv6, notGlobal)
	p.emit(asm.Ja.Label(ok))
	p.at(notGlobal)
	p.flagClear(flagHasLinkLocal, fail)
	p.wordsDiffer(r, off, asm.R7, epLinkLocal, fail)
	p.emit(asm.Ja.Label(ok))
}

// fromRouter passes the packet when its IPv6 source is the node's router
// link-local address and drops it (nd) otherwise. Clobbers R1, R5.
func (p *prog) fromRouter() {
	nd := p.dropLabel(ReasonND)
	p.flagClear(flagHasRouter, nd)
	p.wordsDiffer(asm.R2, ethHdrLen+8, asm.R7, epRouter, nd)
	p.emit(asm.Ja.Label("pass"))
}

// arp judges an ARP message. Its fields are fixed: 28 bytes, no room for
// anything but addresses. Both directions: IPv4 over Ethernet, a request or
// a reply, and a frame of 42 bytes or padded to at most 60 with zeros (the
// kernel and gVisor send 42; a NIC pads to 60), or drop (malformed), so
// that no ARP frame carries data past its addresses. From the pod: its own
// MAC as sender hardware address and its own IPv4 address (or 0.0.0.0, a
// probe) as sender address, or drop (spoof). To the pod: the target is the
// pod's own IPv4 address, or drop (dst); a sender hardware address that
// another tenant's pod owns, or a sender address that another tenant owns,
// drop (tenant). A sender no tenant owns is the node (its bridge or host
// veth) and passes.
func (p *prog) arp(dir Direction) {
	malformed := p.dropLabel(ReasonMalformed)
	p.at("arp")
	p.need(asm.R2, ethHdrLen+arpLen)
	// Ethernet and IPv4 addresses of the usual sizes, or the addresses read
	// below are not where the receiver reads them; request or reply.
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen, asm.Word),
		asm.JNE.Imm32(asm.R1, be32(0x0001_0800), malformed),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+4, asm.Word),
		asm.JEq.Imm32(asm.R1, be32(0x0604_0001), "arp_op_ok"),
		asm.JNE.Imm32(asm.R1, be32(0x0604_0002), malformed),
	)
	p.at("arp_op_ok")
	// The frame's length (skb->len, all of it, not only the linear part):
	// at most the minimum frame, and every byte past the message zero.
	p.emit(
		asm.LoadMem(asm.R4, asm.R6, skbLen, asm.Word),
		asm.JGT.Imm(asm.R4, ethFrameMin, malformed),
	)
	for off := int32(ethHdrLen + arpLen); off < ethFrameMin; off++ {
		p.emit(asm.JLE.Imm(asm.R4, off, "arp_padded"))
		p.need(asm.R2, off+1)
		p.emit(
			asm.LoadMem(asm.R1, asm.R2, int16(off), asm.Byte),
			asm.JNE.Imm(asm.R1, 0, malformed),
		)
	}
	p.at("arp_padded")
	p.emit(asm.LoadMem(asm.R8, asm.R2, ethHdrLen+14, asm.Word)) // sender IPv4
	if dir == ToPod {
		// Only ARP for the pod's own address reaches it.
		p.flagClear(flagHasIPv4, p.dropLabel(ReasonDst))
		p.emit(
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+24, asm.Word),
			asm.LoadMem(asm.R5, asm.R7, epIPv4, asm.Word),
			asm.JNE.Reg32(asm.R1, asm.R5, p.dropLabel(ReasonDst)),
			// The sender hardware address, which the pod's neighbour
			// table will learn: a pod's MAC is its own (checked on its
			// side), so owner_mac says whose it is. This holds for probes
			// (sender 0.0.0.0) too, which name no sender address.
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+8, asm.Word),
			asm.StoreMem(asm.RFP, stKeyV4, asm.R1, asm.Word),
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+12, asm.Half),
			asm.StoreMem(asm.RFP, stKeyV4+4, asm.R1, asm.Half),
			asm.StoreImm(asm.RFP, stKeyV4+6, 0, asm.Half),
		)
		p.lookup(mapOwnerMAC, stKeyV4)
		p.emit(
			asm.JEq.Imm(asm.R0, 0, "arp_sender_mac_ok"),
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
			asm.LoadMem(asm.R5, asm.R7, epTenant, asm.Word),
			asm.JNE.Reg32(asm.R1, asm.R5, p.dropLabel(ReasonTenant)),
		)
		// The sender address, when there is one: another tenant's
		// pod's (their sender address is their own: checked on their
		// side) drops.
		p.at("arp_sender_mac_ok")
		p.emit(
			asm.JEq.Imm32(asm.R8, 0, "pass"),
			asm.Mov.Imm(asm.R9, 0),
			asm.StoreImm(asm.RFP, stKeyV4, 32, asm.Word),
			asm.StoreMem(asm.RFP, stKeyV4+4, asm.R8, asm.Word),
		)
		p.lookupOwner(mapOwnerV4, mapTenantV4, stKeyV4)
		p.emit(
			asm.JNE.Imm(asm.R0, 0, "tenant_match"),
			asm.Ja.Label("pass"),
		)
		return
	}
	// From the pod: its own MAC as sender hardware address (the Ethernet
	// source is already checked), and its own IPv4 address (or none, for
	// a probe) as sender protocol address.
	p.macDiffers(asm.R2, ethHdrLen+8, p.dropLabel(ReasonSpoof))
	p.emit(asm.JEq.Imm32(asm.R8, 0, "pass"))
	p.flagClear(flagHasIPv4, p.dropLabel(ReasonSpoof))
	p.emit(
		asm.LoadMem(asm.R1, asm.R7, epIPv4, asm.Word),
		asm.JNE.Reg32(asm.R8, asm.R1, p.dropLabel(ReasonSpoof)),
		asm.Ja.Label("pass"),
	)
}

func (p *prog) ipv4(dir Direction) {
	p.at("ipv4")
	p.need(asm.R2, ethHdrLen+ipv4HdrMin)
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen, asm.Byte),
		asm.Mov.Reg(asm.R4, asm.R1),
		asm.And.Imm(asm.R4, 0x0f),
		asm.RSh.Imm(asm.R1, 4),
		asm.JNE.Imm(asm.R1, 4, p.dropLabel(ReasonMalformed)),
		asm.JLT.Imm(asm.R4, 5, p.dropLabel(ReasonMalformed)),
		// R4: the packet start plus the IP header length, so the L4 header
		// sits at R4+14. The whole header, options included, must be present.
		asm.LSh.Imm(asm.R4, 2),
		asm.Add.Reg(asm.R4, asm.R2),
	)
	p.need(asm.R4, ethHdrLen)
	if dir == FromPod {
		p.flagClear(flagHasIPv4, p.dropLabel(ReasonSpoof))
		p.emit(
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+12, asm.Word),
			asm.LoadMem(asm.R5, asm.R7, epIPv4, asm.Word),
			asm.JNE.Reg32(asm.R1, asm.R5, p.dropLabel(ReasonSpoof)),
			asm.LoadMem(asm.R8, asm.R2, ethHdrLen+16, asm.Word),
		)
	} else {
		// To the pod: its own address, broadcast or multicast. Anything else
		// reached its port because the bridge flooded it or was misled.
		p.flagClear(flagHasIPv4, p.dropLabel(ReasonDst))
		p.emit(
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+16, asm.Word),
			asm.JEq.Imm32(asm.R1, -1, "v4_dst_ok"),
			asm.LoadMem(asm.R5, asm.R7, epIPv4, asm.Word),
			asm.JEq.Reg32(asm.R1, asm.R5, "v4_dst_ok"),
			asm.And.Imm32(asm.R1, be32(0xf000_0000)),
			asm.JNE.Imm32(asm.R1, be32(0xe000_0000), p.dropLabel(ReasonDst)),
		)
		p.at("v4_dst_ok")
		p.emit(asm.LoadMem(asm.R8, asm.R2, ethHdrLen+12, asm.Word))
	}
	// RoCEv2: UDP to port 4791, in the first fragment (later ones carry no
	// ports; without the first they never reassemble).
	p.emit(
		asm.Mov.Imm(asm.R9, 0),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+9, asm.Byte),
		asm.JNE.Imm(asm.R1, protoUDP, "v4_classify"),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+6, asm.Half),
		asm.And.Imm(asm.R1, be16(0x1fff)),
		asm.JNE.Imm(asm.R1, 0, "v4_classify"),
	)
	p.need(asm.R4, ethHdrLen+4)
	p.emit(
		asm.LoadMem(asm.R1, asm.R4, ethHdrLen+2, asm.Half),
		asm.JNE.Imm(asm.R1, be16(roceV2Port), "v4_classify"),
		asm.Mov.Imm(asm.R9, 1),
	)

	// A credential endpoint, for a pod that denies them: the pod's own
	// list (metadata_v4, scoped by ifindex), filled at registration.
	p.at("v4_classify")
	p.flagClear(flagDenyMetadata, "v4_tenant")
	p.lookupScoped(mapMetadataV4, peerV4, asm.RFP, stIfindex)
	p.emit(asm.JNE.Imm(asm.R0, 0, p.dropLabel(ReasonMetadata)))

	p.at("v4_tenant")
	p.emit(
		asm.StoreImm(asm.RFP, stKeyV4, 32, asm.Word),
		asm.StoreMem(asm.RFP, stKeyV4+4, asm.R8, asm.Word),
	)
	p.lookupOwner(mapOwnerV4, mapTenantV4, stKeyV4)
	p.emit(
		asm.JNE.Imm(asm.R0, 0, "tenant_match"),
		asm.JNE.Imm(asm.R9, 0, p.dropLabel(ReasonRDMA)),
	)
	// Owned by no tenant. The cluster trie's key is the tenant trie's, still
	// on the stack. The tier's shared services are looked up only where
	// they decide the verdict: inside the cluster (pass, else cluster) and
	// outside it for a pod whose allow-list lacks the peer (pass, else
	// egress); elsewhere the packet passes either way.
	p.lookup(mapClusterV4, stKeyV4)
	p.emit(asm.JEq.Imm(asm.R0, 0, "v4_outside"))
	p.serviceV4()
	p.emit(asm.Ja.Label(p.dropLabel(ReasonCluster)))
	// Outside the cluster: only allow-listed CIDRs, for tiers that say so.
	p.at("v4_outside")
	p.flagClear(flagEgressRestricted, "pass")
	p.lookupScoped(mapEgressV4, peerV4, asm.RFP, stIfindex)
	p.emit(asm.JNE.Imm(asm.R0, 0, "pass"))
	p.serviceV4()
	p.emit(asm.Ja.Label(p.dropLabel(ReasonEgress)))
}

// serviceV4 passes the packet when the IPv4 peer in R8 is a shared service
// of the pod's tier.
func (p *prog) serviceV4() {
	p.lookupScoped(mapServiceV4, peerV4, asm.R7, epTier)
	p.emit(asm.JNE.Imm(asm.R0, 0, "pass"))
}

func (p *prog) ipv6(dir Direction) {
	p.at("ipv6")
	p.need(asm.R2, ethHdrLen+ipv6HdrLen)
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen, asm.Byte),
		asm.RSh.Imm(asm.R1, 4),
		asm.JNE.Imm(asm.R1, 6, p.dropLabel(ReasonMalformed)),
	)
	if dir == ToPod {
		// To the pod: its own global or link-local address, or multicast.
		p.emit(
			asm.LoadMem(asm.R1, asm.R2, ethHdrLen+24, asm.Byte),
			asm.JEq.Imm(asm.R1, 0xff, "v6_dst_ok"),
		)
		p.ownAddressV6(asm.R2, ethHdrLen+24, "v6_dst_ok", p.dropLabel(ReasonDst))
		p.at("v6_dst_ok")
	}
	p.emit(
		asm.Mov.Imm(asm.R9, 0),
		asm.LoadMem(asm.R5, asm.R2, ethHdrLen+6, asm.Byte),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, ethHdrLen+ipv6HdrLen),
	)
	// Walk a bounded chain of extension headers so that IPv6 is enforced,
	// not bypassed: R5 ends as the upper-layer protocol, R4 at its header.
	// 255 (reserved) stands for "not the first fragment: no L4 header".
	for range maxExtHeaders {
		ext, frag, next := p.newLabel("ext"), p.newLabel("frag"), p.newLabel("ext_next")
		p.emit(
			asm.JEq.Imm(asm.R5, 0, ext),
			asm.JEq.Imm(asm.R5, 43, ext),
			asm.JEq.Imm(asm.R5, 60, ext),
			asm.JEq.Imm(asm.R5, 44, frag),
			asm.Ja.Label("l4_v6"),
		)
		p.at(ext)
		p.need(asm.R4, 8)
		p.emit(
			asm.LoadMem(asm.R5, asm.R4, 0, asm.Byte),
			asm.LoadMem(asm.R1, asm.R4, 1, asm.Byte),
			asm.Add.Imm(asm.R1, 1),
			asm.LSh.Imm(asm.R1, 3),
			asm.Add.Reg(asm.R4, asm.R1),
			asm.Ja.Label(next),
		)
		p.at(frag)
		p.need(asm.R4, 8)
		p.emit(
			asm.LoadMem(asm.R5, asm.R4, 0, asm.Byte),
			asm.LoadMem(asm.R1, asm.R4, 2, asm.Half),
			asm.Add.Imm(asm.R4, 8),
			asm.And.Imm(asm.R1, be16(0xfff8)),
			asm.JEq.Imm(asm.R1, 0, next),
			asm.Mov.Imm(asm.R5, 255),
			asm.Ja.Label("l4_v6"),
		)
		p.at(next)
	}
	// Still an extension header after the bound: refuse rather than guess.
	p.emit(
		asm.JEq.Imm(asm.R5, 0, p.dropLabel(ReasonMalformed)),
		asm.JEq.Imm(asm.R5, 43, p.dropLabel(ReasonMalformed)),
		asm.JEq.Imm(asm.R5, 60, p.dropLabel(ReasonMalformed)),
		asm.JEq.Imm(asm.R5, 44, p.dropLabel(ReasonMalformed)),
	)

	p.at("l4_v6")
	p.emit(
		asm.JEq.Imm(asm.R5, protoICMPv6, "icmp6"),
		asm.JNE.Imm(asm.R5, protoUDP, "v6_addrs"),
	)
	p.need(asm.R4, 4)
	p.emit(
		asm.LoadMem(asm.R1, asm.R4, 2, asm.Half),
		asm.JNE.Imm(asm.R1, be16(roceV2Port), "v6_addrs"),
		asm.Mov.Imm(asm.R9, 1),
		asm.Ja.Label("v6_addrs"),
	)

	// ICMPv6 for the link: MLD (130-132, 143) and neighbour discovery
	// (133-137, RFC 4861). R8 holds the type.
	p.at("icmp6")
	p.need(asm.R4, 4)
	p.emit(
		asm.LoadMem(asm.R8, asm.R4, 0, asm.Byte),
		asm.JEq.Imm(asm.R8, 143, "mld"),
		asm.JLT.Imm(asm.R8, 130, "v6_addrs"),
		asm.JGT.Imm(asm.R8, 137, "v6_addrs"),
		asm.JLT.Imm(asm.R8, 133, "mld"),
		// Hop limit 255 proves the message was not forwarded onto the link.
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+7, asm.Byte),
		asm.JNE.Imm(asm.R1, 255, p.dropLabel(ReasonND)),
	)
	if dir == FromPod {
		p.ndFromPod()
	} else {
		p.ndToPod()
	}
	p.mld(dir)

	p.at("v6_addrs")
	if dir == FromPod {
		p.flagClear(flagHasIPv6, p.dropLabel(ReasonSpoof))
		p.wordsDiffer(asm.R2, ethHdrLen+8, asm.R7, epIPv6, p.dropLabel(ReasonSpoof))
		p.copyWords(asm.RFP, stPeerV6, asm.R2, ethHdrLen+24, 4)
	} else {
		p.copyWords(asm.RFP, stPeerV6, asm.R2, ethHdrLen+8, 4)
	}
	p.flagClear(flagDenyMetadata, "v6_linklocal")
	p.lookupScoped(mapMetadataV6, peerV6, asm.RFP, stIfindex)
	p.emit(asm.JNE.Imm(asm.R0, 0, p.dropLabel(ReasonMetadata)))

	// Link-local traffic other than ND stays on the bridge, where it would
	// reach other tenants' pods: no tenant owns it.
	p.at("v6_linklocal")
	p.linkLocalV6(asm.RFP, stPeerV6, p.dropLabel(ReasonCluster))

	p.emit(asm.StoreImm(asm.RFP, stKeyV6, 128, asm.Word))
	p.copyWords(asm.RFP, stKeyV6+4, asm.RFP, stPeerV6, 4)
	p.lookupOwner(mapOwnerV6, mapTenantV6, stKeyV6)
	p.emit(
		asm.JNE.Imm(asm.R0, 0, "tenant_match"),
		asm.JNE.Imm(asm.R9, 0, p.dropLabel(ReasonRDMA)),
	)
	// As for IPv4: cluster (same key), services only where they decide.
	p.lookup(mapClusterV6, stKeyV6)
	p.emit(asm.JEq.Imm(asm.R0, 0, "v6_outside"))
	p.serviceV6()
	p.emit(asm.Ja.Label(p.dropLabel(ReasonCluster)))
	p.at("v6_outside")
	p.flagClear(flagEgressRestricted, "pass")
	p.lookupScoped(mapEgressV6, peerV6, asm.RFP, stIfindex)
	p.emit(asm.JNE.Imm(asm.R0, 0, "pass"))
	p.serviceV6()
	p.emit(asm.Ja.Label(p.dropLabel(ReasonEgress)))
}

// serviceV6 passes the packet when the IPv6 peer saved at stPeerV6 is a
// shared service of the pod's tier.
func (p *prog) serviceV6() {
	p.lookupScoped(mapServiceV6, peerV6, asm.R7, epTier)
	p.emit(asm.JNE.Imm(asm.R0, 0, "pass"))
}

// ndFromPod judges neighbour discovery the pod sends. A pod is a host: it
// solicits routers and neighbours and advertises its own addresses, from its
// own addresses, to neighbour-discovery destinations. Anything sent to a
// global unicast address is judged like any other packet to that peer.
func (p *prog) ndFromPod() {
	nd, spoof := p.dropLabel(ReasonND), p.dropLabel(ReasonSpoof)
	p.emit(
		// No router advertisements, no redirects.
		asm.JEq.Imm(asm.R8, 134, nd),
		asm.JEq.Imm(asm.R8, 137, nd),
	)
	// Source: unspecified (duplicate address detection) or the pod's own.
	p.unspecifiedV6(asm.R2, ethHdrLen+8, "nd_src_ok")
	p.ownAddressV6(asm.R2, ethHdrLen+8, "nd_src_ok", spoof)
	p.at("nd_src_ok")
	// An advertisement claims only the pod's own address.
	p.emit(asm.JNE.Imm(asm.R8, 136, "nd_opts"))
	p.need(asm.R4, 24)
	p.ownAddressV6(asm.R4, 8, "nd_opts", spoof)
	p.at("nd_opts")
	p.ndOptions()
	// Destination: link-local unicast, all-nodes ff02::1, all-routers
	// ff02::2 or a solicited-node group ff02::1:ffXX:XXXX; no other group.
	p.at("nd_dst")
	p.linkLocalV6(asm.R2, ethHdrLen+24, "pass")
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+24, asm.Byte),
		asm.JNE.Imm(asm.R1, 0xff, "v6_addrs"),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+24, asm.Word),
		asm.JNE.Imm32(asm.R1, be32(0xff02_0000), nd),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+28, asm.Word),
		asm.JNE.Imm32(asm.R1, 0, nd),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+32, asm.Word),
		asm.JEq.Imm32(asm.R1, be32(1), "nd_solicited"),
		asm.JNE.Imm32(asm.R1, 0, nd),
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+36, asm.Word),
		asm.JEq.Imm32(asm.R1, be32(1), "pass"),
		asm.JEq.Imm32(asm.R1, be32(2), "pass"),
		asm.Ja.Label(nd),
	)
	p.at("nd_solicited")
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+36, asm.Byte),
		asm.JEq.Imm(asm.R1, 0xff, "pass"),
		asm.Ja.Label(nd),
	)
}

// ndOptions checks the options of a solicitation or advertisement the pod
// sends (R8 holds the type, R4 points at the ICMPv6 header): every
// link-layer address option (source, 1; target, 2) must carry the pod's MAC,
// or the message would teach its receivers to send another pod's traffic to
// that address. Options run to the end of the IPv6 payload; a zero-length
// option, one past that end, a link-layer option of other than Ethernet size
// or more than maxNDOptions options: drop (nd). Receivers discard the
// malformed ones anyway (RFC 4861, 4.6); the bound keeps the walk finite.
// Leaves R4 and R5 clobbered, R0 too.
func (p *prog) ndOptions() {
	nd := p.dropLabel(ReasonND)
	p.emit(
		// R5: the end of the message, from the payload length.
		asm.LoadMem(asm.R5, asm.R2, ethHdrLen+4, asm.Half),
		asm.HostTo(asm.BE, asm.R5, asm.Half),
		asm.And.Imm(asm.R5, 0xffff),
		asm.Add.Reg(asm.R5, asm.R2),
		asm.Add.Imm(asm.R5, ethHdrLen+ipv6HdrLen),
		// R0: the first option, after the fixed part of the message (a
		// router solicitation has no target address).
		asm.Mov.Reg(asm.R0, asm.R4),
		asm.Add.Imm(asm.R0, 24),
		asm.JNE.Imm(asm.R8, 133, "nd_opt_0"),
		asm.Add.Imm(asm.R0, -16),
	)
	for i := range maxNDOptions {
		lla, skip, next := p.newLabel("nd_lla"), p.newLabel("nd_skip"), fmt.Sprintf("nd_opt_%d", i+1)
		p.at(fmt.Sprintf("nd_opt_%d", i))
		p.emit(
			asm.JEq.Reg(asm.R0, asm.R5, "nd_opts_done"),
			asm.JGT.Reg(asm.R0, asm.R5, nd),
		)
		p.need(asm.R0, 2)
		p.emit(
			asm.LoadMem(asm.R1, asm.R0, 0, asm.Byte),
			asm.JEq.Imm(asm.R1, 1, lla),
			asm.JEq.Imm(asm.R1, 2, lla),
		)
		// Every option, checked or not, is skipped by its length here,
		// so that the verifier sees one state per option, not one per
		// combination of kinds.
		p.at(skip)
		p.emit(
			asm.LoadMem(asm.R1, asm.R0, 1, asm.Byte),
			asm.JEq.Imm(asm.R1, 0, nd),
			asm.LSh.Imm(asm.R1, 3),
			asm.Add.Reg(asm.R0, asm.R1),
			asm.Ja.Label(next),
		)
		p.at(lla)
		p.emit(
			asm.LoadMem(asm.R1, asm.R0, 1, asm.Byte),
			asm.JNE.Imm(asm.R1, 1, nd),
		)
		p.need(asm.R0, 8)
		p.emit(
			asm.LoadMem(asm.R1, asm.R0, 2, asm.Word),
			asm.LoadMem(asm.R4, asm.R7, epMAC, asm.Word),
			asm.JNE.Reg32(asm.R1, asm.R4, nd),
			asm.LoadMem(asm.R1, asm.R0, 6, asm.Half),
			asm.LoadMem(asm.R4, asm.R7, epMAC+4, asm.Half),
			asm.JNE.Reg32(asm.R1, asm.R4, nd),
			asm.Ja.Label(skip),
		)
	}
	// Options left after the bound: refuse rather than guess.
	p.at(fmt.Sprintf("nd_opt_%d", maxNDOptions))
	p.emit(
		asm.JNE.Reg(asm.R0, asm.R5, nd),
	)
	p.at("nd_opts_done")
}

// ndToPod judges neighbour discovery delivered to the pod (its destination
// is already the pod's own address or a group). Router advertisements and
// redirects come only from the node's router address; solicitations only
// for the pod's own addresses; solicitations and advertisements from a pod
// only from one of the same tenant.
func (p *prog) ndToPod() {
	nd := p.dropLabel(ReasonND)
	p.emit(
		asm.JEq.Imm(asm.R8, 133, nd),
		asm.JEq.Imm(asm.R8, 134, "nd_router"),
		asm.JEq.Imm(asm.R8, 137, "nd_router"),
	)
	// From :: it is another host's duplicate address detection: not for
	// the pod, or a claim on the pod's own address.
	p.unspecifiedV6(asm.R2, ethHdrLen+8, nd)
	p.emit(asm.JNE.Imm(asm.R8, 135, "nd_peer"))
	p.need(asm.R4, 24)
	p.ownAddressV6(asm.R4, 8, "nd_peer", nd)
	// A pod's source is its own address (checked on its side), so the
	// tenant tries (which hold pods' link-local addresses too) say whose
	// it is; an address no tenant owns is the node's.
	p.at("nd_peer")
	p.emit(asm.StoreImm(asm.RFP, stKeyV6, 128, asm.Word))
	p.copyWords(asm.RFP, stKeyV6+4, asm.R2, ethHdrLen+8, 4)
	p.lookupOwner(mapOwnerV6, mapTenantV6, stKeyV6)
	p.emit(
		asm.JNE.Imm(asm.R0, 0, "tenant_match"),
		asm.Ja.Label("pass"),
	)
	p.at("nd_router")
	p.fromRouter()
}

// mld judges multicast listener discovery (R8 holds the type). A pod
// reports its groups, from :: or its own link-local address, to a group; it
// receives only the node's queries.
func (p *prog) mld(dir Direction) {
	nd := p.dropLabel(ReasonND)
	p.at("mld")
	if dir == ToPod {
		p.emit(asm.JNE.Imm(asm.R8, 130, nd))
		p.fromRouter()
		return
	}
	spoof := p.dropLabel(ReasonSpoof)
	p.emit(asm.JEq.Imm(asm.R8, 130, nd))
	p.unspecifiedV6(asm.R2, ethHdrLen+8, "mld_src_ok")
	p.flagClear(flagHasLinkLocal, spoof)
	p.wordsDiffer(asm.R2, ethHdrLen+8, asm.R7, epLinkLocal, spoof)
	p.at("mld_src_ok")
	p.emit(
		asm.LoadMem(asm.R1, asm.R2, ethHdrLen+24, asm.Byte),
		asm.JEq.Imm(asm.R1, 0xff, "pass"),
		asm.Ja.Label(nd),
	)
}

// tenantMatch handles a peer that a tenant owns: R0 points at its owner.
func (p *prog) tenantMatch() {
	p.at("tenant_match")
	p.emit(
		asm.LoadMem(asm.R1, asm.R0, 0, asm.Word),
		asm.LoadMem(asm.R5, asm.R7, epTenant, asm.Word),
		asm.JNE.Reg32(asm.R1, asm.R5, p.dropLabel(ReasonTenant)),
		asm.JEq.Imm(asm.R9, 0, "pass"),
		// RoCEv2 within one tenant: both ends need the grant.
		asm.LoadMem(asm.R1, asm.R0, 4, asm.Word),
		asm.JSet.Imm(asm.R1, flagRDMA, "peer_rdma"),
		asm.Ja.Label(p.dropLabel(ReasonRDMA)),
	)
	p.at("peer_rdma")
	p.flagClear(flagRDMA, p.dropLabel(ReasonRDMA))
	p.emit(asm.Ja.Label("pass"))
}

// epilogue emits the verdicts and one counting block per drop reason.
func (p *prog) epilogue() {
	p.at("pass")
	p.emit(
		asm.Mov.Imm(asm.R0, verdictNext),
		asm.Return(),
	)
	for r := range numReasons {
		if !p.drops[r] {
			continue
		}
		p.at("drop_" + r.String())
		p.emit(
			asm.Mov.Imm(asm.R8, int32(r)),
			asm.Ja.Label("drop"),
		)
	}
	// drop: count (tenant, reason) on this CPU, then drop. R8 is the reason.
	p.at("drop")
	p.emit(
		asm.LoadMem(asm.R1, asm.R7, epTenant, asm.Word),
		asm.StoreMem(asm.RFP, stDropKey, asm.R1, asm.Word),
		asm.StoreMem(asm.RFP, stDropKey+4, asm.R8, asm.Word),
	)
	p.lookup(mapDrops, stDropKey)
	p.emit(
		asm.JEq.Imm(asm.R0, 0, "drop_first"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Ja.Label("drop_out"),
	)
	// First drop of this kind on this node: create the counter. A concurrent
	// creator on another CPU may win the race; this drop then goes uncounted.
	p.at("drop_first")
	p.emit(
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreMem(asm.RFP, stDropVal, asm.R1, asm.DWord),
		asm.LoadMapPtr(asm.R1, 0).WithReference(mapDrops),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, stDropKey),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, stDropVal),
		asm.Mov.Imm(asm.R4, 1), // BPF_NOEXIST
		asm.FnMapUpdateElem.Call(),
	)
	p.at("drop_out")
	p.emit(
		asm.Mov.Imm(asm.R0, verdictDrop),
		asm.Return(),
	)
}
