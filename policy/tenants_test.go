package policy

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// signedAgents is a tenant the signed bundle of these tests defines.
const signedAgents = `{"agents": {"tier": "untrusted", "namespaces": ["agents"], "egress_cidrs": ["10.96.0.0/12"]}}`

// bundleWithTenants writes the default bundle (policytest: its modules
// without tests, .manifest, rego/data.json) with data.bulkhead.tenants set
// to tenants, a JSON object: the tenants the security team signed. mod,
// when set, edits the data.
func bundleWithTenants(t testing.TB, tenants string, mod func(data map[string]any)) string {
	t.Helper()
	var edits []policytest.Edit
	if mod != nil {
		edits = append(edits, mod)
	}
	return policytest.BundleWithTenants(t, `{"bulkhead": {"tenants": `+tenants+`}}`, edits...)
}

// openWithDataFile opens bundle with a data file holding tenants as its
// bulkhead.tenants.
func openWithDataFile(t testing.TB, bundle, tenants string) (*Engine, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tenants.json")
	if err := os.WriteFile(path, []byte(`{"bulkhead": {"tenants": `+tenants+`}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return Open(context.Background(), Options{BundlePath: bundle, DataPath: path, InsecureSkipVerification: true, Logger: quietLogger()})
}

// TestDataFileStaysWithinSignedTenantsAndTiers: the unsigned data file
// adds tenants, never touches a signed one, and a tenant it adds gets no
// egress its signed tier does not bound (issue 24, hole 4).
func TestDataFileStaysWithinSignedTenantsAndTiers(t *testing.T) {
	bundle := bundleWithTenants(t, signedAgents, nil)
	bots := func(fields string) string {
		return `{"bots": {"tier": "untrusted", "namespaces": ["bots"]` + fields + `}}`
	}
	for _, tc := range []struct {
		name, tenants string
		want          string // "" = accepted
	}{
		// A signed tenant is the signer's alone: not widened, not restated.
		{"widens a signed tenant's egress", `{"agents": {"egress_cidrs": ["0.0.0.0/0", "::/0"]}}`,
			`tenant "agents" is defined by the signed bundle; the unsigned data file may not add to it or restate it (it sets ["egress_cidrs"])`},
		{"adds a quota to a signed tenant", `{"agents": {"quota": {"sandboxes": 1000}}}`, `tenant "agents" is defined by the signed bundle`},
		{"adds a namespace key to a signed tenant", `{"agents": {"extra": ["kube-system"]}}`, `(it sets ["extra"])`},
		{"restates a signed tenant", `{"agents": {"tier": "untrusted", "namespaces": ["agents"], "egress_cidrs": ["10.96.0.0/12"]}}`, `tenant "agents" is defined by the signed bundle`},
		{"names a signed tenant with nothing", `{"agents": {}}`, `(it sets nothing)`},
		{"claims a signed tenant's namespace", `{"bots": {"tier": "untrusted", "namespaces": ["bots", "agents"]}}`,
			`tenant "bots": namespace "agents" belongs to tenant "agents" of the signed bundle`},

		// A tenant the file adds stays inside its signed tier.
		{"new tenant, egress inside the bound", bots(`, "egress_cidrs": ["10.96.0.0/12", "192.168.4.0/24", "fd00:1::/64"]`), ""},
		{"new tenant, no egress", bots(``), ""},
		{"new tenant, egress to the internet", bots(`, "egress_cidrs": ["0.0.0.0/0"]`),
			`tenant "bots": egress_cidrs[0] 0.0.0.0/0 lies outside tier "untrusted" network.unsigned_egress_bound [10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 fc00::/7]`},
		{"new tenant, egress to all of IPv6", bots(`, "egress_cidrs": ["10.0.0.0/8", "::/0"]`), `egress_cidrs[1] ::/0 lies outside`},
		{"new tenant, egress wider than the bound", bots(`, "egress_cidrs": ["10.0.0.0/7"]`), `egress_cidrs[0] 10.0.0.0/7 lies outside`},
		{"new tenant, egress to a metadata service", bots(`, "egress_cidrs": ["169.254.169.254/32"]`), `lies outside`},
		{"new tenant, egress to CGNAT space", bots(`, "egress_cidrs": ["100.100.100.200/32"]`), `lies outside`},
		{"new tenant, IPv4-mapped egress", bots(`, "egress_cidrs": ["::ffff:10.0.0.0/104"]`), `IPv4-mapped IPv6 prefix`},
		{"new tenant, egress not a CIDR", bots(`, "egress_cidrs": ["10.0.0.0"]`), `egress_cidrs[0]: "10.0.0.0" is not a CIDR`},
		{"new tenant, egress not a string", bots(`, "egress_cidrs": [167772160]`), `egress_cidrs[0]: want a CIDR string, got 167772160`},
		{"new tenant, egress not a list", bots(`, "egress_cidrs": "0.0.0.0/0"`), `egress_cidrs: want an array of CIDRs, got a string`},
		{"tier without a bound lists nothing", `{"lab": {"tier": "standard", "namespaces": ["lab"], "egress_cidrs": ["10.1.0.0/16"]}}`,
			`tenant "lab": egress_cidrs[0] 10.1.0.0/16 lies outside tier "standard" network.unsigned_egress_bound []`},
		{"unknown tier", `{"bots": {"tier": "gold", "namespaces": ["bots"]}}`, `tenant "bots": tier "gold" is not a tier of the signed bundle`},
		{"field that is no tenant field", bots(`, "allow_privileged": true`), `tenant "bots": key "allow_privileged" is not a tenant field (tier, namespaces, egress_cidrs, quota)`},
		{"no namespaces", `{"bots": {"tier": "untrusted"}}`, `tenant "bots": namespaces is required`},
		{"no tier", `{"bots": {"namespaces": ["bots"]}}`, `tenant "bots": tier is required`},
		{"namespaces not a list", `{"bots": {"tier": "untrusted", "namespaces": "bots"}}`, `namespaces: want an array of namespace names, got a string`},
		{"tenant not an object", `{"bots": "untrusted"}`, `tenant "bots": want an object, got a string`},
		{"tenants not an object", `["bots"]`, `key "bulkhead.tenants": want an object of tenants, got an array`},
		{"quota count as a string", bots(`, "quota": {"sandboxes": "3"}`), `tenant "bots": quota.sandboxes: want a non-negative integer, got "3"`},
		{"negative quota", bots(`, "quota": {"gpu_slices": -1}`), `quota.gpu_slices: want a non-negative integer, got -1`},
		{"fractional quota", bots(`, "quota": {"gpu_slices": 1.5}`), `quota.gpu_slices: want a non-negative integer`},
		{"memory as a number", bots(`, "quota": {"memory": 64}`), `quota.memory: want a quantity such as "64Gi", got 64`},
		{"unknown quota field", bots(`, "quota": {"gpus": 8}`), `key "quota.gpus" is not a quota field`},
		{"quota inside bounds", bots(`, "quota": {"sandboxes": 3, "gpu_slices": 6, "memory": "64Gi"}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openWithDataFile(t, bundle, tc.tenants)
			checkOpenErr(t, err, tc.want)
		})
	}
}

// TestDataFileTenantGetsOnlyItsListedEgress: a tenant the data file adds
// within the bound is decided with exactly its list, and the signed tenant
// keeps its own.
func TestDataFileTenantGetsOnlyItsListedEgress(t *testing.T) {
	bundle := bundleWithTenants(t, signedAgents, nil)
	e, err := openWithDataFile(t, bundle, `{"bots": {"tier": "untrusted", "namespaces": ["bots"], "egress_cidrs": ["192.168.4.0/24"]}}`)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for ns, want := range map[string]string{"bots": "192.168.4.0/24", "agents": "10.96.0.0/12"} {
		in := agentPod()
		in.Namespace = ns
		d, err := e.Decide(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(d.Network.EgressCIDRs, ","); got != want {
			t.Errorf("namespace %s: egress_cidrs %q, want %q", ns, got, want)
		}
	}
}

// A signed tier's bound must itself be CIDRs.
func TestUnsignedEgressBoundMalformed(t *testing.T) {
	bundle := bundleWithTenants(t, `{}`, func(data map[string]any) {
		nw := data["bulkhead"].(map[string]any)["tiers"].(map[string]any)["untrusted"].(map[string]any)["network"].(map[string]any)
		nw["unsigned_egress_bound"] = []any{"10.0.0.0/8", "everywhere"}
	})
	_, err := openWithDataFile(t, bundle, `{"bots": {"tier": "untrusted", "namespaces": ["bots"], "egress_cidrs": ["10.1.0.0/16"]}}`)
	want := `tier "untrusted" network.unsigned_egress_bound[1]: "everywhere" is not a CIDR`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open = %v, want an error containing %s", err, want)
	}
}

// TestDataFileTierNeedsSignedConsent: the data file may name only a tier
// whose signed settings say unsigned_tenants: true, so that whoever writes
// the unsigned file cannot put a tenant on trusted (runc, privileged, host
// network, "/" mounted read-write) (issue 36, item 4). Absent or false
// refuses; a value that is not a boolean refuses the bundle itself.
func TestDataFileTierNeedsSignedConsent(t *testing.T) {
	tenant := func(name, tier string) string {
		return `"` + name + `": {"tier": "` + tier + `", "namespaces": ["` + name + `"]}`
	}
	tiersOf := func(data map[string]any) map[string]any {
		return data["bulkhead"].(map[string]any)["tiers"].(map[string]any)
	}
	// batch is the default standard tier under another name, with the
	// key set to v (nil: left out).
	batch := func(v any) func(map[string]any) {
		return func(data map[string]any) {
			tiers := tiersOf(data)
			b := maps.Clone(tiers["standard"].(map[string]any))
			delete(b, "unsigned_tenants")
			if v != nil {
				b["unsigned_tenants"] = v
			}
			tiers["batch"] = b
		}
	}
	setOn := func(tier string, v any) func(map[string]any) {
		return func(data map[string]any) { tiersOf(data)[tier].(map[string]any)["unsigned_tenants"] = v }
	}
	for _, tc := range []struct {
		name    string
		mod     func(map[string]any) // edits the signed data
		tenants string               // the data file's tenants; "" = no data file
		want    string               // "" = accepted
	}{
		{"trusted is refused", nil, `{` + tenant("ops", "trusted") + `}`,
			`tenant "ops": tier "trusted" does not set unsigned_tenants: true (data.bulkhead.tiers.trusted.unsigned_tenants)`},
		{"standard is accepted", nil, `{` + tenant("lab", "standard") + `}`, ""},
		{"untrusted is accepted", nil, `{` + tenant("bots", "untrusted") + `}`, ""},
		{"one refused tenant refuses the file", nil, `{` + tenant("lab", "standard") + `, ` + tenant("ops", "trusted") + `}`,
			`tenant "ops": tier "trusted" does not set unsigned_tenants`},
		{"custom tier without the key is refused", batch(nil), `{` + tenant("etl", "batch") + `}`,
			`tenant "etl": tier "batch" does not set unsigned_tenants: true (data.bulkhead.tiers.batch.unsigned_tenants)`},
		{"custom tier with the key is accepted", batch(true), `{` + tenant("etl", "batch") + `}`, ""},
		{"the key false is refused", setOn("standard", false), `{` + tenant("lab", "standard") + `}`,
			`tenant "lab": tier "standard" does not set unsigned_tenants: true`},
		{"the key set on trusted lets the file name it", setOn("trusted", true), `{` + tenant("ops", "trusted") + `}`, ""},
		{"the key as a string refuses the bundle", setOn("standard", "true"), "",
			`data.bulkhead.tiers: tier "standard" unsigned_tenants: want a boolean, got a string`},
		{"the key as null refuses the bundle", setOn("standard", nil), "",
			`data.bulkhead.tiers: tier "standard" unsigned_tenants: want a boolean, got null`},
		{"a tier without the key loads", batch(nil), "", ""},
		{"the key as a number refuses the bundle", setOn("trusted", 1), "",
			`data.bulkhead.tiers: tier "trusted" unsigned_tenants: want a boolean, got a number`},
		{"the key as an object refuses the bundle with a data file", setOn("untrusted", map[string]any{"allow": true}), `{` + tenant("bots", "untrusted") + `}`,
			`data.bulkhead.tiers: tier "untrusted" unsigned_tenants: want a boolean, got an object`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bundle := bundleWithTenants(t, signedAgents, tc.mod)
			var err error
			if tc.tenants == "" {
				var e *Engine
				if e, err = Open(context.Background(), Options{BundlePath: bundle, InsecureSkipVerification: true, Logger: quietLogger()}); err == nil {
					e.Close()
				}
			} else {
				var e *Engine
				if e, err = openWithDataFile(t, bundle, tc.tenants); err == nil {
					e.Close()
				}
			}
			checkOpenErr(t, err, tc.want)
		})
	}
}

// badNames are names that are not DNS-1123 labels, each with what the
// refusal says about it. "agents\u0000" is the one that aliased agents'
// fence identity (issue 24, hole 5).
var badNames = []struct{ json, says string }{
	{`"agents\u0000"`, `"agents\x00" holds "\x00" at byte 6`},
	{`"\u0000agents"`, `"\x00agents" holds "\x00" at byte 0`},
	{`"Agents"`, `"Agents" holds "A" at byte 0`},
	{`"a_b"`, `"a_b" holds "_" at byte 1`},
	{`"a.b"`, `"a.b" holds "." at byte 1`},
	{`"agents\n"`, `"agents\n" holds "\n" at byte 6`},
	{`"-agents"`, `"-agents" starts or ends with '-'`},
	{`"` + strings.Repeat("a", 64) + `"`, `"` + strings.Repeat("a", 64) + `" is 64 bytes; a DNS-1123 label is at most 63`},
	{`""`, `"" is empty`},
}

// TestNamesAreLabelsInDataFile: every tenant, tier and namespace name the
// data file brings is a DNS-1123 label.
func TestNamesAreLabelsInDataFile(t *testing.T) {
	bundle := bundleWithTenants(t, signedAgents, nil)
	for _, bad := range badNames {
		for what, tc := range map[string]struct{ tenants, want string }{
			"tenant":    {`{` + bad.json + `: {"tier": "untrusted", "namespaces": ["bots"]}}`, `tenant ` + bad.says},
			"tier":      {`{"bots": {"tier": ` + bad.json + `, "namespaces": ["bots"]}}`, `tenant "bots": tier ` + bad.says},
			"namespace": {`{"bots": {"tier": "untrusted", "namespaces": ["bots", ` + bad.json + `]}}`, `tenant "bots": namespaces[1] ` + bad.says},
		} {
			t.Run(what+" "+bad.json, func(t *testing.T) {
				_, err := openWithDataFile(t, bundle, tc.tenants)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Open = %v\nwant an error containing %s", err, tc.want)
				}
			})
		}
	}
	// The longest label passes.
	long := strings.Repeat("a", 63)
	if _, err := openWithDataFile(t, bundle, `{"`+long+`": {"tier": "untrusted", "namespaces": ["`+long+`"]}}`); err != nil {
		t.Errorf("a 63-byte tenant and namespace: %v", err)
	}
}

// TestNamesAreLabelsInSignedBundle: the signed bundle's tenant, tier and
// namespace names are labels too; a signature vouches for who wrote a
// name, not for what the fence and the ledgers make of it.
func TestNamesAreLabelsInSignedBundle(t *testing.T) {
	for _, bad := range badNames {
		for what, tc := range map[string]struct {
			tenants string
			mod     func(map[string]any)
			want    string
		}{
			"tenant":    {tenants: `{` + bad.json + `: {"tier": "untrusted", "namespaces": ["bots"]}}`, want: `data.bulkhead.tenants: tenant ` + bad.says},
			"tier ref":  {tenants: `{"bots": {"tier": ` + bad.json + `, "namespaces": ["bots"]}}`, want: `data.bulkhead.tenants: tenant "bots": tier ` + bad.says},
			"namespace": {tenants: `{"bots": {"tier": "untrusted", "namespaces": [` + bad.json + `]}}`, want: `data.bulkhead.tenants: tenant "bots": namespaces[0] ` + bad.says},
			"tier": {tenants: `{}`, want: `data.bulkhead.tiers: tier ` + bad.says, mod: func(data map[string]any) {
				var name string
				if err := json.Unmarshal([]byte(bad.json), &name); err != nil {
					t.Fatal(err)
				}
				tiers := data["bulkhead"].(map[string]any)["tiers"].(map[string]any)
				tiers[name] = tiers["untrusted"]
			}},
		} {
			t.Run(what+" "+bad.json, func(t *testing.T) {
				bundle := bundleWithTenants(t, tc.tenants, tc.mod)
				_, err := Open(context.Background(), Options{BundlePath: bundle, InsecureSkipVerification: true, Logger: quietLogger()})
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Open = %v\nwant an error containing %s", err, tc.want)
				}
			})
		}
	}
}

// The tenants of the shipped example are within their tiers and named by
// labels: the demo and the docs load it as it is, over the default bundle.
func TestShippedTenantsLoad(t *testing.T) {
	for _, path := range []string{"rego/examples/tenants.demo.json"} {
		e, err := Open(context.Background(), Options{BundlePath: repoPath(t, "rego"), DataPath: repoPath(t, path), InsecureSkipVerification: true, Logger: quietLogger()})
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		e.Close()
	}
}

// FuzzMergeData: whatever the data file holds, merging it over a bundle
// with signed tenants is an error or a merge that stays within the signed
// tenants and tiers, never a panic: every signed tenant kept as signed,
// the tiers untouched, and every tenant the file added on a tier the
// signed data opens to it (unsigned_tenants: true), never on trusted.
func FuzzMergeData(f *testing.F) {
	raw, err := os.ReadFile(repoPath(f, "rego/data.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		`{"bulkhead": {"tenants": {"agents": {"egress_cidrs": ["0.0.0.0/0", "::/0"]}}}}`,
		`{"bulkhead": {"tenants": {"bots": {"tier": "untrusted", "namespaces": ["bots"], "egress_cidrs": ["10.1.0.0/16"], "quota": {"sandboxes": 3, "memory": "1Gi"}}}}}`,
		`{"bulkhead": {"tenants": {"agents\u0000": {"tier": "untrusted", "namespaces": ["agents"]}}}}`,
		`{"bulkhead": {"tenants": {"bots": {"tier": "untrusted", "namespaces": [null, 1, {}], "egress_cidrs": [[]], "quota": []}}}}`,
		`{"bulkhead": {"tenants": {"ops": {"tier": "trusted", "namespaces": ["ops"]}}}}`,
		`{"bulkhead": {"tenants": {"lab": {"tier": "standard", "namespaces": ["lab"]}, "ops": {"tier": "trusted", "namespaces": ["ops"]}}}}`,
		`{"bulkhead": {"tenants": {"ops": {"tier": "trusted", "namespaces": ["ops"]}}, "tiers": {"trusted": {"unsigned_tenants": true}}}}`,
		`{"bulkhead": {"tenants": null}}`,
		`{"bulkhead": {}}`,
	} {
		f.Add([]byte(seed))
	}
	// The oracle reads the signed data on its own, from a copy the merge
	// never sees.
	var signedData map[string]any
	if err := json.Unmarshal(raw, &signedData); err != nil {
		f.Fatal(err)
	}
	signedTiers := objectAt(signedData, "bulkhead", "tiers")
	tiersJSON, _ := json.Marshal(signedTiers)
	f.Fuzz(func(t *testing.T, file []byte) {
		var data map[string]any
		if err := json.Unmarshal(raw, &data); err != nil {
			t.Fatal(err)
		}
		var signed any
		_ = json.Unmarshal([]byte(signedAgents), &signed)
		data["bulkhead"].(map[string]any)["tenants"] = signed
		b := &bundle.Bundle{Data: data}
		if mergeData(b, file) != nil {
			return
		}
		tenants := objectAt(b.Data, "bulkhead", "tenants")
		agents, _ := tenants["agents"].(map[string]any)
		if len(agents) != 3 || len(agents["egress_cidrs"].([]any)) != 1 {
			t.Fatalf("data file %q changed the signed tenant: %v", file, agents)
		}
		if got, _ := json.Marshal(objectAt(b.Data, "bulkhead", "tiers")); string(got) != string(tiersJSON) {
			t.Fatalf("data file %q changed the signed tiers", file)
		}
		for name, v := range tenants {
			if name == "agents" {
				continue
			}
			tenant, _ := v.(map[string]any)
			tier, _ := tenant["tier"].(string)
			if open, _ := objectAt(signedTiers, tier)["unsigned_tenants"].(bool); !open || tier == "trusted" {
				t.Fatalf("data file %q put tenant %q on tier %q, which the signed data does not open to it", file, name, tier)
			}
		}
	})
}

// checkOpenErr fails t unless err is nil when want is "", or an error
// containing want otherwise.
func checkOpenErr(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open = %v\nwant an error containing %s", err, want)
	}
}
