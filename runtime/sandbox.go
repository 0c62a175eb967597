package runtime

import (
	"context"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// startSandbox is the sandbox step: the sandbox's spec as the decision
// shapes it (the GPU injected by the gpu step, RDMA devices the tenant was
// not granted removed) is written back to its bundle when it changed, then
// the task service creates the sandbox. read is the spec as Place read it.
func (p *Pipeline) startSandbox(ctx context.Context, sb *node.Sandbox, a *Admission, spec *specs.Spec, read []byte, task SandboxTask) error {
	if err := rdma.SpecOpt(p.RDMAGrant(a, sb))(spec); err != nil {
		return err
	}
	if err := writeSpecIfChanged(sb.Bundle, read, spec); err != nil {
		return err
	}
	if err := p.fail(StepSandbox); err != nil {
		return err
	}
	return task.Create(ctx)
}
