package policy

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
)

// schemaErrors validates doc against the JSON Schema in docs/schema/name
// with OPA's own json.match_schema and returns the violations.
func schemaErrors(t *testing.T, name string, doc any) []any {
	t.Helper()
	raw, err := os.ReadFile(repoPath(t, "docs/schema/"+name))
	if err != nil {
		t.Fatal(err)
	}
	var schema any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var plain any
	if err := json.Unmarshal(b, &plain); err != nil {
		t.Fatal(err)
	}
	rs, err := rego.New(
		rego.Query("r := json.match_schema(input.doc, input.schema)"),
		rego.Input(map[string]any{"doc": plain, "schema": schema}),
	).Eval(context.Background())
	if err != nil {
		t.Fatalf("match_schema %s: %v", name, err)
	}
	r := rs[0].Bindings["r"].([]any)
	if r[0].(bool) {
		return nil
	}
	return r[1].([]any)
}

func TestSchemasDescribeTheContract(t *testing.T) {
	e := openDefault(t)
	for i, in := range benchInputs() {
		if errs := schemaErrors(t, "input.schema.json", in); errs != nil {
			t.Errorf("input %d breaks input.schema.json: %v", i, errs)
		}
		d, err := e.Decide(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if errs := schemaErrors(t, "decision.schema.json", d); errs != nil {
			t.Errorf("decision %d breaks decision.schema.json: %v", i, errs)
		}
	}
	var data, demo map[string]map[string]any
	for path, into := range map[string]*map[string]map[string]any{"rego/data.json": &data, "rego/examples/tenants.demo.json": &demo} {
		raw, err := os.ReadFile(repoPath(t, path))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, into); err != nil {
			t.Fatal(err)
		}
	}
	for name, doc := range map[string]any{"data.json": data["bulkhead"], "tenants.demo.json": demo["bulkhead"]} {
		if errs := schemaErrors(t, "data.schema.json", doc); errs != nil {
			t.Errorf("%s breaks data.schema.json: %v", name, errs)
		}
	}
	// The schemas are not vacuous.
	bad := agentPod()
	bad.Kind = "exec"
	if schemaErrors(t, "input.schema.json", bad) == nil {
		t.Error(`input.schema.json accepts kind "exec"`)
	}
	if schemaErrors(t, "decision.schema.json", map[string]any{"allow": "yes"}) == nil {
		t.Error("decision.schema.json accepts a malformed decision")
	}
}
