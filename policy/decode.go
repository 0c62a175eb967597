package policy

import (
	"fmt"
	"math"

	"github.com/open-policy-agent/opa/v1/ast"
)

// shapeError says which field of data.bulkhead.decision has the wrong shape.
type shapeError struct {
	field string
	want  string
	got   ast.Value // nil when the field is missing
}

func (e *shapeError) Error() string {
	field := "decision"
	if e.field != "" {
		field += "." + e.field
	}
	return fmt.Sprintf("%s: want %s, got %s", field, e.want, describe(e.got))
}

func describe(v ast.Value) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case ast.Null:
		return "null"
	case ast.Boolean:
		return "a boolean"
	case ast.String:
		return "a string"
	case ast.Number:
		return "a number"
	case *ast.Array:
		return "an array"
	case ast.Object:
		return "an object"
	case ast.Set:
		return "a set"
	}
	return ast.ValueName(v)
}

// field returns o[name], nil when absent.
func field(o ast.Object, name string) ast.Value {
	if t := o.Get(key(name)); t != nil {
		return t.Value
	}
	return nil
}

// decodeDecision checks the bundle's result against the contract and copies
// it into a Decision, reading the Rego value directly. Every field but
// warnings is required, so that a bundle that forgets one fails closed
// instead of handing the node a zero value.
func decodeDecision(v ast.Value) (Decision, error) {
	var d Decision
	obj, ok := v.(ast.Object)
	if !ok {
		return d, &shapeError{"", "an object", v}
	}
	var err error
	if d.Allow, err = getBool(obj, "allow", "allow"); err != nil {
		return d, err
	}
	if d.Tenant, err = getString(obj, "tenant", "tenant"); err != nil {
		return d, err
	}
	if d.Tier, err = getString(obj, "tier", "tier"); err != nil {
		return d, err
	}
	if d.Runtime, err = getEnum(obj, "runtime", "runtime", RuntimeGVisor, RuntimeRunc); err != nil {
		return d, err
	}
	if d.RDMA, err = getEnum(obj, "rdma", "rdma", RDMADeny, RDMAOwnVF); err != nil {
		return d, err
	}
	rawReasons, ok := field(obj, "reasons").(*ast.Array)
	if !ok {
		return d, &shapeError{"reasons", "an array", field(obj, "reasons")}
	}
	d.Reasons = make([]Reason, rawReasons.Len())
	denied := false
	for i := range d.Reasons {
		at := fmt.Sprintf("reasons[%d]", i)
		rv := rawReasons.Elem(i).Value
		ro, ok := rv.(ast.Object)
		if !ok {
			return d, &shapeError{at, "an object", rv}
		}
		r := &d.Reasons[i]
		if r.Rule, err = getString(ro, "rule", at+".rule"); err != nil {
			return d, err
		}
		if r.Rule == "" {
			return d, &shapeError{at + ".rule", "a non-empty rule id", field(ro, "rule")}
		}
		if r.Message, err = getString(ro, "message", at+".message"); err != nil {
			return d, err
		}
		r.Enforcement = EnforceDeny
		if field(ro, "enforcement") != nil {
			if r.Enforcement, err = getEnum(ro, "enforcement", at+".enforcement", EnforceDeny, EnforceWarn, EnforceAudit); err != nil {
				return d, err
			}
		}
		denied = denied || r.Enforcement == EnforceDeny
	}
	if d.Allow == denied {
		if denied {
			return d, fmt.Errorf("decision.allow is true although a deny reason fired")
		}
		return d, fmt.Errorf("decision.allow is false but no reason with enforcement deny says why")
	}
	if field(obj, "warnings") != nil {
		if d.Warnings, err = getStrings(obj, "warnings", "warnings", false); err != nil {
			return d, err
		}
	}
	gpu, ok := field(obj, "gpu").(ast.Object)
	if !ok {
		return d, &shapeError{"gpu", "an object", field(obj, "gpu")}
	}
	if d.GPU.AllowedProfiles, err = getStrings(gpu, "allowed_profiles", "gpu.allowed_profiles", false); err != nil {
		return d, err
	}
	if d.GPU.MaxSlices, err = getInt(gpu, "max_slices", "gpu.max_slices"); err != nil {
		return d, err
	}
	if d.GPU.WholeGPU, err = getBool(gpu, "whole_gpu", "gpu.whole_gpu"); err != nil {
		return d, err
	}
	if d.GPU.ExclusivePhysicalGPU, err = getBool(gpu, "exclusive_physical_gpu", "gpu.exclusive_physical_gpu"); err != nil {
		return d, err
	}
	if d.GPU.MIGInSandbox, err = getEnum(gpu, "mig_in_sandbox", "gpu.mig_in_sandbox", "refuse", "whole-gpu"); err != nil {
		return d, err
	}
	nw, ok := field(obj, "network").(ast.Object)
	if !ok {
		return d, &shapeError{"network", "an object", field(obj, "network")}
	}
	if d.Network.Isolation, err = getEnum(nw, "isolation", "network.isolation", "tenant", "none"); err != nil {
		return d, err
	}
	if d.Network.EgressCIDRs, err = getStrings(nw, "egress_cidrs", "network.egress_cidrs", true); err != nil {
		return d, err
	}
	if d.Network.DenyMetadata, err = getBool(nw, "deny_metadata", "network.deny_metadata"); err != nil {
		return d, err
	}
	if field(nw, "metadata_cidrs") != nil {
		if d.Network.MetadataCIDRs, err = getStrings(nw, "metadata_cidrs", "network.metadata_cidrs", false); err != nil {
			return d, err
		}
	}
	return d, nil
}

func getBool(o ast.Object, key, at string) (bool, error) {
	b, ok := field(o, key).(ast.Boolean)
	if !ok {
		return false, &shapeError{at, "a boolean", field(o, key)}
	}
	return bool(b), nil
}

func getString(o ast.Object, key, at string) (string, error) {
	s, ok := field(o, key).(ast.String)
	if !ok {
		return "", &shapeError{at, "a string", field(o, key)}
	}
	return string(s), nil
}

func getEnum(o ast.Object, key, at string, allowed ...string) (string, error) {
	s, err := getString(o, key, at)
	if err != nil {
		return "", err
	}
	for _, a := range allowed {
		if s == a {
			return a, nil
		}
	}
	return "", fmt.Errorf("decision.%s: %q is not one of %q", at, s, allowed)
}

func getInt(o ast.Object, key, at string) (int, error) {
	n, ok := field(o, key).(ast.Number)
	if !ok {
		return 0, &shapeError{at, "a number", field(o, key)}
	}
	i, isInt := n.Int64()
	if !isInt || i < 0 || i > math.MaxInt32 {
		return 0, fmt.Errorf("decision.%s: %s is not a whole number in range", at, n)
	}
	return int(i), nil
}

// getStrings reads an array of strings. With nullable, null yields a nil
// slice and an empty array a non-nil empty one: the difference matters for
// network.egress_cidrs.
func getStrings(o ast.Object, key, at string, nullable bool) ([]string, error) {
	v := field(o, key)
	if _, isNull := v.(ast.Null); nullable && isNull {
		return nil, nil
	}
	arr, ok := v.(*ast.Array)
	if !ok {
		want := "an array of strings"
		if nullable {
			want += " or null"
		}
		return nil, &shapeError{at, want, v}
	}
	out := make([]string, arr.Len())
	for i := range out {
		s, ok := arr.Elem(i).Value.(ast.String)
		if !ok {
			return nil, &shapeError{fmt.Sprintf("%s[%d]", at, i), "a string", arr.Elem(i).Value}
		}
		out[i] = string(s)
	}
	return out, nil
}
