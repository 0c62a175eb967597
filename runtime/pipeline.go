package runtime

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
	"github.com/bulkhead-runtime/bulkhead/netpol/rdma"
	"github.com/bulkhead-runtime/bulkhead/policy"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/internal/starttrace"
	"github.com/bulkhead-runtime/bulkhead/runtime/node"
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput"
)

// Pipeline steps, in order (FailAtEnv takes one of these).
const (
	StepDecide  = "decide"
	StepReserve = "reserve"
	StepGPU     = "gpu"
	StepSandbox = "sandbox"
	StepFence   = "fence"
	StepActive  = "activate"
)

// Steps lists the pipeline's steps in order.
var Steps = []string{StepDecide, StepReserve, StepGPU, StepSandbox, StepFence, StepActive}

// RuleRuntimeMismatch refuses a pod whose decision names another runtime
// than the shim it reached runs (a handler registered with the wrong shim).
const RuleRuntimeMismatch = "runtime.handler_mismatch"

// RefusedError is a policy refusal. Its message reaches the kubelet (and
// crictl) through containerd, so it names the tenant, each rule and why.
type RefusedError struct {
	Namespace, Pod, Tenant string
	Reasons                []policy.Reason
}

func (e *RefusedError) Error() string {
	tenant := e.Tenant
	if tenant == "" {
		tenant = "(none)"
	}
	var parts []string
	for _, r := range e.Reasons {
		if r.Enforcement == "" || r.Enforcement == policy.EnforceDeny {
			parts = append(parts, "["+r.Rule+"] "+r.Message)
		}
	}
	if len(parts) == 0 {
		parts = append(parts, "policy denied without a reason")
	}
	return fmt.Sprintf("bulkhead refused pod %s/%s (tenant %s): %s", e.Namespace, e.Pod, tenant, strings.Join(parts, "; "))
}

// Pipeline places one pod: policy → quota → GPU → sandbox and fence. The
// node agent holds one for the node: the node (package runtime/node) holds
// what outlives each pod, the pipeline only adds the policy it asks.
type Pipeline struct {
	node *node.Node
	// runtime runs the sandboxes that do not name theirs (Sandbox.Runtime):
	// policy.RuntimeGVisor or policy.RuntimeRunc. A decision for another
	// runtime than the sandbox's is refused.
	runtime string
	decider policy.Decider
	failAt  string
}

// NewPipeline assembles a pipeline that places pods on n as d decides.
func NewPipeline(n *node.Node, d policy.Decider) *Pipeline {
	return &Pipeline{node: n, runtime: policy.RuntimeGVisor, decider: d, failAt: failAtFromEnv()}
}

// OpenPipeline opens the node and the policy engine named by the
// configuration, for pods that run in runtime (policy.RuntimeGVisor or
// policy.RuntimeRunc) unless their record names another.
func OpenPipeline(ctx context.Context, cfg config.Config, runtime string) (*Pipeline, error) {
	if runtime != policy.RuntimeGVisor && runtime != policy.RuntimeRunc {
		return nil, fmt.Errorf("pipeline: runtime %q is not %s or %s", runtime, policy.RuntimeGVisor, policy.RuntimeRunc)
	}
	n, eng, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	p := NewPipeline(n, eng)
	p.runtime = runtime
	return p, nil
}

// Node is what the pipeline places pods on.
func (p *Pipeline) Node() *node.Node { return p.node }

// Decider is the policy the pipeline asks.
func (p *Pipeline) Decider() policy.Decider { return p.decider }

// Close closes the policy engine and the node's handles; the fence's
// pinned maps and programs stay, and keep enforcing for running pods.
func (p *Pipeline) Close() error {
	var errs []error
	if c, ok := p.decider.(interface{ Close() error }); ok {
		errs = append(errs, c.Close())
	}
	errs = append(errs, p.node.Close())
	return errors.Join(errs...)
}

// PolicyCacheDir is the directory under the state directory where the
// compiled plan of the verified policy bundle is kept (policy.Options
// PlanCacheDir); removing it only costs the next open a compile.
const PolicyCacheDir = "policy-cache"

// Open opens the node cfg names (node.Open: the ledger, the MIG backend,
// the fence) and its policy engine. The engine opens while the node does:
// it is the slowest, and the node does not need it.
func Open(ctx context.Context, cfg config.Config) (*node.Node, *policy.Engine, error) {
	opts := policy.Options{
		BundlePath:               cfg.Policy.Bundle,
		KeyID:                    cfg.Policy.KeyID,
		Scope:                    cfg.Policy.Scope,
		InsecureSkipVerification: cfg.Policy.InsecureSkipVerification,
		DataPath:                 cfg.Policy.Data,
		DecisionLogFile:          cfg.Policy.DecisionLog,
		Evaluator:                cfg.Policy.Evaluator,
		MaxBundleBytes:           cfg.Policy.MaxBundleBytes,
		MaxBundleFiles:           cfg.Policy.MaxBundleFiles,
		// A later open of the same bundle loads its verified plan instead
		// of compiling it.
		PlanCacheDir:     filepath.Join(cfg.StateDir, PolicyCacheDir),
		PlanCacheKeyFile: cfg.PlanCacheKeyPath(),
	}
	if cfg.Policy.KeyFile != "" {
		opts.Keys = map[string]string{cfg.Policy.KeyID: cfg.Policy.KeyFile}
	}
	type opened struct {
		engine *policy.Engine
		err    error
		took   time.Duration
	}
	policyOpened := make(chan opened, 1)
	go func() {
		t := time.Now()
		eng, err := policy.Open(ctx, opts)
		policyOpened <- opened{eng, err, time.Since(t)}
	}()
	n, err := node.Open(ctx, cfg)
	t := time.Now()
	o := <-policyOpened
	starttrace.Took(ctx, "open.policy", o.took)
	starttrace.Since(ctx, "open.policy-wait", t)
	switch {
	case err != nil && o.err == nil:
		o.engine.Close()
	case err == nil && o.err != nil:
		n.Close()
		err = o.err // the engine names the bundle and the rule
	}
	if err != nil {
		return nil, nil, err
	}
	return n, o.engine, nil
}

// Stage is how long one stage of a sandbox's create took.
type Stage = starttrace.Stage

// podOf is the pod of sandbox sb as specinput reads it.
func podOf(sb *node.Sandbox) specinput.Pod {
	return specinput.Pod{SandboxID: sb.ID, Namespace: sb.Namespace, Name: sb.Name, UID: sb.UID,
		Handler: sb.Handler, Annotations: sb.Annotations, NetNS: sb.NetNS}
}

// dirsOf are the node's directories of cfg, where a pod's own files live.
func dirsOf(cfg config.Config) specinput.Dirs {
	return specinput.Dirs{KubeletRoot: cfg.KubeletRoot, ContainerdRoot: cfg.ContainerdRoot, ContainerdState: cfg.ContainerdState}
}

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
	if p.runtimeOf(sb) == policy.RuntimeRunc && a != nil && a.Reservation != nil && a.Reservation.Endpoint != nil && sb.NetNS != "" {
		return checkInterfaces(sb, a.Reservation)
	}
	return nil
}

// nodeInput describes the node's GPUs for the policy, from the backend's
// view of them (gpus: MIG mode as the hardware reports it) and the
// allocator's placements.
func nodeInput(alloc *mig.Allocator, gpus []mig.GPU) *policy.Node {
	n := &policy.Node{}
	if alloc == nil {
		return n
	}
	tenants := map[int][]string{}
	for _, pl := range alloc.Placements() {
		if !slices.Contains(tenants[pl.GPU], pl.Tenant) {
			tenants[pl.GPU] = append(tenants[pl.GPU], pl.Tenant)
		}
	}
	migEnabled := map[int]bool{}
	for _, g := range gpus {
		migEnabled[g.Index] = !g.NoMIG
	}
	for _, u := range alloc.Usage() {
		n.GPUs = append(n.GPUs, policy.NodeGPU{Index: u.Index, Model: u.Model, MIGEnabled: migEnabled[u.Index], FreeSlices: mig.ComputeSlices - u.Compute, Tenants: tenants[u.Index]})
	}
	return n
}

// reserve decides with the tenant's usage and reserves: policy, quota and
// GPU placement happen in one ledger transaction, so concurrent pods of a
// tenant cannot overrun its quota or double-book a slice.
func (p *Pipeline) reserve(ctx context.Context, sb *node.Sandbox, in policy.Input, a *Admission) error {
	return p.node.Ledger().Update(func(tx *node.LedgerTx) error {
		if old, err := tx.Get(sb.ID); err != nil {
			return err
		} else if old != nil {
			return fmt.Errorf("sandbox %s: already reserved (%s)", sb.ID, old.State)
		}
		alloc, err := p.allocator(tx)
		if err != nil {
			return err
		}
		in.Node = nodeInput(alloc, p.node.GPUs())
		// Identity first: the tenant comes from the namespace, whatever the
		// usage; then the tenant's usage decides the quotas.
		d, err := p.decider.Decide(ctx, in)
		if err != nil || !d.Allow {
			return refusal(sb, d, err)
		}
		if in.Usage, err = tx.Usage(d.Tenant); err != nil {
			return err
		}
		if d, err = p.decider.Decide(ctx, in); err != nil || !d.Allow {
			return refusal(sb, d, err)
		}
		// The policy picks the runtime from the handler; this shim runs
		// one runtime and starts nothing in another.
		if d.Runtime != p.runtimeOf(sb) {
			return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: []policy.Reason{{
				Rule:    RuleRuntimeMismatch,
				Message: fmt.Sprintf("handler %q runs %s here, but the policy chose runtime %q for it (data.bulkhead.handlers)", sb.Handler, p.runtimeOf(sb), d.Runtime),
			}}}
		}
		res := &node.Reservation{
			SandboxID: sb.ID, State: node.StateReserved, Tenant: d.Tenant, Tier: d.Tier,
			Namespace: sb.Namespace, Pod: sb.Name, MemoryBytes: in.Request.MemoryBytes,
			ShimPID: sb.ShimPID, CreatedAt: sb.CreatedAt,
		}
		if in.Request.GPU != nil {
			pl, err := p.placeGPU(sb, d, in.Request.GPU, alloc)
			if err != nil {
				return err
			}
			res.GPU = &pl
		}
		if err := p.fail(StepReserve); err != nil {
			return err
		}
		if err := tx.Put(res); err != nil {
			return err
		}
		a.Decision, a.Reservation = d, res
		return nil
	})
}

// runtimeOf is the runtime sandbox sb runs in.
func (p *Pipeline) runtimeOf(sb *node.Sandbox) string {
	if sb.Runtime != "" {
		return sb.Runtime
	}
	return p.runtime
}

// allocator rebuilds the node's GPU allocator from the ledger; nil without GPUs.
func (p *Pipeline) allocator(tx *node.LedgerTx) (*mig.Allocator, error) {
	if len(p.node.GPUs()) == 0 {
		return nil, nil
	}
	placements, err := tx.Placements()
	if err != nil {
		return nil, err
	}
	alloc, err := mig.NewAllocator(p.node.GPUs(), placements, p.allocatorOptions()...)
	if err != nil {
		return nil, fmt.Errorf("ledger and GPU geometry disagree: %w", err)
	}
	return alloc, nil
}

func refusal(sb *node.Sandbox, d policy.Decision, err error) error {
	reasons := d.Reasons
	if err != nil && len(reasons) == 0 {
		reasons = []policy.Reason{{Rule: "engine.error", Message: err.Error()}}
	}
	return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: reasons}
}

// placeGPU picks a slice (or a whole GPU) as the decision allows.
func (p *Pipeline) placeGPU(sb *node.Sandbox, d policy.Decision, req *policy.GPURequest, alloc *mig.Allocator) (mig.Placement, error) {
	refuse := func(rule, msg string) error {
		return &RefusedError{Namespace: sb.Namespace, Pod: sb.Name, Tenant: d.Tenant, Reasons: []policy.Reason{{Rule: rule, Message: msg}}}
	}
	if alloc == nil {
		return mig.Placement{}, refuse("gpu.none_on_node", "the pod asks for a GPU and this node has none")
	}
	if req.Count != 1 {
		return mig.Placement{}, refuse("gpu.count", fmt.Sprintf("%s %d: one GPU or slice per pod is supported", policy.AnnotationGPUCount, req.Count))
	}
	isolation := mig.IsolationShared
	if d.GPU.ExclusivePhysicalGPU {
		isolation = mig.IsolationTenant
	}
	mreq := mig.Request{Owner: sb.ID, Tenant: d.Tenant, Isolation: isolation}
	if req.Profile == policy.ProfileWhole {
		if !d.GPU.WholeGPU {
			return mig.Placement{}, refuse("gpu.whole_gpu_denied", fmt.Sprintf("tier %s may not have a whole GPU", d.Tier))
		}
		mreq.WholeGPU = true
	} else {
		// gVisor's nvproxy cannot expose MIG capability devices: apply the
		// policy's answer instead of starting a sandbox that cannot use its GPU.
		mode, err := mig.SandboxGPUMode(p.runtimeOf(sb), d.GPU.MIGInSandbox)
		if err != nil {
			return mig.Placement{}, refuse("gpu.mig_in_gvisor", err.Error())
		}
		if mode == mig.GPUModeWhole {
			mreq.WholeGPU = true
		} else {
			mreq.Profile = req.Profile
		}
	}
	pl, err := alloc.Allocate(mreq)
	if err != nil {
		if errors.Is(err, mig.ErrInsufficientResources) {
			return mig.Placement{}, refuse("gpu.insufficient_resources", err.Error())
		}
		return mig.Placement{}, err
	}
	return pl, nil
}

// RDMAGrant is the RDMA device fence for the pod's containers: nothing
// unless the policy grants RDMA on the tenant's own VF and the pod asked.
func (p *Pipeline) RDMAGrant(a *Admission, sb *node.Sandbox) rdma.Grant {
	if a == nil || a.Decision.RDMA != policy.RDMAOwnVF || sb.Annotations[policy.AnnotationRDMA] != "true" {
		return rdma.Grant{}
	}
	return rdma.Grant{Allowed: true, Devices: p.node.Config().RDMA.TenantVFs[a.Decision.Tenant]}
}

// fencePod registers the running sandbox's host veth in the fence, as the
// decision configures it. The entry is recorded in the ledger before it is
// made, so a crash in between leaves a reservation that GC can release.
func (p *Pipeline) fencePod(ctx context.Context, sb *node.Sandbox, a *Admission) error {
	if err := p.fail(StepFence); err != nil {
		return err
	}
	res, d := a.Reservation, a.Decision
	switch {
	case p.node.Fence() == nil:
		log.G(ctx).Warnf("sandbox %s: NOT FENCED: netpol.enabled = false on this node, so nothing stops its traffic to other tenants, the metadata service or outside its egress allow-list", sb.ID)
		return nil
	case sb.NetNS == "":
		log.G(ctx).Warnf("sandbox %s: host network, allowed by tier %q: the fence does not apply to it", sb.ID, res.Tier)
		return nil
	case d.Network.Isolation == "none":
		return nil
	}
	t := time.Now()
	ifindex, ifname, err := netpol.HostVeth(sb.NetNS, "")
	if err != nil {
		return fmt.Errorf("sandbox %s: find host veth: %w", sb.ID, err)
	}
	ep := netpol.Endpoint{SandboxID: sb.ID, Ifindex: ifindex, Tenant: res.Tenant, Tier: res.Tier}
	v4, v6, err := podAddrs(sb.NetNS)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if err := checkInterfaces(sb, res); err != nil {
		return err
	}
	t = starttrace.Since(ctx, "fence.netns", t)
	ep.IPv4, ep.IPv6 = v4, v6
	ep.AllowRDMA = d.RDMA == policy.RDMAOwnVF
	ep.DenyMetadata = d.Network.DenyMetadata
	if ep.DenyMetadata {
		for _, c := range d.Network.MetadataCIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				return fmt.Errorf("decision.network.metadata_cidrs: %q: %w", c, err)
			}
			ep.MetadataCIDRs = append(ep.MetadataCIDRs, pfx)
		}
	}
	if d.Network.EgressCIDRs != nil {
		ep.EgressCIDRs = []netip.Prefix{}
		for _, c := range d.Network.EgressCIDRs {
			pfx, err := netip.ParsePrefix(c)
			if err != nil {
				return fmt.Errorf("decision.network.egress_cidrs: %q: %w", c, err)
			}
			ep.EgressCIDRs = append(ep.EgressCIDRs, pfx)
		}
	}
	res.Endpoint = &node.FenceRecord{Ifindex: ifindex, Ifname: ifname}
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			res.Endpoint.IPs = append(res.Endpoint.IPs, a.String())
		}
	}
	if err := p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(res) }); err != nil {
		return err
	}
	t = starttrace.Since(ctx, "fence.ledger", t)
	if err := p.node.Fence().Register(ctx, ep); err != nil {
		return fmt.Errorf("sandbox %s: fence: %w", sb.ID, err)
	}
	starttrace.Since(ctx, "fence.register", t)
	return nil
}

// activate marks the reservation active: the pod is placed.
func (p *Pipeline) activate(a *Admission) error {
	if err := p.fail(StepActive); err != nil {
		return err
	}
	a.Reservation.State = node.StateActive
	return p.node.Ledger().Update(func(tx *node.LedgerTx) error { return tx.Put(a.Reservation) })
}

// podAddrs reads the pod's addresses on its eth0 through a netlink socket
// opened in its network namespace.
func podAddrs(netnsPath string) (v4, v6 netip.Addr, err error) {
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	defer h.Close()
	link, err := h.LinkByName(netpol.DefaultPodInterface)
	if err != nil {
		return v4, v6, fmt.Errorf("netns %s: %s: %w", netnsPath, netpol.DefaultPodInterface, err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return v4, v6, err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4() && !v4.IsValid():
			v4 = ip
		case ip.Is6() && !ip.IsLinkLocalUnicast() && !v6.IsValid():
			v6 = ip
		}
	}
	if !v4.IsValid() && !v6.IsValid() {
		return v4, v6, fmt.Errorf("netns %s: %s has no address", netnsPath, netpol.DefaultPodInterface)
	}
	return v4, v6, nil
}
