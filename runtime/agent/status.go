package agent

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// nodeStatus is the node's state as the agent sees it. The ledger, GPU and
// fence parts are read as `bulkhead node status` reads a stopped node's
// (node.ReadStatus: read-only opens of the same ledger, backend and
// pinned maps the agent holds), so both views report the same thing; the
// agent adds its own state.
func (a *Agent) nodeStatus() (*node.Status, error) {
	st, err := node.ReadStatus(a.cfg)
	if err != nil {
		return nil, err
	}
	as := &node.AgentStatus{Running: true, Socket: a.cfg.Agent.Socket, PID: os.Getpid(), StartedAt: a.startedAt}
	var reloadErr error
	as.BundleRevision, as.BundleLoadedAt, reloadErr = a.Bundle()
	if reloadErr != nil {
		as.ReloadError = reloadErr.Error()
	}
	a.mu.Lock()
	as.Pods, as.OpsInFlight = len(a.pods), len(a.ops)
	a.mu.Unlock()
	as.Cluster = a.ClusterSync()
	st.Agent = as
	return st, nil
}

// statusReply is the agent's answer to agentapi.MethodStatus: the report
// `bulkhead node status --json` prints.
func (a *Agent) statusReply() (agentapi.StatusReply, error) {
	st, err := a.nodeStatus()
	if err != nil {
		return agentapi.StatusReply{}, fmt.Errorf("status: %w", err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return agentapi.StatusReply{}, fmt.Errorf("status: %w", err)
	}
	return agentapi.StatusReply{Report: b}, nil
}
