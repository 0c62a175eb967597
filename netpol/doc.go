// Package netpol fences tenants on a node with eBPF: no IP or RoCEv2 packet
// crosses from one tenant's pod to another's.
//
// # Invariant
//
// Every packet that enters or leaves a registered pod through its host-side
// veth is checked against the pinned maps under Options.PinDir, and passes
// only if its peer is the same tenant, a shared service of the pod's tier,
// or (for tiers that allow it) an allow-listed address outside the cluster;
// and only if the pod sent it from its own address. Interfaces that are not
// registered are never touched.
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
//  3. Truncated or malformed header: drop (malformed).
//  4. ARP passes; from the pod only with its own IPv4 (or 0.0.0.0) as sender.
//     IPv6 neighbour discovery and MLD pass; from the pod only from ::,
//     link-local or its own address, and a neighbour advertisement may only
//     claim such an address.
//  5. From the pod, a source that is not its own address: drop (spoof).
//  6. Peer 169.254.169.254 or fd00:ec2::254 when the tier denies metadata:
//     drop (metadata).
//  7. IPv6 link-local peer (other than ND): drop (cluster).
//  8. Peer owned by a tenant (a pod on this node or a configured remote
//     range): another tenant, drop (tenant); the same tenant passes, except
//     RoCEv2 (UDP destination port 4791), which needs the RDMA grant on both
//     ends (rdma).
//  9. RoCEv2 to anything else: drop (rdma).
//  10. Peer in a shared-service CIDR of the pod's tier (DNS, API server): pass.
//  11. Peer in the cluster CIDRs but owned by no tenant: drop (cluster).
//  12. Peer outside the cluster: pass, or for a pod with an egress allow-list
//     only when listed (egress).
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
// (ifindex -> tenant, tier, flags, addresses), tenant_v4/tenant_v6 (LPM:
// address -> owning tenant), service_v4/v6 (LPM keyed by tier),
// egress_v4/v6 (LPM keyed by ifindex), cluster_v4/v6 (LPM), drops (per-CPU
// counters keyed by tenant and reason), tenant_ids and tier_ids (stable
// name -> id for the node). TCX links are pinned under PinDir/links, so the
// fence outlives the shim that registered it. Updates from several shims
// are serialized by an flock on Options.LockPath.
//
// Hardware RDMA is not a packet: see package rdma for the device fence.
package netpol
