package netpol

import (
	"net/netip"
	"strings"
	"testing"
)

// Issue 24: the credential endpoints are the policy's list, held per pod in
// metadata_v4/v6, not two constants in the program. Every listed endpoint
// drops both ways for a pod that denies metadata; its neighbours and a pod
// that allows metadata pass.
func metadataCases() []verdictCase {
	var cases []verdictCase
	for _, p := range testMetadataCIDRs() {
		a := p.Addr().String()
		if p.Addr().Is4() {
			cases = append(cases,
				verdictCase{name: "to " + a, dir: FromPod, ep: noMeta, frame: ipv4(podV4, a, 6, tcp(1, 80), v4opts{}), drop: true, reason: ReasonMetadata},
				verdictCase{name: "from " + a, dir: ToPod, ep: noMeta, frame: ipv4(a, podV4, 6, tcp(80, 1), v4opts{}), drop: true, reason: ReasonMetadata},
				verdictCase{name: "rocev2 to " + a, dir: FromPod, ep: noMeta, frame: ipv4(podV4, a, 17, udp(1, roceV2Port), v4opts{}), drop: true, reason: ReasonMetadata},
				verdictCase{name: "to " + a + " allowed by tier", dir: FromPod, frame: ipv4(podV4, a, 6, tcp(1, 80), v4opts{})},
			)
			continue
		}
		cases = append(cases,
			verdictCase{name: "to " + a, dir: FromPod, ep: noMeta, frame: ipv6(podV6, a, 6, tcp(1, 80)), drop: true, reason: ReasonMetadata},
			verdictCase{name: "from " + a, dir: ToPod, ep: noMeta, frame: ipv6(a, podV6, 6, tcp(80, 1)), drop: true, reason: ReasonMetadata},
			// The fixture's cluster range fd00::/8 holds AWS's addresses:
			// allowed by the tier, they are unowned cluster addresses.
			verdictCase{name: "to " + a + " allowed by tier", dir: FromPod, frame: ipv6(podV6, a, 6, tcp(1, 80)), drop: true, reason: ReasonCluster},
		)
	}
	return append(cases,
		verdictCase{name: "neighbour of 169.254.170.2", dir: FromPod, ep: noMeta, frame: ipv4(podV4, "169.254.170.3", 6, tcp(1, 80), v4opts{})},
		verdictCase{name: "neighbour of fd00:ec2::23", dir: FromPod, ep: noMeta, frame: ipv6(podV6, "fd00:ec2::24", 6, tcp(1, 80)), drop: true, reason: ReasonCluster},
		verdictCase{name: "a list of the pod's own", dir: FromPod, ep: func(e *Endpoint) {
			e.DenyMetadata, e.MetadataCIDRs = true, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28")}
		}, frame: ipv4(podV4, "192.0.2.9", 6, tcp(1, 80), v4opts{}), drop: true, reason: ReasonMetadata},
		verdictCase{name: "169.254.169.254 off the pod's own list", dir: FromPod, ep: func(e *Endpoint) {
			e.DenyMetadata, e.MetadataCIDRs = true, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28")}
		}, frame: ipv4(podV4, "169.254.169.254", 6, tcp(1, 80), v4opts{})},
	)
}

func TestMetadataVerdicts(t *testing.T) {
	d := loadFixture(t)
	tenants := map[string]uint32{"a": tenantA}
	for _, tc := range metadataCases() {
		t.Run(tc.name, func(t *testing.T) { checkVerdict(t, d, tenants, tc) })
	}
	// Removing the endpoint empties its list.
	e := podEndpoint(noMeta)
	r := newRecord(&e, loIfindex, "lo", tenantA, tierStd)
	if err := d.install(r); err != nil {
		t.Fatal(err)
	}
	if err := d.remove(loIfindex, r.value); err != nil {
		t.Fatal(err)
	}
	if left, err := scopedList(d.metadataV4, d.metadataV6, loIfindex); err != nil || len(left) != 0 {
		t.Errorf("credential endpoints left after remove: %v (err %v)", left, err)
	}
}

func TestMetadataEndpointValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Endpoint)
		want string // "" for valid
	}{
		{"deny with a list", noMeta, ""},
		{"deny without a list", func(e *Endpoint) { e.DenyMetadata = true }, "DenyMetadata needs MetadataCIDRs"},
		{"a list without deny", func(e *Endpoint) { e.MetadataCIDRs = testMetadataCIDRs() }, "only with DenyMetadata"},
		{"an invalid prefix", func(e *Endpoint) {
			e.DenyMetadata, e.MetadataCIDRs = true, []netip.Prefix{{}}
		}, "MetadataCIDRs[0] is not a valid prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := podEndpoint(tc.mod)
			err := e.validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
