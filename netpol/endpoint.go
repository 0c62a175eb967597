package netpol

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/bulkhead-runtime/bulkhead/internal/dnslabel"
)

// Endpoint is one managed pod interface, as the shim registers it.
type Endpoint struct {
	// SandboxID identifies the pod sandbox (at most 64 bytes). Required.
	SandboxID string
	// Ifindex is the host-side veth's interface index in the host network
	// namespace. Either Ifindex or HostVeth is required.
	Ifindex int
	// HostVeth is the host-side veth's name, used when Ifindex is 0.
	HostVeth string
	// Tenant names the tenant that owns the pod: a DNS-1123 label. Required.
	Tenant string
	// Tier names the pod's trust tier; it selects the shared services the pod
	// may reach. A DNS-1123 label. Required.
	Tier string
	// IPv4 and IPv6 are the pod's addresses; at least one is required. The pod
	// may send only from these (and, for neighbour discovery, link-local).
	IPv4, IPv6 netip.Addr
	// MAC is the pod interface's Ethernet address: the only source address
	// of the frames and ARP messages the pod may send. Register reads it from
	// the pod's side of the veth when it is nil.
	MAC HardwareAddr
	// LinkLocal is the pod interface's IPv6 link-local address, the other
	// address (besides IPv6) the pod may use for neighbour discovery and MLD.
	// Register reads it from the pod's side of the veth when it is not set,
	// and derives it from MAC (modified EUI-64) when the pod has none.
	LinkLocal netip.Addr
	// RouterLinkLocal is the node's link-local address on the pod's link, the
	// only source of router advertisements, redirects and MLD queries the pod
	// receives. Register reads it from the host veth's bridge (or from the
	// host veth, for a routed CNI) when it is not set; a node without one
	// sends the pod no router advertisements.
	RouterLinkLocal netip.Addr
	// AllowRDMA grants RoCEv2 (UDP 4791) with pods of the same tenant that
	// have the grant too.
	AllowRDMA bool
	// DenyMetadata drops traffic to and from MetadataCIDRs, the cloud
	// credential endpoints.
	DenyMetadata bool
	// MetadataCIDRs are the credential endpoints (instance metadata, task
	// and pod identity agents) a pod that denies metadata may not exchange
	// packets with: the decision's network.metadata_cidrs. Required, and
	// only allowed, when DenyMetadata is set; the policy owns the list.
	MetadataCIDRs []netip.Prefix
	// EgressCIDRs, when not nil, is the only set of addresses outside the
	// cluster the pod may exchange packets with. Nil leaves traffic leaving the
	// cluster unrestricted; an empty non-nil slice denies all of it.
	EgressCIDRs []netip.Prefix
}

// HardwareAddr is an Ethernet address. Unlike net.HardwareAddr it marshals
// to JSON as text (aa:bb:cc:dd:ee:ff), as operators read it.
type HardwareAddr net.HardwareAddr

func (h HardwareAddr) String() string { return net.HardwareAddr(h).String() }

// MarshalText implements encoding.TextMarshaler.
func (h HardwareAddr) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (h *HardwareAddr) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*h = nil
		return nil
	}
	m, err := net.ParseMAC(string(b))
	if err != nil {
		return err
	}
	*h = HardwareAddr(m)
	return nil
}

// EndpointInfo is a registered endpoint as the pinned maps describe it.
type EndpointInfo struct {
	Endpoint
	// Attach is "tcx" or "clsact".
	Attach string
}

// validate checks the fields that do not need the kernel.
func (e *Endpoint) validate() error {
	switch {
	case e.SandboxID == "":
		return errors.New("endpoint: SandboxID is required")
	case len(e.SandboxID) > sandboxLen:
		return fmt.Errorf("endpoint %s: SandboxID must be at most %d bytes", e.SandboxID, sandboxLen)
	case strings.IndexByte(e.SandboxID, 0) >= 0:
		return fmt.Errorf("endpoint %q: SandboxID must not contain NUL", e.SandboxID)
	case e.Ifindex < 0:
		return fmt.Errorf("endpoint %s: Ifindex %d must not be negative", e.SandboxID, e.Ifindex)
	case e.Ifindex == 0 && e.HostVeth == "":
		return fmt.Errorf("endpoint %s: Ifindex or HostVeth is required", e.SandboxID)
	case len(e.HostVeth) > 15:
		return fmt.Errorf("endpoint %s: HostVeth %q is longer than an interface name (15 bytes)", e.SandboxID, e.HostVeth)
	case !e.IPv4.IsValid() && !e.IPv6.IsValid():
		return fmt.Errorf("endpoint %s: IPv4 or IPv6 is required", e.SandboxID)
	case e.IPv4.IsValid() && !e.IPv4.Is4():
		return fmt.Errorf("endpoint %s: IPv4 %s is not an IPv4 address", e.SandboxID, e.IPv4)
	case e.IPv6.IsValid() && (!e.IPv6.Is6() || e.IPv6.Is4In6()):
		return fmt.Errorf("endpoint %s: IPv6 %s is not an IPv6 address", e.SandboxID, e.IPv6)
	}
	for _, a := range []netip.Addr{e.IPv4, e.IPv6} {
		if a.IsValid() && (a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast()) {
			return fmt.Errorf("endpoint %s: address %s must be a unicast, non-link-local pod address", e.SandboxID, a)
		}
	}
	// A name becomes the key of a fixed-size, NUL-padded map entry, where
	// "agents\x00" would read as "agents" and pass as that tenant: only a
	// DNS-1123 label, as policy admits, becomes an identity.
	if err := dnslabel.Check(e.Tenant); err != nil {
		return fmt.Errorf("endpoint %s: Tenant %q %w", e.SandboxID, e.Tenant, err)
	}
	if err := dnslabel.Check(e.Tier); err != nil {
		return fmt.Errorf("endpoint %s: Tier %q %w", e.SandboxID, e.Tier, err)
	}
	if e.MAC != nil && (len(e.MAC) != 6 || e.MAC[0]&1 != 0 || bytes.Equal(e.MAC, make([]byte, 6))) {
		return fmt.Errorf("endpoint %s: MAC %s must be a unicast Ethernet address", e.SandboxID, e.MAC)
	}
	for name, a := range map[string]netip.Addr{"LinkLocal": e.LinkLocal, "RouterLinkLocal": e.RouterLinkLocal} {
		if a.IsValid() && (!a.Is6() || !a.IsLinkLocalUnicast()) {
			return fmt.Errorf("endpoint %s: %s %s is not an IPv6 link-local address", e.SandboxID, name, a)
		}
	}
	for i, p := range e.EgressCIDRs {
		if !p.IsValid() {
			return fmt.Errorf("endpoint %s: EgressCIDRs[%d] is not a valid prefix", e.SandboxID, i)
		}
	}
	switch {
	case e.DenyMetadata && len(e.MetadataCIDRs) == 0:
		return fmt.Errorf("endpoint %s: DenyMetadata needs MetadataCIDRs, the credential endpoints to block", e.SandboxID)
	case !e.DenyMetadata && len(e.MetadataCIDRs) != 0:
		return fmt.Errorf("endpoint %s: MetadataCIDRs are blocked only with DenyMetadata; set it or drop them", e.SandboxID)
	}
	for i, p := range e.MetadataCIDRs {
		if !p.IsValid() {
			return fmt.Errorf("endpoint %s: MetadataCIDRs[%d] is not a valid prefix", e.SandboxID, i)
		}
	}
	return nil
}

// record is what install writes for one endpoint.
type record struct {
	ifindex  uint32
	value    endpointValue
	egress   []netip.Prefix
	metadata []netip.Prefix
}

func newRecord(e *Endpoint, ifindex int, ifname string, tenant, tier uint32) record {
	v := endpointValue{Tenant: tenant, Tier: tier}
	if e.IPv4.IsValid() {
		v.Flags |= flagHasIPv4
		v.IPv4 = e.IPv4.As4()
	}
	if e.IPv6.IsValid() {
		v.Flags |= flagHasIPv6
		v.IPv6 = e.IPv6.As16()
	}
	if e.LinkLocal.IsValid() {
		v.Flags |= flagHasLinkLocal
		v.LinkLocal = e.LinkLocal.As16()
	}
	if e.RouterLinkLocal.IsValid() {
		v.Flags |= flagHasRouter
		v.Router = e.RouterLinkLocal.As16()
	}
	// A zero MAC matches no frame: such an endpoint sends nothing.
	copy(v.MAC[:], e.MAC)
	if e.AllowRDMA {
		v.Flags |= flagRDMA
	}
	if e.DenyMetadata {
		v.Flags |= flagDenyMetadata
	}
	if e.EgressCIDRs != nil {
		v.Flags |= flagEgressRestricted
	}
	copy(v.Ifname[:], ifname)
	copy(v.Sandbox[:], e.SandboxID)
	return record{ifindex: uint32(ifindex), value: v, egress: e.EgressCIDRs, metadata: e.MetadataCIDRs}
}

// addrs returns the endpoint's addresses as host prefixes: the ones the
// tenant tries map to its tenant. The link-local address is among them, so
// that neighbour discovery from it can be told apart by tenant.
func (v *endpointValue) addrs() []netip.Prefix {
	var out []netip.Prefix
	if v.Flags&flagHasIPv4 != 0 {
		out = append(out, netip.PrefixFrom(netip.AddrFrom4(v.IPv4), 32))
	}
	if v.Flags&flagHasIPv6 != 0 {
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(v.IPv6), 128))
	}
	if v.Flags&flagHasLinkLocal != 0 {
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(v.LinkLocal), 128))
	}
	return out
}

func (v *endpointValue) sandbox() string {
	n := 0
	for n < len(v.Sandbox) && v.Sandbox[n] != 0 {
		n++
	}
	return string(v.Sandbox[:n])
}

func (v *endpointValue) ifname() string {
	n := 0
	for n < len(v.Ifname) && v.Ifname[n] != 0 {
		n++
	}
	return string(v.Ifname[:n])
}

// install writes an endpoint. The endpoint entry comes last: until it exists
// the programs treat the interface as unmanaged, and from then on every map
// it depends on is complete.
func (d *datapath) install(r record) error {
	// The MAC first: it is the one step that refuses an endpoint (a MAC
	// another live pod has) rather than fail on a kernel error.
	o := owner{Tenant: r.value.Tenant, Flags: r.value.Flags & flagRDMA, Ifindex: r.ifindex}
	if err := d.putMACOwner(r.value.MAC, o, d.isEndpoint); err != nil {
		return err
	}
	if err := scopedReplace(d.egressV4, d.egressV6, r.ifindex, r.egress); err != nil {
		return fmt.Errorf("egress allow-list: %w", err)
	}
	if err := scopedReplace(d.metadataV4, d.metadataV6, r.ifindex, r.metadata); err != nil {
		return fmt.Errorf("credential endpoints: %w", err)
	}
	for _, p := range r.value.addrs() {
		if err := d.putOwner(p, o); err != nil {
			return fmt.Errorf("address %s: %w", p.Addr(), err)
		}
	}
	if err := d.endpoints.Update(r.ifindex, r.value, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("endpoint entry: %w", err)
	}
	return nil
}

// remove deletes everything install wrote for ifindex. The endpoint entry
// goes first so the programs never see it half-removed. Addresses that were
// since given to another interface are kept.
func (d *datapath) remove(ifindex uint32, v endpointValue) error {
	if err := ignoreNotExist(d.endpoints.Delete(ifindex)); err != nil {
		return fmt.Errorf("endpoint entry: %w", err)
	}
	for _, p := range v.addrs() {
		o, ok, err := d.ownerOf(p)
		if err != nil {
			return fmt.Errorf("address %s: %w", p.Addr(), err)
		}
		if ok && o.Ifindex == ifindex && o.Flags&flagRemote == 0 {
			if err := d.deleteOwner(p); err != nil {
				return fmt.Errorf("address %s: %w", p.Addr(), err)
			}
		}
	}
	if err := d.deleteMACOwner(v.MAC, ifindex); err != nil {
		return fmt.Errorf("MAC %s: %w", HardwareAddr(v.MAC[:]), err)
	}
	if err := scopedReplace(d.egressV4, d.egressV6, ifindex, nil); err != nil {
		return fmt.Errorf("egress allow-list: %w", err)
	}
	if err := scopedReplace(d.metadataV4, d.metadataV6, ifindex, nil); err != nil {
		return fmt.Errorf("credential endpoints: %w", err)
	}
	return nil
}

// isEndpoint reports whether ifindex holds an endpoint entry.
func (d *datapath) isEndpoint(ifindex uint32) bool {
	_, ok, err := d.endpoint(ifindex)
	return ok || err != nil
}

// endpoint reads one endpoint entry.
func (d *datapath) endpoint(ifindex uint32) (endpointValue, bool, error) {
	var v endpointValue
	err := d.endpoints.Lookup(ifindex, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false, nil
	}
	return v, err == nil, err
}

// allEndpoints lists the endpoint entries by ifindex.
func (d *datapath) allEndpoints() (map[uint32]endpointValue, error) {
	out := map[uint32]endpointValue{}
	var (
		k uint32
		v endpointValue
	)
	it := d.endpoints.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}
