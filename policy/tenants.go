package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/bulkhead-runtime/bulkhead/internal/dnslabel"
)

// Tenants enter the policy from two places: the signed bundle's data and
// the unsigned data file (Options.DataPath). Both are checked here, at
// load, before anything is compiled: a refusal names the tenant, the field
// and the rule, and nothing of the bundle or the file is used.
//
// Every tenant, tier and namespace name is a DNS-1123 label, wherever it
// comes from: a tenant name becomes a fence identity and a quota ledger
// key, and "agents\x00" must never read as "agents" anywhere downstream.
//
// The data file may add tenants, never touch one the bundle defines, and a
// tenant it adds gets nothing its signed tier does not bound: its tier is
// one the bundle defines and opens to the file (unsigned_tenants: true; a
// tier without it, such as the default trusted, takes signed tenants
// only), its namespaces are no signed tenant's, its keys are the tenant
// fields of data.schema.json, and every CIDR of its egress allow-list lies
// inside its tier's network.unsigned_egress_bound (a tier without one lets
// the data file list none). Its quota is not bounded by the tier: the
// tier's own caps (gpu.max_slices) apply to every tenant whatever its
// quota says.

// unsignedTenants is the tier key that lets the data file put a tenant on
// the tier: true opens it, absent or false keeps it to signed tenants.
const unsignedTenants = "unsigned_tenants"

// unsignedEgressBound is the tier key, under network, that bounds the
// egress allow-list of a tenant from the data file.
const unsignedEgressBound = "unsigned_egress_bound"

// tenantFields are the keys a tenant from the data file may set, each
// with the shape checkTenant wants (data.schema.json).
var tenantFields = []string{"tier", "namespaces", "egress_cidrs", "quota"}

// quotaFields are the keys of a tenant's quota.
var quotaFields = []string{"sandboxes", "gpu_slices", "memory"}

// objectAt walks data by keys; nil when a key is missing or a value on the
// way is not an object.
func objectAt(data map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := data[k].(map[string]any)
		if !ok {
			return nil
		}
		data = next
	}
	return data
}

// checkSignedData refuses a bundle whose data names a tenant, a tier or a
// namespace with anything but a DNS-1123 label.
func checkSignedData(data map[string]any) error {
	bh, ok := data["bulkhead"].(map[string]any)
	if !ok {
		return nil // not the default bundle's shape: nothing here names a tenant
	}
	if tiers, ok := bh["tiers"]; ok {
		obj, ok := tiers.(map[string]any)
		if !ok {
			return fmt.Errorf("data.bulkhead.tiers: want an object of tiers, got %s", jsonType(tiers))
		}
		for _, name := range slices.Sorted(maps.Keys(obj)) {
			if err := dnslabel.Check(name); err != nil {
				return fmt.Errorf("data.bulkhead.tiers: tier %q %w", name, err)
			}
			// Checked here, not when a data file names the tier: a
			// misspelt value must not pass for "closed" until the day a
			// file needs it.
			tier, _ := obj[name].(map[string]any)
			if v, ok := tier[unsignedTenants]; ok {
				if _, ok := v.(bool); !ok {
					return fmt.Errorf("data.bulkhead.tiers: tier %q %s: want a boolean, got %s", name, unsignedTenants, jsonType(v))
				}
			}
		}
	}
	tenants, ok := bh["tenants"]
	if !ok {
		return nil
	}
	obj, ok := tenants.(map[string]any)
	if !ok {
		return fmt.Errorf("data.bulkhead.tenants: want an object of tenants, got %s", jsonType(tenants))
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		if err := checkTenant(name, obj[name], false); err != nil {
			return fmt.Errorf("data.bulkhead.tenants: %w", err)
		}
	}
	return nil
}

// checkUnsignedTenants refuses the data file's tenants (the value of its
// bulkhead.tenants) unless every one is new, well formed and within its
// signed tier; signed is the bundle's data.
func checkUnsignedTenants(signed map[string]any, tenants any) error {
	obj, ok := tenants.(map[string]any)
	if !ok {
		return fmt.Errorf("key \"bulkhead.tenants\": want an object of tenants, got %s", jsonType(tenants))
	}
	signedTenants := objectAt(signed, "bulkhead", "tenants")
	signedTiers := objectAt(signed, "bulkhead", "tiers")
	// The namespaces signed tenants list, to their tenant.
	owner := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(signedTenants)) {
		t, _ := signedTenants[name].(map[string]any)
		nss, _ := t["namespaces"].([]any)
		for _, ns := range nss {
			if s, ok := ns.(string); ok {
				owner[s] = name
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		if _, ok := signedTenants[name]; ok {
			keys := "nothing"
			if t, ok := obj[name].(map[string]any); ok && len(t) > 0 {
				keys = fmt.Sprintf("%q", slices.Sorted(maps.Keys(t)))
			}
			return fmt.Errorf("tenant %q is defined by the signed bundle; the unsigned data file may not add to it or restate it (it sets %s)", name, keys)
		}
		if err := checkTenant(name, obj[name], true); err != nil {
			return err
		}
		t := obj[name].(map[string]any) // checkTenant checked
		tierName, _ := t["tier"].(string)
		tier, ok := signedTiers[tierName].(map[string]any)
		if !ok {
			return fmt.Errorf("tenant %q: tier %q is not a tier of the signed bundle (data.bulkhead.tiers)", name, tierName)
		}
		if open, _ := tier[unsignedTenants].(bool); !open {
			return fmt.Errorf("tenant %q: tier %q does not set %s: true (data.bulkhead.tiers.%s.%s): a tenant from the unsigned data file may name only a tier the signed bundle opens to it; sign this tenant into the bundle instead", name, tierName, unsignedTenants, tierName, unsignedTenants)
		}
		nss, _ := t["namespaces"].([]any)
		for _, ns := range nss {
			if o, ok := owner[ns.(string)]; ok {
				return fmt.Errorf("tenant %q: namespace %q belongs to tenant %q of the signed bundle", name, ns, o)
			}
		}
		bound, err := egressBound(tierName, tier)
		if err != nil {
			return err
		}
		if err := checkEgressBound(name, t, tierName, bound); err != nil {
			return err
		}
	}
	return nil
}

// checkTenant checks the tenant name and the names and shapes of its
// fields. strict (a tenant of the data file) also refuses keys that are
// not tenant fields and requires tier and namespaces; a signed bundle may
// carry fields of its own for its own rules.
func checkTenant(name string, v any, strict bool) error {
	if err := dnslabel.Check(name); err != nil {
		return fmt.Errorf("tenant %q %w", name, err)
	}
	t, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("tenant %q: want an object, got %s", name, jsonType(v))
	}
	if strict {
		var unknown []string
		for k := range t {
			if !slices.Contains(tenantFields, k) {
				unknown = append(unknown, k)
			}
		}
		if len(unknown) > 0 {
			return fmt.Errorf("tenant %q: key %q is not a tenant field (%s)", name, slices.Min(unknown), strings.Join(tenantFields, ", "))
		}
		for _, k := range []string{"tier", "namespaces"} {
			if _, ok := t[k]; !ok {
				return fmt.Errorf("tenant %q: %s is required", name, k)
			}
		}
	}
	if tier, ok := t["tier"]; ok {
		s, ok := tier.(string)
		if !ok {
			return fmt.Errorf("tenant %q: tier: want a tier name, got %s", name, jsonType(tier))
		}
		if err := dnslabel.Check(s); err != nil {
			return fmt.Errorf("tenant %q: tier %q %w", name, s, err)
		}
	}
	if nss, ok := t["namespaces"]; ok {
		list, ok := nss.([]any)
		if !ok {
			return fmt.Errorf("tenant %q: namespaces: want an array of namespace names, got %s", name, jsonType(nss))
		}
		for i, ns := range list {
			s, ok := ns.(string)
			if !ok {
				return fmt.Errorf("tenant %q: namespaces[%d]: want a namespace name, got %s", name, i, jsonType(ns))
			}
			if err := dnslabel.Check(s); err != nil {
				return fmt.Errorf("tenant %q: namespaces[%d] %q %w", name, i, s, err)
			}
		}
	}
	if !strict {
		return nil
	}
	if q, ok := t["quota"]; ok {
		if err := checkQuota(name, q); err != nil {
			return err
		}
	}
	return nil
}

// checkQuota refuses a quota the rules would misread: a count that is not a
// non-negative integer (a string "3" compares above every number in Rego,
// so it would never limit), a memory that is not a string, a key that is
// not a quota field.
func checkQuota(tenant string, v any) error {
	q, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("tenant %q: quota: want an object, got %s", tenant, jsonType(v))
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch k {
		case "sandboxes", "gpu_slices":
			n, ok := q[k].(json.Number)
			if i, err := n.Int64(); !ok || err != nil || i < 0 {
				return fmt.Errorf("tenant %q: quota.%s: want a non-negative integer, got %s", tenant, k, jsonText(q[k]))
			}
		case "memory":
			if _, ok := q[k].(string); !ok {
				return fmt.Errorf("tenant %q: quota.memory: want a quantity such as \"64Gi\", got %s", tenant, jsonText(q[k]))
			}
		default:
			return fmt.Errorf("tenant %q: key \"quota.%s\" is not a quota field (%s)", tenant, k, strings.Join(quotaFields, ", "))
		}
	}
	return nil
}

// egressBound is the tier's network.unsigned_egress_bound, parsed; none
// when the tier sets none.
func egressBound(tierName string, tier map[string]any) ([]netip.Prefix, error) {
	nw, _ := tier["network"].(map[string]any)
	raw, ok := nw[unsignedEgressBound]
	if !ok {
		return nil, nil
	}
	items, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("tier %q network.%s: want an array of CIDRs, got %s", tierName, unsignedEgressBound, jsonType(raw))
	}
	bound := make([]netip.Prefix, 0, len(items))
	for i, item := range items {
		p, err := parseCIDR(item)
		if err != nil {
			return nil, fmt.Errorf("tier %q network.%s[%d]: %w", tierName, unsignedEgressBound, i, err)
		}
		bound = append(bound, p)
	}
	return bound, nil
}

// checkEgressBound refuses an egress allow-list with a CIDR outside bound,
// the tier's network.unsigned_egress_bound.
func checkEgressBound(name string, t map[string]any, tierName string, bound []netip.Prefix) error {
	raw, ok := t["egress_cidrs"]
	if !ok {
		return nil
	}
	list, ok := raw.([]any)
	if !ok {
		return fmt.Errorf("tenant %q: egress_cidrs: want an array of CIDRs, got %s", name, jsonType(raw))
	}
	for i, item := range list {
		p, err := parseCIDR(item)
		if err != nil {
			return fmt.Errorf("tenant %q: egress_cidrs[%d]: %w", name, i, err)
		}
		if !slices.ContainsFunc(bound, func(b netip.Prefix) bool { return within(p, b) }) {
			return fmt.Errorf("tenant %q: egress_cidrs[%d] %s lies outside tier %q network.%s %v: a tenant from the unsigned data file may list only CIDRs inside its signed tier's bound", name, i, p, tierName, unsignedEgressBound, bound)
		}
	}
	return nil
}

// parseCIDR reads a CIDR as the fence will: IPv4 written as IPv4, never
// as an IPv4-mapped IPv6 prefix, which would stand for IPv4 addresses
// under an IPv6 bound.
func parseCIDR(v any) (netip.Prefix, error) {
	s, ok := v.(string)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("want a CIDR string, got %s", jsonText(v))
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: %w", s, err)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 prefix; write IPv4 ranges as IPv4", s)
	}
	return p.Masked(), nil
}

// within reports whether every address of p lies in b.
func within(p, b netip.Prefix) bool {
	return p.Addr().Is4() == b.Addr().Is4() && b.Bits() <= p.Bits() && b.Contains(p.Addr())
}

// jsonType names the JSON type of a decoded value.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number, float64, int, int64:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// jsonText is v as JSON, for a message.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}
