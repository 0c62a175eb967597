package policy

import (
	"maps"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
)

// astValue builds the Rego value of in directly, field by field with the same
// names and omissions as its JSON encoding, which skips the JSON round trip
// that rego.EvalInput would make on every decision.
func (in *Input) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(7)
	o.Insert(ast.InternedTerm("version"), ast.StringTerm(in.Version))
	o.Insert(ast.InternedTerm("kind"), ast.StringTerm(in.Kind))
	o.Insert(ast.InternedTerm("namespace"), ast.StringTerm(in.Namespace))
	o.Insert(ast.InternedTerm("pod"), ast.NewTerm(in.Pod.astValue()))
	o.Insert(ast.InternedTerm("request"), ast.NewTerm(in.Request.astValue()))
	o.Insert(ast.InternedTerm("usage"), ast.ObjectTerm(
		ast.Item(ast.InternedTerm("sandboxes"), intTerm(int64(in.Usage.Sandboxes))),
		ast.Item(ast.InternedTerm("gpu_slices"), intTerm(int64(in.Usage.GPUSlices))),
		ast.Item(ast.InternedTerm("memory_bytes"), intTerm(in.Usage.MemoryBytes)),
	))
	if in.Node != nil {
		o.Insert(ast.InternedTerm("node"), ast.NewTerm(in.Node.astValue()))
	}
	return o
}

func (p *Pod) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(10)
	o.Insert(ast.InternedTerm("name"), ast.StringTerm(p.Name))
	if p.UID != "" {
		o.Insert(ast.InternedTerm("uid"), ast.StringTerm(p.UID))
	}
	if len(p.Annotations) > 0 {
		o.Insert(ast.InternedTerm("annotations"), stringMapTerm(p.Annotations))
	}
	if len(p.Labels) > 0 {
		o.Insert(ast.InternedTerm("labels"), stringMapTerm(p.Labels))
	}
	o.Insert(ast.InternedTerm("runtime_handler"), ast.StringTerm(p.RuntimeHandler))
	insertTrue(o, "host_network", p.HostNetwork)
	insertTrue(o, "host_pid", p.HostPID)
	insertTrue(o, "host_ipc", p.HostIPC)
	if len(p.Containers) > 0 {
		cs := make([]*ast.Term, len(p.Containers))
		for i := range p.Containers {
			cs[i] = ast.NewTerm(p.Containers[i].astValue())
		}
		o.Insert(ast.InternedTerm("containers"), ast.ArrayTerm(cs...))
	}
	return o
}

func (c *Container) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(6)
	o.Insert(ast.InternedTerm("name"), ast.StringTerm(c.Name))
	if c.Image != "" {
		o.Insert(ast.InternedTerm("image"), ast.StringTerm(c.Image))
	}
	insertTrue(o, "privileged", c.Privileged)
	if len(c.Devices) > 0 {
		o.Insert(ast.InternedTerm("devices"), stringsTerm(c.Devices))
	}
	if c.MemoryBytes != 0 {
		o.Insert(ast.InternedTerm("memory_bytes"), intTerm(c.MemoryBytes))
	}
	if len(c.Env) > 0 {
		o.Insert(ast.InternedTerm("env"), stringMapTerm(c.Env))
	}
	return o
}

func (r *Request) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(3)
	if r.GPU != nil {
		o.Insert(ast.InternedTerm("gpu"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("profile"), ast.StringTerm(r.GPU.Profile)),
			ast.Item(ast.InternedTerm("count"), intTerm(int64(r.GPU.Count))),
		))
	}
	insertTrue(o, "rdma", r.RDMA)
	if r.MemoryBytes != 0 {
		o.Insert(ast.InternedTerm("memory_bytes"), intTerm(r.MemoryBytes))
	}
	return o
}

func (n *Node) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(2)
	if n.Name != "" {
		o.Insert(ast.InternedTerm("name"), ast.StringTerm(n.Name))
	}
	if len(n.GPUs) > 0 {
		gs := make([]*ast.Term, len(n.GPUs))
		for i := range n.GPUs {
			g := ast.NewObjectWithCapacity(5)
			gpu := &n.GPUs[i]
			g.Insert(ast.InternedTerm("index"), intTerm(int64(gpu.Index)))
			g.Insert(ast.InternedTerm("model"), ast.StringTerm(gpu.Model))
			g.Insert(ast.InternedTerm("mig_enabled"), ast.InternedTerm(gpu.MIGEnabled))
			g.Insert(ast.InternedTerm("free_slices"), intTerm(int64(gpu.FreeSlices)))
			if len(gpu.Tenants) > 0 {
				g.Insert(ast.InternedTerm("tenants"), stringsTerm(gpu.Tenants))
			}
			gs[i] = ast.NewTerm(g)
		}
		o.Insert(ast.InternedTerm("gpus"), ast.ArrayTerm(gs...))
	}
	return o
}

func insertTrue(o ast.Object, key string, v bool) {
	if v {
		o.Insert(ast.InternedTerm(key), ast.InternedTerm(true))
	}
}

func intTerm(v int64) *ast.Term { return ast.InternedTerm(v) }

func stringsTerm(ss []string) *ast.Term {
	ts := make([]*ast.Term, len(ss))
	for i, s := range ss {
		ts[i] = ast.StringTerm(s)
	}
	return ast.ArrayTerm(ts...)
}

func stringMapTerm(m map[string]string) *ast.Term {
	o := ast.NewObjectWithCapacity(len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		o.Insert(ast.StringTerm(k), ast.StringTerm(m[k]))
	}
	return ast.NewTerm(o)
}
