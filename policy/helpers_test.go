package policy

import (
	"context"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/util"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
)

// repoPath returns a path relative to the repository root; go test runs
// in the package directory.
func repoPath(t testing.TB, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// signedPlatform is the trusted tenant of these tests. The default trusted
// tier does not set unsigned_tenants, so the data file cannot name it: a
// trusted tenant is signed into the bundle, as deploy/policy/build.sh does.
const signedPlatform = `{"platform": {"tier": "trusted", "namespaces": ["platform", "kube-system"]}}`

// demoBundle is the default bundle (its .manifest included) with
// signedPlatform in its data.
func demoBundle(t testing.TB) string {
	t.Helper()
	return bundleWithTenants(t, signedPlatform, nil)
}

// openDefault opens the default bundle unsigned with signedPlatform, and
// the demo tenants as the data file.
func openDefault(t testing.TB) *Engine {
	t.Helper()
	return openDefaultWith(t, "")
}

// openDefaultWith is openDefault deciding with evaluator.
func openDefaultWith(t testing.TB, evaluator string) *Engine {
	t.Helper()
	e, err := Open(context.Background(), Options{
		BundlePath:               demoBundle(t),
		DataPath:                 repoPath(t, "rego/examples/tenants.demo.json"),
		InsecureSkipVerification: true,
		Logger:                   quietLogger(),
		Evaluator:                evaluator,
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return e
}

// gpuNode is an H200 node with one MIG GPU shared by nobody and one idle.
func gpuNode() *Node {
	return &Node{Name: "node-a", GPUs: []NodeGPU{
		{Index: 0, Model: "NVIDIA H200", MIGEnabled: true, FreeSlices: 7},
		{Index: 1, Model: "NVIDIA H200", MIGEnabled: false, FreeSlices: 7},
	}}
}

func agentPod() Input {
	return Input{
		Version:   ContractVersion,
		Kind:      KindSandbox,
		Namespace: "agents",
		Pod: Pod{
			Name: "agent-1", UID: "u-1", RuntimeHandler: "bulkhead",
			Containers: []Container{{Name: "main", Image: "registry.local/agent@sha256:0123", MemoryBytes: 1 << 30}},
		},
		// No GPU: an untrusted pod in gVisor cannot use a MIG slice
		// (gpu.mig_in_gvisor), and the tier may not take a whole GPU.
		Request: Request{MemoryBytes: 1 << 30},
		Usage:   Usage{Sandboxes: 2, GPUSlices: 1, MemoryBytes: 4 << 30},
		Node:    gpuNode(),
	}
}

func astValueFromJSON(b []byte) (ast.Value, error) {
	var v any
	if err := util.UnmarshalJSON(b, &v); err != nil {
		return nil, err
	}
	return ast.InterfaceToValue(v)
}
