package policy

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// astValue builds the Rego value of in directly, field by field with the same
// names and omissions as its JSON encoding, which skips the JSON round trip
// that rego.EvalInput would make on every decision.
func (in *Input) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(7)
	o.Insert(key("version"), common(in.Version))
	o.Insert(key("kind"), common(in.Kind))
	o.Insert(key("namespace"), common(in.Namespace))
	o.Insert(key("pod"), ast.NewTerm(in.Pod.astValue()))
	o.Insert(key("request"), ast.NewTerm(in.Request.astValue()))
	o.Insert(key("usage"), ast.ObjectTerm(
		ast.Item(key("sandboxes"), intTerm(int64(in.Usage.Sandboxes))),
		ast.Item(key("gpu_slices"), intTerm(int64(in.Usage.GPUSlices))),
		ast.Item(key("memory_bytes"), intTerm(in.Usage.MemoryBytes)),
	))
	if in.Node != nil {
		o.Insert(key("node"), nodeTerm(in.Node))
	}
	return o
}

func (p *Pod) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(10)
	o.Insert(key("name"), ast.StringTerm(p.Name))
	if p.UID != "" {
		o.Insert(key("uid"), ast.StringTerm(p.UID))
	}
	if len(p.Annotations) > 0 {
		o.Insert(key("annotations"), stringMapTerm(p.Annotations))
	}
	if len(p.Labels) > 0 {
		o.Insert(key("labels"), stringMapTerm(p.Labels))
	}
	o.Insert(key("runtime_handler"), common(p.RuntimeHandler))
	insertTrue(o, "host_network", p.HostNetwork)
	insertTrue(o, "host_pid", p.HostPID)
	insertTrue(o, "host_ipc", p.HostIPC)
	if len(p.Volumes) > 0 {
		vs := make([]*ast.Term, len(p.Volumes))
		for i, v := range p.Volumes {
			vo := ast.NewObjectWithCapacity(4)
			vo.Insert(key("name"), common(v.Name))
			vo.Insert(key("type"), common(v.Type))
			if v.HostPath != "" {
				vo.Insert(key("host_path"), common(v.HostPath))
			}
			insertTrue(vo, "may_be_claim", v.MayBeClaim)
			vs[i] = ast.NewTerm(vo)
		}
		o.Insert(key("volumes"), ast.ArrayTerm(vs...))
	}
	if len(p.Sysctls) > 0 {
		o.Insert(key("sysctls"), stringMapTerm(p.Sysctls))
	}
	if len(p.Containers) > 0 {
		o.Insert(key("containers"), containersTerm(p.Containers))
	}
	if len(p.ResourceClaims) > 0 {
		cs := make([]*ast.Term, len(p.ResourceClaims))
		for i := range p.ResourceClaims {
			cs[i] = ast.NewTerm(p.ResourceClaims[i].astValue())
		}
		o.Insert(key("resource_claims"), ast.ArrayTerm(cs...))
	}
	return o
}

func (c *ResourceClaim) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(5)
	o.Insert(key("name"), common(c.Name))
	if c.ClaimName != "" {
		o.Insert(key("claim_name"), common(c.ClaimName))
	}
	if c.TemplateName != "" {
		o.Insert(key("template_name"), common(c.TemplateName))
	}
	insertTrue(o, "read", c.Read)
	if len(c.Requests) > 0 {
		rs := make([]*ast.Term, len(c.Requests))
		for i, r := range c.Requests {
			ro := ast.NewObjectWithCapacity(4)
			ro.Insert(key("name"), common(r.Name))
			ro.Insert(key("device_class"), common(r.DeviceClass))
			if r.AllocationMode != "" {
				ro.Insert(key("allocation_mode"), common(r.AllocationMode))
			}
			if r.Count != 0 {
				ro.Insert(key("count"), intTerm(r.Count))
			}
			if len(r.Selectors) > 0 {
				sel := make([]*ast.Term, len(r.Selectors))
				for j, e := range r.Selectors {
					sel[j] = ast.StringTerm(e)
				}
				ro.Insert(key("selectors"), ast.ArrayTerm(sel...))
			}
			rs[i] = ast.NewTerm(ro)
		}
		o.Insert(key("requests"), ast.ArrayTerm(rs...))
	}
	return o
}

// lastContainers is the most recent containers list and its term: the
// replicas of a Deployment, Job or StatefulSet, arriving one after the
// other, have equal containers, so their term is reused while it is equal.
var lastContainers atomic.Pointer[containersMemo]

type containersMemo struct {
	containers []Container
	term       *ast.Term
}

func containersTerm(cs []Container) *ast.Term {
	if m := lastContainers.Load(); m != nil && slices.EqualFunc(m.containers, cs, Container.equal) {
		return m.term
	}
	ts := make([]*ast.Term, len(cs))
	for i := range cs {
		ts[i] = ast.NewTerm(cs[i].astValue())
	}
	m := &containersMemo{containers: make([]Container, len(cs)), term: ast.ArrayTerm(ts...)}
	for i := range cs {
		m.containers[i] = cs[i].clone()
	}
	lastContainers.Store(m)
	return m.term
}

func (c Container) equal(o Container) bool {
	return c.Name == o.Name && c.Image == o.Image && c.Privileged == o.Privileged && c.Ephemeral == o.Ephemeral &&
		c.MemoryBytes == o.MemoryBytes && slices.Equal(c.Devices, o.Devices) && maps.Equal(c.Env, o.Env) &&
		slices.Equal(c.Mounts, o.Mounts) && slices.Equal(c.AddedCapabilities, o.AddedCapabilities) &&
		slices.Equal(c.HostPorts, o.HostPorts) && c.SeccompProfile == o.SeccompProfile && c.AppArmorProfile == o.AppArmorProfile
}

func (c Container) clone() Container {
	c.Devices, c.Env = slices.Clone(c.Devices), maps.Clone(c.Env)
	c.Mounts, c.AddedCapabilities, c.HostPorts = slices.Clone(c.Mounts), slices.Clone(c.AddedCapabilities), slices.Clone(c.HostPorts)
	return c
}

func (c *Container) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(6)
	o.Insert(key("name"), common(c.Name))
	if c.Image != "" {
		o.Insert(key("image"), common(c.Image))
	}
	insertTrue(o, "privileged", c.Privileged)
	insertTrue(o, "ephemeral", c.Ephemeral)
	if len(c.Devices) > 0 {
		o.Insert(key("devices"), commonStrings(c.Devices))
	}
	if len(c.Mounts) > 0 {
		ms := make([]*ast.Term, len(c.Mounts))
		for i, m := range c.Mounts {
			mo := ast.NewObjectWithCapacity(3)
			mo.Insert(key("host_path"), common(m.HostPath))
			if m.Path != "" {
				mo.Insert(key("path"), common(m.Path))
			}
			insertTrue(mo, "read_only", m.ReadOnly)
			ms[i] = ast.NewTerm(mo)
		}
		o.Insert(key("mounts"), ast.ArrayTerm(ms...))
	}
	if len(c.AddedCapabilities) > 0 {
		o.Insert(key("added_capabilities"), commonStrings(c.AddedCapabilities))
	}
	if len(c.HostPorts) > 0 {
		ps := make([]*ast.Term, len(c.HostPorts))
		for i, p := range c.HostPorts {
			ps[i] = intTerm(int64(p))
		}
		o.Insert(key("host_ports"), ast.ArrayTerm(ps...))
	}
	if c.SeccompProfile != "" {
		o.Insert(key("seccomp_profile"), common(c.SeccompProfile))
	}
	if c.AppArmorProfile != "" {
		o.Insert(key("apparmor_profile"), common(c.AppArmorProfile))
	}
	if c.MemoryBytes != 0 {
		o.Insert(key("memory_bytes"), intTerm(c.MemoryBytes))
	}
	if len(c.Env) > 0 {
		o.Insert(key("env"), stringMapTerm(c.Env))
	}
	return o
}

func (r *Request) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(3)
	if r.GPU != nil {
		o.Insert(key("gpu"), ast.ObjectTerm(
			ast.Item(key("profile"), common(r.GPU.Profile)),
			ast.Item(key("count"), intTerm(int64(r.GPU.Count))),
		))
	}
	insertTrue(o, "rdma", r.RDMA)
	if r.MemoryBytes != 0 {
		o.Insert(key("memory_bytes"), intTerm(r.MemoryBytes))
	}
	return o
}

// lastNode is the most recent node description and its term: on a node,
// decision after decision describes the same GPUs until a placement
// changes them, so the term (and everything the plan keeps keyed by it) is
// reused while the description is equal.
var lastNode atomic.Pointer[nodeMemo]

type nodeMemo struct {
	node Node
	term *ast.Term
}

func nodeTerm(n *Node) *ast.Term {
	if m := lastNode.Load(); m != nil && m.node.equal(n) {
		return m.term
	}
	m := &nodeMemo{node: n.clone(), term: ast.NewTerm(n.astValue())}
	lastNode.Store(m)
	return m.term
}

func (n *Node) equal(o *Node) bool {
	return n.Name == o.Name && slices.EqualFunc(n.GPUs, o.GPUs, func(a, b NodeGPU) bool {
		return a.Index == b.Index && a.Model == b.Model && a.MIGEnabled == b.MIGEnabled &&
			a.FreeSlices == b.FreeSlices && slices.Equal(a.Tenants, b.Tenants)
	})
}

func (n *Node) clone() Node {
	c := Node{Name: n.Name, GPUs: slices.Clone(n.GPUs)}
	for i := range c.GPUs {
		c.GPUs[i].Tenants = slices.Clone(c.GPUs[i].Tenants)
	}
	return c
}

func (n *Node) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(2)
	if n.Name != "" {
		o.Insert(key("name"), common(n.Name))
	}
	if len(n.GPUs) > 0 {
		gs := make([]*ast.Term, len(n.GPUs))
		for i := range n.GPUs {
			g := ast.NewObjectWithCapacity(5)
			gpu := &n.GPUs[i]
			g.Insert(key("index"), intTerm(int64(gpu.Index)))
			g.Insert(key("model"), common(gpu.Model))
			g.Insert(key("mig_enabled"), ast.InternedTerm(gpu.MIGEnabled))
			g.Insert(key("free_slices"), intTerm(int64(gpu.FreeSlices)))
			if len(gpu.Tenants) > 0 {
				g.Insert(key("tenants"), commonStrings(gpu.Tenants))
			}
			gs[i] = ast.NewTerm(g)
		}
		o.Insert(key("gpus"), ast.ArrayTerm(gs...))
	}
	return o
}

func insertTrue(o ast.Object, name string, v bool) {
	if v {
		o.Insert(key(name), ast.InternedTerm(true))
	}
}

func intTerm(v int64) *ast.Term { return ast.InternedTerm(v) }

func stringMapTerm(m map[string]string) *ast.Term {
	o := ast.NewObjectWithCapacity(len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		o.Insert(ast.StringTerm(k), ast.StringTerm(m[k]))
	}
	return ast.NewTerm(o)
}

// keyTerms are the object keys of the input and of the decision, built
// once: ast.InternedTerm only interns a few common strings and would
// allocate these on every decision.
var keyTerms = func() map[string]*ast.Term {
	m := map[string]*ast.Term{}
	for _, k := range []string{
		"version", "kind", "namespace", "pod", "request", "usage", "node",
		"sandboxes", "gpu_slices", "memory_bytes", "name", "uid", "annotations", "labels",
		"runtime_handler", "host_network", "host_pid", "host_ipc", "containers",
		"image", "privileged", "devices", "env", "gpu", "profile", "count", "rdma",
		"volumes", "type", "host_path", "may_be_claim", "path", "read_only", "sysctls", "ephemeral", "mounts",
		"added_capabilities", "host_ports", "seccomp_profile", "apparmor_profile",
		"gpus", "index", "model", "mig_enabled", "free_slices", "tenants",
		"resource_claims", "claim_name", "template_name", "read", "requests", "device_class", "allocation_mode", "selectors",
		// and those of the decision, read back by decodeDecision
		"allow", "reasons", "tier", "runtime", "warnings", "rule", "message", "enforcement",
		"allowed_profiles", "max_slices", "whole_gpu", "exclusive_physical_gpu", "mig_in_sandbox",
		"network", "isolation", "egress_cidrs", "deny_metadata", "metadata_cidrs",
	} {
		m[k] = ast.StringTerm(k)
	}
	return m
}()

func key(name string) *ast.Term {
	if t, ok := keyTerms[name]; ok {
		return t
	}
	return ast.StringTerm(name)
}

// common is the string term of a value that recurs from one decision to
// the next (a namespace, a handler, an image, a GPU model), made once and
// shared: terms are never modified. Values unique to a pod (its name, uid,
// annotations) and anything secret (environment values) are not passed
// here. The table stops growing at maxCommon entries.
func common(s string) *ast.Term {
	if t, ok := commonTerms.Load(s); ok {
		return t.(*ast.Term)
	}
	t := ast.StringTerm(s)
	if len(s) <= 256 && commonCount.Load() < maxCommon {
		if _, loaded := commonTerms.LoadOrStore(s, t); !loaded {
			commonCount.Add(1)
		}
	}
	return t
}

const maxCommon = 16384

var (
	commonTerms sync.Map // string -> *ast.Term
	commonCount atomic.Int64
)

func commonStrings(ss []string) *ast.Term {
	ts := make([]*ast.Term, len(ss))
	for i, s := range ss {
		ts[i] = common(s)
	}
	return ast.ArrayTerm(ts...)
}
