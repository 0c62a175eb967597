package runtime

import (
	"context"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput"
)

// AdmitContainer asks the policy whether container id may be created in
// sandbox sb as spec describes it. A refusal names the rules, like a
// sandbox refusal, and changes nothing.
//
// A fenced runc pod's network namespace is looked at again: an interface
// added after the sandbox's create (Multus' dynamic networks, a host agent)
// would carry the new container's traffic past the fence. A gVisor sandbox
// took its interfaces once, when it started, so one added later carries
// nothing of it.
func (p *Pipeline) AdmitContainer(ctx context.Context, sb *node.Sandbox, a *Admission, id string, spec *specs.Spec) error {
	in := specinput.Container(podOf(sb), id, spec, dirsOf(p.node.Config()), p.RDMAGrant(a, sb).Devices)
	d, err := p.decider.Decide(ctx, in)
	if err != nil || !d.Allow {
		return refusal(sb, d, err)
	}
	if sb.Runtime == policy.RuntimeRunc && a != nil && a.Reservation != nil && a.Reservation.Endpoint != nil && sb.NetNS != "" {
		return checkInterfaces(sb, a.Reservation)
	}
	return nil
}

// RDMAGrant is the RDMA device fence for the pod's containers: nothing
// unless the policy grants RDMA on the tenant's own VF and the pod asked.
func (p *Pipeline) RDMAGrant(a *Admission, sb *node.Sandbox) rdma.Grant {
	if a == nil || a.Decision.RDMA != policy.RDMAOwnVF || sb.Annotations[policy.AnnotationRDMA] != "true" {
		return rdma.Grant{}
	}
	return rdma.Grant{Allowed: true, Devices: p.node.Config().RDMA.TenantVFs[a.Decision.Tenant]}
}
