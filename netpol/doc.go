// Package netpol fences tenants on a node with eBPF: no IP or RoCEv2 packet
// crosses from one tenant's pod to another's.
//
// # Invariant
//
// Every packet that enters or leaves a registered pod through its host-side
// veth is checked against the pinned maps under Options.PinDir, and passes
// only if its peer is the same tenant, a shared service of the pod's tier,
// or (for tiers that allow it) an allow-listed address outside the cluster;
// only if the pod sent it from its own MAC and address; and only if, towards
// the pod, it is addressed to the pod. Link-layer protocols (ARP, neighbour
// discovery, MLD) pass only as far as a host on a shared bridge needs them.
// Interfaces that are not registered are never touched.
//
// A gVisor sandbox reaches the network through an AF_PACKET socket on its
// veth, so socket and cgroup hooks never see its traffic: the host-side veth
// does. The programs run there, at TCX ingress (packets from the pod) and
// TCX egress (packets to the pod), attached at the head of the chain. An
// allowed packet returns TCX_NEXT, so the CNI's own programs still run; a
// refused one is dropped and counted per tenant, per reason, per CPU. Where
// TCX is missing the same programs go in as clsact/cls_bpf direct-action
// filters, where TCX_NEXT reads as TC_ACT_UNSPEC ("continue").
//
// # Verdicts, in order
//
//  1. Interface not in the endpoints map: next program, untouched.
//  2. VLAN-tagged, or neither IPv4, IPv6 nor ARP: drop (ethertype).
//  3. Truncated or malformed header: drop (malformed). ARP is IPv4 over
//     Ethernet, a request or a reply, in a frame of 42 bytes or padded with
//     zeros to at most 60 (the kernel and gVisor send 42; a NIC pads to
//     60), or drop (malformed): its 28 bytes hold addresses only, so no ARP
//     frame carries data.
//  4. From the pod, an Ethernet source other than the pod's MAC: drop
//     (spoof). A frame from another pod's MAC would teach the bridge to
//     deliver that pod's traffic here.
//  5. ARP. From the pod: the sender MAC is the pod's, the sender address
//     its own IPv4 or 0.0.0.0 (a probe), or drop (spoof). To the pod: the
//     target is the pod's own IPv4, or drop (dst); a sender MAC that
//     another tenant's pod has (owner_mac), probes included, or a sender
//     address that another tenant owns: drop (tenant). A sender MAC and
//     address no tenant owns are the node's (its bridge or host veth), or
//     a pod the fence does not manage: pass.
//  6. To the pod, a destination other than the pod's own address (IPv4,
//     IPv6 or IPv6 link-local), IPv4 broadcast or multicast: drop (dst).
//  7. Neighbour discovery (ICMPv6 133-137), hop limit not 255: drop (nd).
//     From the pod: router advertisements and redirects drop (nd); the
//     source is ::, the pod's link-local or its own address, and an
//     advertisement claims only the pod's link-local or own address, or
//     drop (spoof); every link-layer address option (source or target) holds
//     the pod's MAC, and the options are well formed (none of length zero or
//     past the message, at most 6), or drop (nd); to a link-local
//     address, ff02::1, ff02::2 or a solicited-node group
//     ff02::1:ffXX:XXXX it passes, to another group it drops (nd), and to
//     a global address it goes on to rule 9 like any packet to that peer. To the pod: router solicitations drop (nd);
//     router advertisements and redirects pass only from the node's router
//     link-local address (nd); solicitations and advertisements from ::
//     drop (nd), a solicitation passes only for the pod's own addresses
//     (nd), and one from another tenant's pod (its global or link-local
//     address) drops (tenant); the rest pass.
//     MLD (ICMPv6 130-132, 143): from the pod, reports only (nd), from :: or
//     its link-local address (spoof), to a group (nd); to the pod, only
//     queries from the node's router link-local address (nd).
//  8. From the pod, a source that is not its own address: drop (spoof).
//  9. Peer in the pod's credential endpoints (Endpoint.MetadataCIDRs, the
//     decision's network.metadata_cidrs: instance metadata, task and pod
//     identity agents) when the tier denies metadata: drop (metadata).
//  10. IPv6 link-local peer (other than ND): drop (cluster).
//  11. Peer owned by a tenant (a pod on this node, a pod of another node
//     or a Service's ClusterIP that the node agent learned from the API
//     server (Manager.SetRemote: a ClusterIP only when every endpoint of
//     the Service is a pod of its tenant), or a configured remote range):
//     another tenant, drop (tenant); the
//     same tenant passes, except
//     RoCEv2 (UDP destination port 4791), which needs the RDMA grant on both
//     ends (rdma).
//  12. RoCEv2 to anything else: drop (rdma).
//  13. Peer in a shared-service CIDR of the pod's tier (DNS, API server): pass.
//  14. Peer in the cluster CIDRs but owned by no tenant: drop (cluster),
//     whatever the tier. A pod of another node is such a peer until the
//     node agent has learned it (before its first sync, while it cannot
//     reach the API server, or when the pod's namespace maps to no
//     tenant), and again once the pod is gone. So is a ClusterIP the
//     agent does not map (an endpoint of the Service outside its tenant):
//     the sender's fence, which sees it before kube-proxy's DNAT, is the
//     only check when the backend is not a fenced pod.
//     The node's own addresses are in the cluster whatever the CIDRs say
//     (the Manager adds them when it configures the node): after the
//     node's NAT, NodePort, LoadBalancer and host-network traffic carries
//     them, from any tenant, so only a tier that lists them as shared
//     services exchanges packets with them. So are the other nodes'
//     addresses (their InternalIP and ExternalIP) that the node agent
//     learns from the API server (Manager.SetRemoteNodes): a host-network
//     pod there, a NodePort masqueraded there or that node's kubelet
//     reaches a pod from them, and without them an address of another node
//     outside the CIDRs would be outside the cluster (rule 15) for every
//     tier. They are kept apart from the configured ranges: a new
//     ClusterConfig, a restarted agent's included, leaves them in place.
//  15. Peer outside the cluster: pass, or for a pod with an egress allow-list
//     only when listed (egress).
//
// The pod's MAC, IPv6 link-local address and the node's router link-local
// address are read at registration (Endpoint.MAC, LinkLocal,
// RouterLinkLocal); pods' link-local addresses are kept in the owner hash
// beside their global ones, so that rule 7 can tell whose a neighbour
// message is. Every pod on a bridge is registered with its own programs, so
// a pod's link-layer sources are its own by rule 4, 5 and 7 on its side,
// and the receiving side can trust them.
//
// The list is the order in which verdicts take precedence, not the order of
// the programs' lookups: they look up the cluster ranges before the tier's
// shared services, and those only where they decide (in the cluster, and
// outside it for a peer missing from the pod's allow-list), which yields the
// same verdict with fewer lookups on the common paths.
//
// IPv6 is enforced, not bypassed: up to four extension headers (hop-by-hop,
// routing, destination options, fragment) are walked to find the upper
// layer, and a longer chain is dropped. The checks are stateless and
// symmetric: replies are judged like requests.
//
// # Why cilium/ebpf's asm package, not C and bpf2go
//
// The programs are assembled at run time from Go (datapath.go). The
// programs are a few hundred instructions of bounds checks, map lookups and
// comparisons, which the asm package expresses directly; in exchange:
//
//   - the build needs no clang or llvm (absent on this project's machines)
//     and there are no generated objects to commit,
//     regenerate or check for staleness: `make generate` has nothing to do;
//   - constants shared by the programs and the Manager (map names, value
//     layouts, flags, reasons) are one set of Go declarations, so the two
//     cannot drift apart;
//   - every branch is covered by BPF_PROG_TEST_RUN tests in this package.
//
// The cost is readability of the datapath; each block in datapath.go carries
// the rule it enforces, and the verdict tests name every case.
//
// # Maps
//
// Pinned by name under PinDir (default /sys/fs/bpf/bulkhead): endpoints
// (ifindex -> tenant, tier, flags, addresses, MAC, link-local and router
// addresses), owner_v4/owner_v6 (hash: a single address, pods' link-local
// ones and other nodes' pods included, -> owning tenant; a pod of this
// node wins over a remote pod of the same address), tenant_v4/tenant_v6 (LPM: a wider
// remote range -> owning tenant; looked up after the owner hash, which
// answers as a trie holding both would, since a host prefix is always the
// longest match, for the price of a hash lookup instead of a walk down a
// trie of every pod), owner_mac (hash: a pod's MAC -> owning tenant),
// service_v4/v6 (LPM keyed by tier), egress_v4/v6 and metadata_v4/v6
// (LPM keyed by ifindex), cluster_v4/v6 (LPM; the value's bits say who
// holds the entry, configured ranges and this node's addresses or other
// nodes' addresses learned by the agent, and an entry goes only when no
// bit is left; the programs test presence only), drops (per-CPU
// counters keyed by tenant and reason), tenant_ids and tier_ids (stable
// name -> id for the node). TCX links are pinned under PinDir/links, so the
// fence outlives the shim that registered it. Updates from several shims
// are serialized by an flock on Options.LockPath.
//
// Hardware RDMA is not a packet: see package rdma for the device fence.
package netpol
