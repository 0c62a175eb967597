package policy

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

const indexedBundle = `package bulkhead

import data.bulkhead.index

decision := {
	"allow": true, "reasons": [], "tenant": object.get(index.owner, input.namespace, ""), "tier": "", "runtime": "gvisor",
	"gpu": {"allowed_profiles": [], "max_slices": 0, "whole_gpu": false, "exclusive_physical_gpu": true, "mig_in_sandbox": "refuse"},
	"network": {"isolation": "tenant", "egress_cidrs": [], "deny_metadata": true},
	"rdma": "deny", "warnings": [],
}
`

// TestIndexIsServedAsData checks that the engine evaluates
// data.bulkhead.index once at load and that decisions read its value.
func TestIndexIsServedAsData(t *testing.T) {
	dir := writeBundleDir(t, map[string]string{
		"decision.rego": indexedBundle,
		"index.rego":    "package bulkhead.index\n\nowner[ns] := name if {\n\tsome name, t in data.bulkhead.tenants\n\tsome ns in t.namespaces\n}\n",
		"data.json":     `{"bulkhead": {"tenants": {"agents": {"namespaces": ["agents", "bots"]}}}}`,
	})
	e, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.Decide(context.Background(), Input{Version: ContractVersion, Kind: KindSandbox, Namespace: "bots"})
	if err != nil || d.Tenant != "agents" {
		t.Fatalf("Decide = %+v, %v; want tenant agents from the index", d, err)
	}

	// The index package is gone from the compiled modules: its value is data.
	b, _, err := readBundle(dir, nil, (&Options{}).bundleLimits())
	if err != nil {
		t.Fatal(err)
	}
	modules := b.ParsedModules("bulkhead")
	compiler := ast.NewCompiler().WithCapabilities(Capabilities())
	if compiler.Compile(modules); compiler.Failed() {
		t.Fatal(compiler.Errors)
	}
	rest, index, err := precomputeIndex(context.Background(), compiler, modules, b.Data)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) != len(modules)-1 {
		t.Errorf("%d modules left of %d; want the index module removed", len(rest), len(modules))
	}
	for name := range rest {
		if strings.HasSuffix(name, "index.rego") {
			t.Errorf("module %s is still evaluated per decision", name)
		}
	}
	if want := ast.MustParseTerm(`{"owner": {"agents": "agents", "bots": "agents"}}`).Value; index.Compare(want) != 0 {
		t.Errorf("index = %v, want %v", index, want)
	}
}

func TestIndexReadingInputRefused(t *testing.T) {
	for name, index := range map[string]string{
		"direct":     "package bulkhead.index\n\nowner[input.namespace] := \"x\"\n",
		"transitive": "package bulkhead.index\n\nimport data.bulkhead.helper\n\nowner[ns] := \"x\" if ns := helper.ns\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := writeBundleDir(t, map[string]string{
				"decision.rego": indexedBundle,
				"index.rego":    index,
				"helper.rego":   "package bulkhead.helper\n\nns := input.namespace\n",
			})
			_, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
			if err == nil || !strings.Contains(err.Error(), "reads input") {
				t.Fatalf("Open = %v, want a refusal naming the rule that reads input", err)
			}
		})
	}
}

func TestIndexSetByDataRefused(t *testing.T) {
	dir := writeBundleDir(t, map[string]string{
		"decision.rego": indexedBundle,
		"index.rego":    "package bulkhead.index\n\nowner := {}\n",
		"data.json":     `{"bulkhead": {"index": {"stale": true}}}`,
	})
	_, err := Open(context.Background(), Options{BundlePath: dir, InsecureSkipVerification: true, Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "data.bulkhead.index is set by data") {
		t.Fatalf("Open = %v, want a refusal of data that shadows the index rules", err)
	}
}

// TestDecisionWorkIndependentOfTenantCount checks that a decision looks its
// tenant up by key: the evaluator does the same work whether the cluster
// has three tenants or a thousand.
func TestDecisionWorkIndependentOfTenantCount(t *testing.T) {
	small, large := openDefault(t), openLargeCluster(t, 1000)
	inputs := benchInputs()
	if s, l := regoSteps(t, small, inputs), regoSteps(t, large, inputs); s != l {
		t.Errorf("%.1f evaluation steps per decision with 3 tenants, %.1f with 1003 tenants; want the same", s, l)
	}
}
