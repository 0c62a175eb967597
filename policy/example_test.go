package policy_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/bulkhead-runtime/bulkhead/policy"
)

// A node opens the signed bundle once and asks for a decision per pod.
// (This example skips verification to run from the source tree; a node
// sets Keys, KeyID and Scope instead.)
func ExampleOpen() {
	ctx := context.Background()
	e, err := policy.Open(ctx, policy.Options{
		BundlePath:               "../rego",
		DataPath:                 "../rego/examples/tenants.demo.json",
		InsecureSkipVerification: true,
		Logger:                   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 1})),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	d, err := e.Decide(ctx, policy.Input{
		Version:   policy.ContractVersion,
		Kind:      policy.KindAdmission,
		Namespace: "agents",
		Pod:       policy.Pod{Name: "agent", RuntimeHandler: "runc"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Allow, d.Tenant, d.Tier)
	for _, r := range d.Reasons {
		fmt.Println(r.Enforcement, r.Rule)
	}
	// Output:
	// false agents untrusted
	// deny runtime.runc_forbidden
	// warn quota.memory_limit_missing
}
