package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// askStatus calls Status on the agent's socket and decodes the report
// strictly: a field the report's type lacks is an error.
func askStatus(t *testing.T, c *agentapi.Client) node.Status {
	t.Helper()
	reply, err := c.Status(context.Background())
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	var st node.Status
	dec := json.NewDecoder(bytes.NewReader(reply.Report))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("Status report %s: %v", reply.Report, err)
	}
	if st.Agent == nil {
		t.Fatalf("Status report has no agent section: %s", reply.Report)
	}
	return st
}

// TestStatusOverSocket: the agent reports itself (running, its socket and
// pid, the bundle's revision) and follows a pod through its create's act,
// the create and the delete: ops in flight, pods served, the ledger.
func TestStatusOverSocket(t *testing.T) {
	ctx := context.Background()
	_, c, cfg := testAgent(t)
	caller := agentapi.Caller{Runtime: agentapi.RuntimeGVisor, PID: os.Getpid()}

	st := askStatus(t, c)
	ag := st.Agent
	if !ag.Running || ag.ReadOnly != "" || ag.Socket != cfg.Agent.Socket || ag.PID != os.Getpid() {
		t.Errorf("agent = %+v, want running at %s as pid %d, not read-only", ag, cfg.Agent.Socket, os.Getpid())
	}
	if ag.BundleRevision != "bulkhead-default-1" || ag.ReloadError != "" {
		t.Errorf("bundle revision %q, reload error %q; want bulkhead-default-1 and none", ag.BundleRevision, ag.ReloadError)
	}
	if ag.StartedAt.IsZero() || ag.StartedAt.After(time.Now()) || ag.BundleLoadedAt.Before(ag.StartedAt) {
		t.Errorf("started at %v, bundle loaded at %v: want the start in the past and the load after it", ag.StartedAt, ag.BundleLoadedAt)
	}
	if st.Fence != node.FenceDisabled || st.LedgerPath != cfg.LedgerPath || st.Ledger != "" {
		t.Errorf("fence %q, ledger %q (%q): want the fence disabled and the agent's ledger", st.Fence, st.LedgerPath, st.Ledger)
	}
	if q := st.Quota["research"]; q.Sandboxes != 10 || q.Memory != "64Gi" {
		t.Errorf("research's quota = %+v, want the policy data's 10 sandboxes and 64Gi", q)
	}

	var op uint64
	for _, step := range []struct {
		name string
		do   func(t *testing.T)
		// what status reports after the step
		pods, ops, sandboxes int
	}{
		{"act pending", func(t *testing.T) {
			reply, err := c.Create(ctx, agentapi.CreateRequest{Caller: caller, ID: "sb-status", Bundle: sandboxBundle(t, "research", "status")})
			if err != nil || reply.Act != agentapi.ActCreate {
				t.Fatalf("Create = %+v, %v; want the act create", reply, err)
			}
			op = reply.Op
		}, 0, 1, 1},
		{"created", func(t *testing.T) {
			reply, err := c.Continue(ctx, agentapi.ContinueRequest{Op: op})
			if err != nil || reply.Act != "" || reply.Error != "" {
				t.Fatalf("Continue = %+v, %v; want success", reply, err)
			}
		}, 1, 0, 1},
		{"deleted", func(t *testing.T) {
			if err := c.Deleted(ctx, agentapi.DeletedRequest{Caller: caller, Sandbox: "sb-status", ID: "sb-status"}); err != nil {
				t.Fatal(err)
			}
		}, 0, 0, 0},
	} {
		t.Run(step.name, func(t *testing.T) {
			step.do(t)
			st := askStatus(t, c)
			if st.Agent.Pods != step.pods || st.Agent.OpsInFlight != step.ops || len(st.Sandboxes) != step.sandboxes {
				t.Fatalf("pods %d, ops in flight %d, sandboxes %d; want %d, %d, %d", st.Agent.Pods, st.Agent.OpsInFlight, len(st.Sandboxes), step.pods, step.ops, step.sandboxes)
			}
			if step.sandboxes > 0 {
				if len(st.Tenants) != 1 || st.Tenants[0].Tenant != "research" || st.Tenants[0].MemoryBytes != 1<<30 {
					t.Errorf("tenants = %+v, want research holding one 1 GiB sandbox", st.Tenants)
				}
			}
		})
	}
}

// TestStatusReportsRefusedReload: a policy data file the engine cannot load
// is refused, the old revision stays, and status says why until a good one
// is loaded.
func TestStatusReportsRefusedReload(t *testing.T) {
	_, c, cfg := testAgent(t)
	first := askStatus(t, c).Agent
	waitFor := func(what string, ok func(*node.AgentStatus) bool) *node.AgentStatus {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			ag := askStatus(t, c).Agent
			if ok(ag) {
				return ag
			}
			if time.Now().After(deadline) {
				t.Fatalf("after 10s, %s: agent = %+v", what, ag)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	good, err := os.ReadFile(cfg.Policy.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Policy.Data, []byte(`{"bulkhead": {"tenants": `), 0o644); err != nil {
		t.Fatal(err)
	}
	ag := waitFor("a reload refused", func(ag *node.AgentStatus) bool { return ag.ReloadError != "" })
	if ag.BundleRevision != "bulkhead-default-1" || !strings.Contains(ag.ReloadError, "bulkhead-default-1 stays active") || !ag.BundleLoadedAt.Equal(first.BundleLoadedAt) {
		t.Errorf("after a refused reload: %+v; want revision bulkhead-default-1 still loaded at %v and the refusal saying it stays", ag, first.BundleLoadedAt)
	}
	if err := os.WriteFile(cfg.Policy.Data, good, 0o644); err != nil {
		t.Fatal(err)
	}
	ag = waitFor("a reload of the good data", func(ag *node.AgentStatus) bool { return ag.ReloadError == "" })
	if !ag.BundleLoadedAt.After(first.BundleLoadedAt) {
		t.Errorf("bundle loaded at %v after the good reload, want after %v", ag.BundleLoadedAt, first.BundleLoadedAt)
	}
}
