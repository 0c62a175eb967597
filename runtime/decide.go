package runtime

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput"
)

// decide is the decide step: the sandbox's policy input, read from the
// spec containerd wrote (specinput.Sandbox), into a.Input. An annotation
// that cannot be read refuses the pod (input.annotations). The policy
// itself is asked in the reserve step, inside the ledger transaction that
// reads the tenant's usage.
func (p *Pipeline) decide(sb *node.Sandbox, spec *specs.Spec, a *Admission) error {
	in, err := specinput.Sandbox(podOf(sb), spec, dirsOf(p.node.Config()))
	if err != nil {
		return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Reasons: []policy.Reason{{Rule: "input.annotations", Message: err.Error()}}}
	}
	a.Input = in
	return p.fail(StepDecide)
}

// podOf is the pod of sandbox sb as specinput reads it.
func podOf(sb *node.Sandbox) specinput.Pod {
	return specinput.Pod{SandboxID: sb.ID, Namespace: sb.Namespace, Name: sb.Name, UID: sb.UID,
		Handler: sb.Handler, Annotations: sb.Annotations, NetNS: sb.NetNS}
}

// dirsOf are the node's directories of cfg, where a pod's own files live.
func dirsOf(cfg config.Config) specinput.Dirs {
	return specinput.Dirs{KubeletRoot: cfg.KubeletRoot, ContainerdRoot: cfg.ContainerdRoot, ContainerdState: cfg.ContainerdState}
}
