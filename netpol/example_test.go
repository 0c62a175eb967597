package netpol_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"

	"github.com/bulkhead-runtime/bulkhead/netpol"
)

// The shim's use: open the node's fence once, then register each sandbox's
// host veth (found from the netns path in the OCI spec) with the tenant and
// tier the policy decided, and unregister it on delete.
func Example() {
	ctx := context.Background()
	if err := netpol.MountBPFFS("/sys/fs/bpf"); err != nil {
		log.Fatal(err)
	}
	m, err := netpol.Open(ctx, netpol.Options{
		PinDir: netpol.DefaultPinDir,
		Cluster: &netpol.ClusterConfig{
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")},
			SharedServices: map[string][]netip.Prefix{
				"untrusted": {netip.MustParsePrefix("10.96.0.10/32")}, // cluster DNS
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	ifindex, _, err := netpol.HostVeth("/var/run/netns/cni-1234", "eth0")
	if err != nil {
		log.Fatal(err)
	}
	err = m.Register(ctx, netpol.Endpoint{
		SandboxID:    "4f1c...",
		Ifindex:      ifindex,
		Tenant:       "acme",
		Tier:         "untrusted",
		IPv4:         netip.MustParseAddr("10.88.0.7"),
		DenyMetadata: true,
		// The decision's network.metadata_cidrs.
		MetadataCIDRs: []netip.Prefix{netip.MustParsePrefix("169.254.169.254/32"), netip.MustParsePrefix("fd00:ec2::254/128")},
		EgressCIDRs:   []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
	})
	if err != nil {
		log.Fatal(err) // fail closed: the pod must not start
	}
	stats, err := m.Stats("acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(stats.Drops[netpol.ReasonTenant])

	if err := m.Unregister(ctx, "4f1c..."); err != nil {
		log.Fatal(err)
	}
}

// The node agent's use: the pods of other nodes, from the API server, by
// address and tenant. A full set at the first sync and now and then, single
// pods as they change; an address not in the set is an unknown cluster
// address, dropped for every tier.
func ExampleManager_SetRemote() {
	ctx := context.Background()
	m, err := netpol.Open(ctx, netpol.Options{}) // the node's pinned fence
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	err = m.SetRemote(ctx, []netpol.RemotePod{
		{Addr: netip.MustParseAddr("10.88.1.7"), Tenant: "acme"},
		{Addr: netip.MustParseAddr("fd00:88:1::7"), Tenant: "acme"},
	})
	if err != nil && !errors.Is(err, netpol.ErrAddressHeld) {
		log.Fatal(err)
	}
	// The pod is gone and its address reused by another tenant's pod: one
	// update, never a moment with the old tenant.
	if err := m.UpsertRemote(ctx, netpol.RemotePod{Addr: netip.MustParseAddr("10.88.1.7"), Tenant: "globex"}); err != nil {
		log.Fatal(err)
	}
	if err := m.DeleteRemote(ctx, netip.MustParseAddr("fd00:88:1::7")); err != nil {
		log.Fatal(err)
	}
}
