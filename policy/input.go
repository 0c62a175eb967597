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
	o.Insert(key("version"), ast.StringTerm(in.Version))
	o.Insert(key("kind"), ast.StringTerm(in.Kind))
	o.Insert(key("namespace"), ast.StringTerm(in.Namespace))
	o.Insert(key("pod"), ast.NewTerm(in.Pod.astValue()))
	o.Insert(key("request"), ast.NewTerm(in.Request.astValue()))
	o.Insert(key("usage"), ast.ObjectTerm(
		ast.Item(key("sandboxes"), intTerm(int64(in.Usage.Sandboxes))),
		ast.Item(key("gpu_slices"), intTerm(int64(in.Usage.GPUSlices))),
		ast.Item(key("memory_bytes"), intTerm(in.Usage.MemoryBytes)),
	))
	if in.Node != nil {
		o.Insert(key("node"), ast.NewTerm(in.Node.astValue()))
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
	o.Insert(key("runtime_handler"), ast.StringTerm(p.RuntimeHandler))
	insertTrue(o, "host_network", p.HostNetwork)
	insertTrue(o, "host_pid", p.HostPID)
	insertTrue(o, "host_ipc", p.HostIPC)
	if len(p.Containers) > 0 {
		cs := make([]*ast.Term, len(p.Containers))
		for i := range p.Containers {
			cs[i] = ast.NewTerm(p.Containers[i].astValue())
		}
		o.Insert(key("containers"), ast.ArrayTerm(cs...))
	}
	return o
}

func (c *Container) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(6)
	o.Insert(key("name"), ast.StringTerm(c.Name))
	if c.Image != "" {
		o.Insert(key("image"), ast.StringTerm(c.Image))
	}
	insertTrue(o, "privileged", c.Privileged)
	if len(c.Devices) > 0 {
		o.Insert(key("devices"), stringsTerm(c.Devices))
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
			ast.Item(key("profile"), ast.StringTerm(r.GPU.Profile)),
			ast.Item(key("count"), intTerm(int64(r.GPU.Count))),
		))
	}
	insertTrue(o, "rdma", r.RDMA)
	if r.MemoryBytes != 0 {
		o.Insert(key("memory_bytes"), intTerm(r.MemoryBytes))
	}
	return o
}

func (n *Node) astValue() ast.Value {
	o := ast.NewObjectWithCapacity(2)
	if n.Name != "" {
		o.Insert(key("name"), ast.StringTerm(n.Name))
	}
	if len(n.GPUs) > 0 {
		gs := make([]*ast.Term, len(n.GPUs))
		for i := range n.GPUs {
			g := ast.NewObjectWithCapacity(5)
			gpu := &n.GPUs[i]
			g.Insert(key("index"), intTerm(int64(gpu.Index)))
			g.Insert(key("model"), ast.StringTerm(gpu.Model))
			g.Insert(key("mig_enabled"), ast.InternedTerm(gpu.MIGEnabled))
			g.Insert(key("free_slices"), intTerm(int64(gpu.FreeSlices)))
			if len(gpu.Tenants) > 0 {
				g.Insert(key("tenants"), stringsTerm(gpu.Tenants))
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

// inputKeys are the object keys of the input, built once: ast.InternedTerm
// only interns a few common strings and would allocate these per decision.
var inputKeys = func() map[string]*ast.Term {
	m := map[string]*ast.Term{}
	for _, k := range []string{
		"version", "kind", "namespace", "pod", "request", "usage", "node",
		"sandboxes", "gpu_slices", "memory_bytes", "name", "uid", "annotations", "labels",
		"runtime_handler", "host_network", "host_pid", "host_ipc", "containers",
		"image", "privileged", "devices", "env", "gpu", "profile", "count", "rdma",
		"gpus", "index", "model", "mig_enabled", "free_slices", "tenants",
	} {
		m[k] = ast.StringTerm(k)
	}
	return m
}()

func key(name string) *ast.Term {
	if t, ok := inputKeys[name]; ok {
		return t
	}
	return ast.StringTerm(name)
}
