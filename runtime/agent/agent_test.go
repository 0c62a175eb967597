package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

const testTenants = `{"bulkhead": {"tenants": {
  "agents":   {"tier": "untrusted", "namespaces": ["agents"], "quota": {"sandboxes": 2, "memory": "8Gi"}},
  "research": {"tier": "standard",  "namespaces": ["research"], "quota": {"sandboxes": 10, "memory": "64Gi"}}
}}}`

// dialEnv makes the test binary a client that calls Status on the socket
// it names and exits 0 when the call succeeded (TestSocketRefusesNonRoot).
const dialEnv = "BULKHEAD_AGENT_TEST_DIAL"

func TestMain(m *testing.M) {
	if socket := os.Getenv(dialEnv); socket != "" {
		c := agentapi.NewClient(socket)
		_, err := c.Status(context.Background())
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testAgent serves a real agent (the default bundle, a real ledger, no
// fence and no GPUs: no root needed) on a socket in a fresh directory.
func testAgent(t *testing.T) (*Agent, *agentapi.Client, config.Config) {
	t.Helper()
	return serveAgent(t, testTenants)
}

// serveAgent is testAgent with the tenants of the data file tenantsJSON.
func serveAgent(t testing.TB, tenantsJSON string) (*Agent, *agentapi.Client, config.Config) {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(data, []byte(tenantsJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	bundle, err := filepath.Abs("../../rego")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.RunscRoot = filepath.Join(dir, "runsc")
	cfg.RuncRoot = filepath.Join(dir, "runc")
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.LedgerPath = filepath.Join(dir, "ledger.db")
	cfg.Agent.Socket = filepath.Join(dir, "agent", "agent.sock")
	cfg.Policy = config.PolicyConfig{Bundle: bundle, InsecureSkipVerification: true, Data: data}
	cfg.Netpol.Enabled = false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(cfg.Agent.Socket)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve(ctx, l) }()
	c := agentapi.NewClient(cfg.Agent.Socket)
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		a.Close()
	})
	return a, c, cfg
}

// sandboxBundle writes the OCI bundle of a pod's sandbox as containerd's
// CRI plugin would, and returns its directory.
func sandboxBundle(t *testing.T, ns, name string) string {
	t.Helper()
	spec := &specs.Spec{Annotations: map[string]string{
		cri.AnnotationContainerType: cri.ContainerTypeSandbox, cri.AnnotationSandboxNamespace: ns, cri.AnnotationSandboxName: name,
		cri.AnnotationSandboxMemory: "1073741824",
	}, Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
		{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace},
	}}}
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// reservation is sandbox id's reservation in the agent's ledger, or nil.
func reservation(t *testing.T, a *Agent, id string) *node.Reservation {
	t.Helper()
	l, err := node.OpenLedgerReadOnly(a.cfg.LedgerPath)
	if err != nil {
		t.Fatal(err)
	}
	var res *node.Reservation
	if err := l.View(func(tx *node.LedgerTx) error {
		res, err = tx.Get(id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestCreateAsksTheShimToAct drives the protocol as a shim does: a
// sandbox's create is answered with the act create, the pod is placed and
// recorded before it, a failed act unwinds everything, and the delete
// releases the pod.
func TestCreateAsksTheShimToAct(t *testing.T) {
	ctx := context.Background()
	a, c, _ := testAgent(t)
	caller := agentapi.Caller{Runtime: agentapi.RuntimeGVisor, PID: os.Getpid()}

	for _, tc := range []struct {
		name    string
		actErr  string
		wantErr string
	}{
		{"created", "", ""},
		{"runtime-failed", "runsc create: boom", "runsc create: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "sb-" + tc.name
			reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: id, Bundle: sandboxBundle(t, "research", tc.name)})
			if err != nil {
				t.Fatal(err)
			}
			if reply.Act != agentapi.ActCreate || reply.ID != id || reply.Op == 0 {
				t.Fatalf("first reply = %+v, want the act create of %s", reply, id)
			}
			if res := reservation(t, a, id); res == nil || res.Tenant != "research" || res.ShimPID != os.Getpid() {
				t.Fatalf("reservation before the act = %+v, want research's with the shim's pid", res)
			}
			reply, err = c.Continue(ctx, agentapi.ContinueRequest{Op: reply.Op, Error: tc.actErr})
			if err != nil {
				t.Fatal(err)
			}
			if reply.Act != "" || !strings.Contains(reply.Error, tc.wantErr) || (tc.wantErr == "") != (reply.Error == "") {
				t.Fatalf("final reply = %+v, want error %q", reply, tc.wantErr)
			}
			if tc.wantErr != "" {
				if res := reservation(t, a, id); res != nil {
					t.Errorf("reservation after a failed act: %+v", res)
				}
				return
			}
			if err := c.Deleted(ctx, agentapi.DeletedRequest{Caller: caller, Sandbox: id, ID: id}); err != nil {
				t.Fatal(err)
			}
			if res := reservation(t, a, id); res != nil {
				t.Errorf("reservation after the delete: %+v", res)
			}
		})
	}

	reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: "sb-refused", Bundle: sandboxBundle(t, "nobody", "refused")})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Act != "" || !strings.Contains(reply.Error, "bulkhead refused pod nobody/refused") {
		t.Errorf("a pod of no tenant: reply = %+v, want a refusal naming it and no act", reply)
	}
}

// TestShimKilledMidCallLeavesNothing: a shim that dies while the agent
// waits for its act (here: after being told to create its sandbox) is
// noticed by its pid, and the placement unwinds.
func TestShimKilledMidCallLeavesNothing(t *testing.T) {
	ctx := context.Background()
	a, c, _ := testAgent(t)
	shim := exec.Command("sleep", "60")
	if err := shim.Start(); err != nil {
		t.Skipf("no sleep to stand in for a shim's process: %v", err)
	}
	caller := agentapi.Caller{Runtime: agentapi.RuntimeGVisor, PID: shim.Process.Pid}
	reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: "sb-killed", Bundle: sandboxBundle(t, "research", "killed")})
	if err != nil || reply.Act != agentapi.ActCreate {
		t.Fatalf("Create = %+v, %v; want the act create", reply, err)
	}
	if reservation(t, a, "sb-killed") == nil {
		t.Fatal("no reservation while the act is pending")
	}
	shim.Process.Kill()
	shim.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for reservation(t, a, "sb-killed") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the reservation of a pod whose shim died mid-create is still held after 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	ids, err := node.NewStateDir(a.cfg).List()
	if err != nil || len(ids) != 0 {
		t.Errorf("records after the shim died = %v, %v; want none", ids, err)
	}
	reply, err = c.Continue(ctx, agentapi.ContinueRequest{Op: reply.Op})
	if err != nil || reply.Error == "" {
		t.Errorf("Continue of the abandoned op = %+v, %v; want an error answer", reply, err)
	}
}

// TestSocketRefusesNonRoot: the socket is root's and 0600, and even when
// its mode lets another user connect, the agent refuses a peer whose
// credentials are not root's.
func TestSocketRefusesNonRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another user")
	}
	_, _, cfg := testAgent(t)
	st, err := os.Stat(cfg.Agent.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if perm := st.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode = %o, want 600", perm)
	}
	// A copy of this test binary that user nobody may run.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "agent-dial-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "dial")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	dial := func(uid uint32) error {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), dialEnv+"="+cfg.Agent.Socket)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return errors.New(string(out))
		}
		return nil
	}
	if err := dial(0); err != nil {
		t.Fatalf("root's call: %v", err)
	}
	// Directory and socket opened to everyone: the credentials still refuse.
	for _, p := range []string{filepath.Dir(cfg.Agent.Socket), filepath.Dir(filepath.Dir(cfg.Agent.Socket)), cfg.Agent.Socket} {
		os.Chmod(p, 0o777)
	}
	if err := dial(65534); err == nil {
		t.Error("a call from uid 65534 was answered, want it refused")
	} else if !strings.Contains(err.Error(), "agent unavailable") {
		t.Errorf("uid 65534: %v, want the call refused", err)
	}
}

// TestConfigRuntimesArePolicys keeps agentapi's runtime names the policy's.
func TestConfigRuntimesArePolicys(t *testing.T) {
	if agentapi.RuntimeGVisor != policy.RuntimeGVisor || agentapi.RuntimeRunc != policy.RuntimeRunc {
		t.Errorf("agentapi runtimes %q, %q; policy's %q, %q", agentapi.RuntimeGVisor, agentapi.RuntimeRunc, policy.RuntimeGVisor, policy.RuntimeRunc)
	}
}

// TestRefusalIsCountedAndReported: a refused sandbox is counted by rule in
// the agent's metrics, its create's outcome is timed, and a Warning Event
// names the rule on the pod.
func TestRefusalIsCountedAndReported(t *testing.T) {
	ctx := context.Background()
	a, c, _ := testAgent(t)
	client := fake.NewClientset()
	a.events = telemetry.NewEventsForClient(client, "node-a")
	caller := agentapi.Caller{Runtime: agentapi.RuntimeRunc, PID: os.Getpid()}
	// An untrusted tenant's pod on the runc shim: runtime.runc_forbidden
	// or the handler rule, whichever the bundle puts first.
	reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: "sb-runc", Bundle: sandboxBundle(t, "agents", "on-runc")})
	if err != nil {
		t.Fatal(err)
	}
	if reply.Act != "" || !strings.Contains(reply.Error, "bulkhead refused pod agents/on-runc") {
		t.Fatalf("reply = %+v, want a refusal", reply)
	}
	families, err := a.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch f.GetName() {
			case "bulkhead_node_decisions_total":
				counted["decision/"+labels["result"]] += m.GetCounter().GetValue()
			case "bulkhead_node_start_seconds":
				counted["start/"+labels["runtime"]+"/"+labels["result"]] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	if counted["decision/deny"] < 1 || counted["start/runc/refused"] != 1 {
		t.Errorf("metrics = %v, want a deny decision and one refused runc start", counted)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := client.CoreV1().Events("agents").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			ev := list.Items[0]
			if ev.Reason != telemetry.ReasonRefused || ev.InvolvedObject.Name != "on-runc" || !strings.Contains(ev.Message, "bulkhead refused pod agents/on-runc") {
				t.Errorf("event = %s %s/%s %q", ev.Reason, ev.InvolvedObject.Namespace, ev.InvolvedObject.Name, ev.Message)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Event on the refused pod after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
