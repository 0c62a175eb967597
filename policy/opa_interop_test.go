package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/open-policy-agent/opa/v1/ast"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/policy/policytest"
)

// opaBinary finds the real opa v1.22.4 that `make tools` installs.
func opaBinary(t *testing.T) string {
	t.Helper()
	candidates := []string{}
	if p, err := exec.LookPath("opa"); err == nil {
		candidates = append(candidates, p)
	}
	if dir := os.Getenv("TOOLS_DIR"); dir != "" {
		candidates = append(candidates, filepath.Join(dir, "bin", "opa"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".cache", "bulkhead", "tools", "bin", "opa"))
	}
	for _, c := range candidates {
		out, err := exec.Command(c, "version").Output()
		if err != nil {
			continue
		}
		if strings.Contains(string(out), "Version: 1.22.4\n") {
			return c
		}
		t.Logf("%s is not opa 1.22.4: %s", c, strings.SplitN(string(out), "\n", 2)[0])
	}
	t.Skip("opa v1.22.4 not found on PATH or in $TOOLS_DIR/bin: run `make tools`")
	return ""
}

func runOPA(t *testing.T, opa string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(opa, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("opa %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// demoBundleDir is the default bundle (policytest) with the demo tenants
// and signedPlatform in its data.json, so that `opa eval` sees them.
func demoBundleDir(t *testing.T) string {
	t.Helper()
	var demo map[string]map[string]map[string]any
	raw, err := os.ReadFile(repoPath(t, "rego/examples/tenants.demo.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &demo); err != nil {
		t.Fatal(err)
	}
	var platform map[string]any
	if err := json.Unmarshal([]byte(signedPlatform), &platform); err != nil {
		t.Fatal(err)
	}
	maps.Copy(demo["bulkhead"]["tenants"], platform)
	all, _ := json.Marshal(demo)
	return policytest.BundleWithTenants(t, string(all))
}

// TestOPABuiltSignedBundle builds and signs the default bundle with the real
// `opa build --signing-key ... --signing-alg RS256`, loads it, and checks
// that every decision equals what `opa eval` computes from the same bundle.
func TestOPABuiltSignedBundle(t *testing.T) {
	opa := opaBinary(t)
	work := t.TempDir()
	ops := newKeyPair(t, work, "ops")
	claims := filepath.Join(work, "claims.json")
	if err := os.WriteFile(claims, []byte(`{"scope": "cluster-a"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	src := demoBundleDir(t)
	tarball := filepath.Join(work, "bundle.tar.gz")
	runOPA(t, opa, "build", "--bundle", src, "--signing-key", ops.privPath, "--signing-alg", "RS256",
		"--claims-file", claims, "--output", tarball)

	e, err := Open(context.Background(), Options{
		BundlePath: tarball, Keys: map[string]string{"ops": ops.pubPath}, KeyID: "ops", Scope: "cluster-a", Logger: quietLogger(),
	})
	if err != nil {
		t.Fatalf("Open(opa-built bundle): %v", err)
	}
	if e.Revision() != "bulkhead-default-1" {
		t.Errorf("revision = %q", e.Revision())
	}
	// The decisions compared with opa eval below come from the compiled plan.
	if snap := e.active.Load(); snap.program == nil {
		t.Fatalf("the opa-built bundle must run as a plan: %s", snap.planNote)
	}

	inputs := map[string]func(*Input){
		"allowed agent":    func(*Input) {},
		"agent runc":       func(in *Input) { in.Pod.RuntimeHandler = "runc" },
		"agent over quota": func(in *Input) { in.Usage.Sandboxes = 25; in.Pod.Containers[0].Image = "busybox" },
		"research whole": func(in *Input) {
			in.Namespace, in.Request.GPU, in.Request.RDMA = "research", &GPURequest{Profile: "whole", Count: 1}, true
		},
		"platform runc":     func(in *Input) { in.Namespace, in.Pod.RuntimeHandler = "platform", "runc" },
		"unknown namespace": func(in *Input) { in.Namespace = "default" },
		"admission":         func(in *Input) { in.Kind, in.Node = KindAdmission, nil },
	}
	for name, edit := range inputs {
		t.Run(name, func(t *testing.T) {
			in := agentPod()
			edit(&in)
			got, err := e.Decide(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			inPath := filepath.Join(t.TempDir(), "input.json")
			raw, _ := json.Marshal(in)
			if err := os.WriteFile(inPath, raw, 0o644); err != nil {
				t.Fatal(err)
			}
			out := runOPA(t, opa, "eval", "--format", "json", "--bundle", tarball, "--input", inPath, DecisionQuery)
			var res struct {
				Result []struct {
					Expressions []struct {
						Value json.RawMessage `json:"value"`
					} `json:"expressions"`
				} `json:"result"`
			}
			if err := json.Unmarshal(out, &res); err != nil || len(res.Result) != 1 {
				t.Fatalf("opa eval output %s: %v", out, err)
			}
			dec := json.NewDecoder(bytes.NewReader(res.Result[0].Expressions[0].Value))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				t.Fatal(err)
			}
			av, err := ast.InterfaceToValue(v)
			if err != nil {
				t.Fatal(err)
			}
			want, err := decodeDecision(av)
			if err != nil {
				t.Fatalf("opa's decision breaks the contract: %v", err)
			}
			got.ID, got.Revision = "", ""
			if len(got.Warnings) == 0 && len(want.Warnings) == 0 {
				got.Warnings, want.Warnings = nil, nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("engine and opa eval disagree\nengine: %+v\nopa:    %+v", got, want)
			}
		})
	}

	t.Run("directory signed by opa sign", func(t *testing.T) {
		cmd := exec.Command(opa, "sign", "--signing-key", ops.privPath, "--signing-alg", "RS256", "--claims-file", claims, "--bundle", ".")
		cmd.Dir = src // .signatures.json is written to the working directory
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("opa sign: %v\n%s", err, out)
		}
		defer os.Remove(filepath.Join(src, ".signatures.json"))
		d, err := Open(context.Background(), Options{BundlePath: src, Keys: map[string]string{"ops": ops.pubPEM}, KeyID: "ops", Scope: "cluster-a", Logger: quietLogger()})
		if err != nil {
			t.Fatalf("Open(opa-signed directory): %v", err)
		}
		if d.Revision() != "bulkhead-default-1" {
			t.Errorf("revision %q", d.Revision())
		}
	})

	t.Run("tampered after opa build", func(t *testing.T) {
		tampered := filepath.Join(t.TempDir(), "tampered.tar.gz")
		raw, _ := os.ReadFile(tarball)
		if err := os.WriteFile(tampered, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		rewriteTar(t, tampered, func(name string, c []byte) []byte {
			if strings.HasSuffix(name, "runtime.rego") {
				return bytes.Replace(c, []byte("selected := runtime_of_handler if permitted"), []byte("selected := runtime_of_handler"), 1)
			}
			return c
		})
		_, err := Open(context.Background(), Options{BundlePath: tampered, Keys: map[string]string{"ops": ops.pubPath}, KeyID: "ops", Scope: "cluster-a", Logger: quietLogger()})
		if err == nil || !strings.Contains(err.Error(), "digest mismatch") {
			t.Fatalf("Open(tampered) = %v, want a digest mismatch", err)
		}
	})

	t.Run("unsigned opa build", func(t *testing.T) {
		unsigned := filepath.Join(t.TempDir(), "unsigned.tar.gz")
		runOPA(t, opa, "build", "--bundle", src, "--output", unsigned)
		_, err := Open(context.Background(), Options{BundlePath: unsigned, Keys: map[string]string{"ops": ops.pubPath}, KeyID: "ops", Scope: "cluster-a", Logger: quietLogger()})
		if err == nil || !strings.Contains(err.Error(), "missing .signatures.json") {
			t.Fatalf("Open(unsigned) = %v", err)
		}
	})

	t.Run("signed for another scope", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "other.tar.gz")
		runOPA(t, opa, "build", "--bundle", src, "--signing-key", ops.privPath, "--signing-alg", "RS256", "--output", other)
		_, err := Open(context.Background(), Options{BundlePath: other, Keys: map[string]string{"ops": ops.pubPath}, KeyID: "ops", Scope: "cluster-a", Logger: quietLogger()})
		if err == nil || !strings.Contains(err.Error(), "scope mismatch") {
			t.Fatalf("Open(no scope) = %v", err)
		}
	})
}
