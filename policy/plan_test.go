package policy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/bulkhead-runtime/bulkhead/policy/irvm"
)

// randomInput draws an input from the corners the default bundle's rules
// look at: every tenant and tier, unknown and ambiguous namespaces, each
// runtime handler, host namespaces, privileged and device-hungry
// containers, pinned and unpinned images, identity annotations, GPU
// profiles valid and not, counts valid and not, quotas met and exceeded,
// nodes with and without capacity.
func randomInput(r *rand.Rand) Input {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	in := Input{
		Version:   pick(ContractVersion, ContractVersion, ContractVersion, "v0"),
		Kind:      pick(KindSandbox, KindSandbox, KindAdmission, KindAdmission, KindContainer, "", "bogus"),
		Namespace: pick("agents", "research", "platform", "kube-system", "default", ""),
		Pod: Pod{
			Name:           pick("p", "agent-7", ""),
			UID:            pick("", "u-1"),
			RuntimeHandler: pick("", "bulkhead", "runc", "runsc", "kata"),
			HostNetwork:    r.IntN(6) == 0,
			HostPID:        r.IntN(8) == 0,
			HostIPC:        r.IntN(8) == 0,
		},
		Usage: Usage{Sandboxes: r.IntN(60), GPUSlices: r.IntN(30), MemoryBytes: int64(r.IntN(600)) << 30},
	}
	if r.IntN(3) == 0 {
		in.Pod.Annotations = map[string]string{}
		for range 1 + r.IntN(2) {
			in.Pod.Annotations[pick("bulkhead.dev/tenant", "bulkhead.dev/tier", "bulkhead.dev/gpu", "team")] =
				pick("agents", "research", "platform", "untrusted", "trusted", "standard")
		}
	}
	for i := range r.IntN(4) {
		c := Container{
			Name:        fmt.Sprintf("c%d", i),
			Image:       pick("registry.local/agent@sha256:0123", "registry.local/agent:1", "busybox", ""),
			Privileged:  r.IntN(6) == 0,
			MemoryBytes: int64(r.IntN(8)) << 30,
		}
		for range r.IntN(3) {
			c.Devices = append(c.Devices, pick("/dev/fuse", "/dev/infiniband/uverbs0", "/dev/nvidia0", "/dev/kvm"))
		}
		if r.IntN(3) == 0 {
			c.Env = map[string]string{"TOKEN": "secret", "MODE": pick("a", "b")}
		}
		for range r.IntN(3) {
			c.Mounts = append(c.Mounts, Mount{
				HostPath: pick("/", "/var/lib/kubelet/pods", "/etc/bulkhead", "/dev/infiniband", "/data/models", "/var/log", "/dev"),
				Path:     pick("/host", "/data", ""),
				ReadOnly: r.IntN(2) == 0,
			})
		}
		for range r.IntN(3) {
			c.AddedCapabilities = append(c.AddedCapabilities, pick("SYS_ADMIN", "NET_ADMIN", "NET_RAW", "CHOWN", "NET_BIND_SERVICE", "ALL"))
		}
		if r.IntN(5) == 0 {
			c.HostPorts = []int32{int32(80 + r.IntN(3))}
		}
		c.Ephemeral = r.IntN(6) == 0
		c.SeccompProfile = pick("", "", "RuntimeDefault", "Unconfined")
		c.AppArmorProfile = pick("", "", "RuntimeDefault", "Unconfined")
		in.Pod.Containers = append(in.Pod.Containers, c)
	}
	for i := range r.IntN(3) {
		v := Volume{Name: fmt.Sprintf("v%d", i), Type: pick("hostPath", "emptyDir", "secret")}
		if v.Type == "hostPath" {
			v.HostPath = pick("/", "/var/lib/bulkhead", "/dev/kvm", "/data/models")
		}
		in.Pod.Volumes = append(in.Pod.Volumes, v)
	}
	for i := range r.IntN(3) {
		c := ResourceClaim{Name: fmt.Sprintf("claim%d", i), Read: r.IntN(3) > 0}
		if r.IntN(2) == 0 {
			c.TemplateName = pick("gpu-template", "all-gpus", "nic")
		} else {
			c.ClaimName = pick("shared-gpu", "nic", "")
		}
		if c.Read {
			for j := range r.IntN(3) {
				c.Requests = append(c.Requests, DeviceRequest{
					Name:           fmt.Sprintf("r%d", j),
					DeviceClass:    pick("gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com", "nic.example.com", ""),
					AllocationMode: pick("ExactCount", "All", ""),
					Count:          int64(r.IntN(3)),
				})
			}
		}
		in.Pod.ResourceClaims = append(in.Pod.ResourceClaims, c)
	}
	if r.IntN(4) == 0 {
		in.Pod.Sysctls = map[string]string{pick("net.ipv4.ip_unprivileged_port_start", "kernel.msgmax", "net.core.somaxconn"): "1"}
	}
	if r.IntN(3) > 0 {
		in.Request.GPU = &GPURequest{
			Profile: pick("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "whole", "1g.18gb+me", "bogus", ""),
			Count:   []int{-1, 0, 1, 1, 1, 2, 3, 8}[r.IntN(8)],
		}
	}
	in.Request.RDMA = r.IntN(3) == 0
	in.Request.MemoryBytes = int64(r.IntN(100)) << 30
	if r.IntN(4) > 0 {
		in.Node = &Node{Name: pick("node-a", "")}
		for i := range r.IntN(4) {
			g := NodeGPU{Index: i, Model: "NVIDIA H200", MIGEnabled: r.IntN(3) > 0, FreeSlices: r.IntN(8)}
			for range r.IntN(3) {
				g.Tenants = append(g.Tenants, pick("agents", "research", "platform"))
			}
			in.Node.GPUs = append(in.Node.GPUs, g)
		}
	}
	return in
}

// mangle replaces one value somewhere in v with a value of another type:
// the inputs a hand-written `policy eval --input` file or a buggy caller
// produces, where built-ins fail and rules go undefined.
func mangle(r *rand.Rand, v ast.Value) ast.Value {
	odd := []*ast.Term{ast.StringTerm("x"), ast.IntNumberTerm(-3), ast.FloatNumberTerm(1.5), ast.BooleanTerm(true),
		ast.NullTerm(), ast.ArrayTerm(), ast.ObjectTerm(), ast.SetTerm(ast.StringTerm("a"))}
	var paths []ast.Ref
	var walk func(prefix ast.Ref, x ast.Value)
	walk = func(prefix ast.Ref, x ast.Value) {
		paths = append(paths, prefix)
		switch c := x.(type) {
		case ast.Object:
			c.Foreach(func(k, v *ast.Term) { walk(append(prefix.Copy(), k), v.Value) })
		case *ast.Array:
			for i := range c.Len() {
				walk(append(prefix.Copy(), ast.InternedTerm(i)), c.Elem(i).Value)
			}
		}
	}
	walk(ast.Ref{}, v)
	path := paths[1+r.IntN(len(paths)-1)]
	return replaceAt(v, path, odd[r.IntN(len(odd))])
}

func replaceAt(v ast.Value, path ast.Ref, with *ast.Term) ast.Value {
	if len(path) == 0 {
		return with.Value
	}
	switch c := v.(type) {
	case ast.Object:
		out := c.Copy()
		out.Insert(path[0], ast.NewTerm(replaceAt(c.Get(path[0]).Value, path[1:], with)))
		return out
	case *ast.Array:
		i, _ := path[0].Value.(ast.Number).Int()
		out := c.Copy()
		out.Set(i, ast.NewTerm(replaceAt(c.Elem(i).Value, path[1:], with)))
		return out
	}
	return v
}

// TestPlanDecidesAsInterpreter holds the compiled plan to OPA's
// interpreter: for thousands of drawn inputs, well-formed and mangled, on
// the default bundle with the demo tenants, both give the same value (or
// both fail).
func TestPlanDecidesAsInterpreter(t *testing.T) {
	e := openDefault(t)
	snap := e.active.Load()
	if snap.program == nil {
		t.Fatalf("the default bundle must run as a plan; fallback reason: %s", snap.planNote)
	}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 11))
	var allowed, denied, failed, deferred int
	inputs := make([]ast.Value, 0, 4000)
	for _, in := range benchInputs() {
		inputs = append(inputs, in.astValue())
	}
	for range 3000 {
		in := randomInput(r)
		inputs = append(inputs, in.astValue())
	}
	for i := range 1000 {
		inputs = append(inputs, mangle(r, inputs[i%len(inputs)]))
	}
	for i, input := range inputs {
		want, werr := snap.evalTopdown(ctx, input)
		got, gerr := snap.evalPlan(ctx, input)
		if errors.Is(gerr, irvm.ErrDeferred) {
			deferred++ // the engine asks the interpreter: want is the decision
			got, gerr = snap.evalValue(ctx, input)
		}
		if (werr != nil) != (gerr != nil) || !sameValue(got, want) {
			t.Fatalf("input %d differs:\ninput:       %v\ninterpreter: %v (error %v)\nplan:        %v (error %v)", i, input, want, werr, got, gerr)
		}
		switch {
		case werr != nil:
			failed++
		case want != nil && strings.Contains(want.(ast.Object).Get(ast.StringTerm("allow")).String(), "true"):
			allowed++
		default:
			denied++
		}
	}
	stats := snap.program.CacheStats()
	t.Logf("%d inputs: %d allowed, %d denied, %d evaluation errors, identical in both evaluators (%d deferred by the plan to the interpreter); rule caches %+v", len(inputs), allowed, denied, failed, deferred, stats)
	if stats.Hits == 0 {
		t.Fatal("the rule caches served nothing: this test must exercise them")
	}
	if allowed < 100 || denied < 100 {
		t.Fatalf("the drawn inputs must reach both answers often: %d allowed, %d denied", allowed, denied)
	}
}

// TestEvaluatorOption: topdown is kept on request, and both engines decide
// alike through Decide.
func TestEvaluatorOption(t *testing.T) {
	plan, topdown := openDefaultWith(t, ""), openDefaultWith(t, EvaluatorTopdown)
	if plan.active.Load().program == nil || topdown.active.Load().program != nil {
		t.Fatal("default must evaluate the plan, topdown must not")
	}
	for _, in := range benchInputs() {
		a, errA := plan.Decide(context.Background(), in)
		b, errB := topdown.Decide(context.Background(), in)
		a.ID, b.ID = "", ""
		if fmt.Sprint(a) != fmt.Sprint(b) || (errA == nil) != (errB == nil) {
			t.Fatalf("decisions differ:\nplan    %+v %v\ntopdown %+v %v", a, errA, b, errB)
		}
	}
	_, err := Open(context.Background(), Options{BundlePath: repoPath(t, "rego"), InsecureSkipVerification: true, Evaluator: "wasm"})
	if err == nil || !strings.Contains(err.Error(), "Options.Evaluator") {
		t.Fatalf("unknown evaluator: got %v", err)
	}
}

// TestPlanConcurrent: goroutines sharing one plan (its folded constants,
// its data) get the interpreter's answers; make test runs it under -race.
func TestPlanConcurrent(t *testing.T) {
	e := openDefault(t)
	snap := e.active.Load()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(3, 5))
	inputs := make([]ast.Value, 300)
	want := make([]ast.Value, len(inputs))
	for i := range inputs {
		in := randomInput(r)
		inputs[i] = in.astValue()
		want[i], _ = snap.evalTopdown(ctx, inputs[i])
	}
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for k := range inputs {
				i := (k + g*75) % len(inputs)
				got, _ := snap.evalPlan(ctx, inputs[i])
				if !sameValue(got, want[i]) {
					errs <- fmt.Errorf("goroutine %d input %d: plan %v, interpreter %v", g, i, got, want[i])
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestNodeTermFollowsTheNode: the node description's term is reused only
// while every field of the node and of each GPU is the same.
func TestNodeTermFollowsTheNode(t *testing.T) {
	base := func() *Node {
		return &Node{Name: "n", GPUs: []NodeGPU{{Index: 0, Model: "m", MIGEnabled: true, FreeSlices: 3, Tenants: []string{"a"}}}}
	}
	first := nodeTerm(base())
	if nodeTerm(base()) != first {
		t.Fatal("an equal node description built a new term")
	}
	// Change each field of NodeGPU in turn, found by reflection so that a
	// field added later cannot be forgotten by Node.equal.
	gt := reflect.TypeOf(NodeGPU{})
	for i := range gt.NumField() {
		n := base()
		changeField(t, reflect.ValueOf(&n.GPUs[0]).Elem().Field(i), "NodeGPU."+gt.Field(i).Name)
		got := nodeTerm(n)
		if want := ast.NewTerm(n.astValue()); ast.Compare(got.Value, want.Value) != 0 {
			t.Fatalf("NodeGPU.%s changed: got the term %v, want %v", gt.Field(i).Name, got, want)
		}
		nodeTerm(base()) // back to the base description
	}
	other := base()
	other.Name = "m"
	if ast.Compare(nodeTerm(other).Value, first.Value) == 0 {
		t.Fatal("a renamed node kept the old term")
	}
}

// TestMaskPlanAsInterpreter: the default bundle's data.system.log.mask runs
// as a plan too, and masks what the interpreter masks.
func TestMaskPlanAsInterpreter(t *testing.T) {
	e := openDefault(t)
	snap := e.active.Load()
	if snap.maskProgram == nil {
		t.Fatal("the default bundle's mask must run as a plan")
	}
	// The same snapshot without the mask's plan: the interpreter masks.
	interp := &snapshot{revision: snap.revision, hasMask: snap.hasMask, interp: snap.interp}
	ctx := context.Background()
	r := rand.New(rand.NewPCG(9, 9))
	for i := range 300 {
		in := randomInput(r)
		if i%2 == 0 {
			in.Pod.Labels = map[string]string{"app": "x", "db-password": "p", "team/Token": "t"}
		}
		if i%3 == 0 {
			if in.Pod.Annotations == nil {
				in.Pod.Annotations = map[string]string{}
			}
			in.Pod.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = `{"kind":"Pod"}`
		}
		d, _ := e.Decide(ctx, in)
		doc, err := toDoc(map[string]any{"input": in, "result": d})
		if err != nil {
			t.Fatal(err)
		}
		got, gerr := snap.maskValue(ctx, doc)
		want, werr := interp.maskValue(ctx, doc)
		if (gerr != nil) != (werr != nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("input %d: plan mask %v (%v), interpreter %v (%v)", i, got, gerr, want, werr)
		}
	}
}

// TestContainersTermFollowsTheContainers: the containers' term is reused
// only while every field of every container is the same.
func TestContainersTermFollowsTheContainers(t *testing.T) {
	base := func() []Container {
		return []Container{{Name: "c", Image: "i", Privileged: true, Devices: []string{"/dev/fuse"}, MemoryBytes: 1, Env: map[string]string{"A": "1"}}}
	}
	first := containersTerm(base())
	if containersTerm(base()) != first {
		t.Fatal("equal containers built a new term")
	}
	ct := reflect.TypeOf(Container{})
	for i := range ct.NumField() {
		cs := base()
		changeField(t, reflect.ValueOf(&cs[0]).Elem().Field(i), "Container."+ct.Field(i).Name)
		got := containersTerm(cs)
		want := ast.NewTerm(cs[0].astValue())
		if ast.Compare(got.Value.(*ast.Array).Elem(0).Value, want.Value) != 0 {
			t.Fatalf("Container.%s changed: got %v, want %v", ct.Field(i).Name, got, want)
		}
		containersTerm(base())
	}
	// The memo keeps its own copy: changing the caller's slice or map
	// afterwards does not change what it compares against.
	cs := base()
	containersTerm(cs)
	cs[0].Env["A"] = "changed"
	if got := containersTerm(cs); ast.Compare(got.Value.(*ast.Array).Elem(0).Value, ast.NewTerm(cs[0].astValue()).Value) != 0 {
		t.Fatalf("a map changed in place after the memo kept the old term: %v", got)
	}
}

// changeField gives f, a field of an input struct, another value.
func changeField(t *testing.T, f reflect.Value, name string) {
	t.Helper()
	switch f.Kind() {
	case reflect.Int, reflect.Int64:
		f.SetInt(f.Int() + 1)
	case reflect.String:
		f.SetString(f.String() + "x")
	case reflect.Bool:
		f.SetBool(!f.Bool())
	case reflect.Slice:
		// A zero element of a new kind and a changed copy of it differ from
		// every element already there.
		elem := reflect.New(f.Type().Elem()).Elem()
		switch elem.Kind() {
		case reflect.String:
			elem.SetString("added")
		case reflect.Int32:
			elem.SetInt(65535)
		case reflect.Struct:
			changeField(t, elem.Field(0), name+"[].0")
		}
		f.Set(reflect.Append(f, elem))
	case reflect.Map:
		f.SetMapIndex(reflect.ValueOf("added"), reflect.ValueOf("added"))
	default:
		t.Fatalf("%s: kind %s not covered by this test", name, f.Kind())
	}
}
