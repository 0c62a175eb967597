package inject

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

func TestParseMIGMinors(t *testing.T) {
	m, err := ParseMIGMinors("testdata/mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		gpu, gi, ci int // ci < 0: the GI capability
		want        int64
		err         string
	}{
		{0, 1, -1, 12, ""},
		{0, 1, 0, 13, ""},
		{1, 2, -1, 156, ""},
		{1, 2, 0, 157, ""},
		{0, 0, 1, 5, ""},
		{0, 9, -1, 0, "no capability gpu0/gi9/access"},
		{1, 1, 3, 0, "no capability gpu1/gi1/ci3/access"},
	}
	for _, tt := range tests {
		var got int64
		var err error
		if tt.ci < 0 {
			got, err = m.GI(tt.gpu, tt.gi)
		} else {
			got, err = m.CI(tt.gpu, tt.gi, tt.ci)
		}
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%+v: error %v", tt, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%+v: got %d, %v", tt, got, err)
		}
	}
}

func TestParseMIGMinorsRejectsBadFiles(t *testing.T) {
	tests := []struct{ path, want string }{
		{"testdata/mig-minors.bad", `mig-minors.bad:2: minor "twelve" of gpu0/gi1/access: not a number`},
		{"testdata/mig-minors.dup", "capability config listed twice"},
		{"testdata/missing", "no such file"},
	}
	for _, tt := range tests {
		if _, err := ParseMIGMinors(tt.path); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.path, err, tt.want)
		}
	}
}

func TestParseProcDevices(t *testing.T) {
	m, err := ParseProcDevices("testdata/proc-devices")
	if err != nil {
		t.Fatal(err)
	}
	if m != (Majors{Nvidia: 195, UVM: 234, Caps: 235}) {
		t.Fatalf("majors %+v", m)
	}
	if _, err := ParseProcDevices("testdata/proc-devices.nodriver"); err == nil || !strings.Contains(err.Error(), "no nvidia-frontend") {
		t.Fatalf("no driver: %v", err)
	}
}

var testMajors = Majors{Nvidia: 195, UVM: 234, Caps: 235}

func testInstance() mig.Instance {
	return mig.Instance{GPU: 1, GPUUUID: "GPU-p", ParentMinor: 1, Profile: "3g.71gb", Start: 4, Size: 4, GI: 2, CI: 0, UUID: "MIG-1234"}
}

func TestSpecOpts(t *testing.T) {
	minors, _ := ParseMIGMinors("testdata/mig-minors")
	tests := []struct {
		name    string
		opts    []SpecOpt
		devices []string // "path major:minor access"
		env     []string
		err     string
	}{
		{
			name:    "control devices",
			opts:    []SpecOpt{WithEdits(ControlEdits(testMajors))},
			devices: []string{"/dev/nvidiactl 195:255 rw", "/dev/nvidia-uvm 234:0 rw", "/dev/nvidia-uvm-tools 234:1 rw"},
		},
		{
			name: "MIG device",
			opts: []SpecOpt{WithMIGDevice(testMajors, minors, testInstance())},
			devices: []string{"/dev/nvidiactl 195:255 rw", "/dev/nvidia-uvm 234:0 rw", "/dev/nvidia-uvm-tools 234:1 rw",
				"/dev/nvidia1 195:1 rw", "/dev/nvidia-caps/nvidia-cap156 235:156 r", "/dev/nvidia-caps/nvidia-cap157 235:157 r"},
			env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=MIG-1234"},
		},
		{
			name:    "whole GPU",
			opts:    []SpecOpt{WithEdits(WholeGPUEdits(testMajors, mig.GPUInfo{Minor: 3, UUID: "GPU-abc"}))},
			devices: []string{"/dev/nvidia3 195:3 rw"},
			env:     []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=GPU-abc"},
		},
		{
			name:    "same device twice is added once",
			opts:    []SpecOpt{WithDeviceNode(DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0, Access: "rw"}), WithDeviceNode(DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0, Access: "rw"})},
			devices: []string{"/dev/nvidia0 195:0 rw"},
		},
		{
			name: "visible devices replaces the author's value",
			opts: []SpecOpt{WithVisibleDevices("MIG-a", "MIG-b")},
			env:  []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=MIG-a,MIG-b"},
		},
		{name: "conflicting device", opts: []SpecOpt{WithDeviceNode(DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 0, Access: "rw"}), WithDeviceNode(DeviceNode{Path: "/dev/nvidia0", Major: 195, Minor: 7, Access: "rw"})}, err: "already in the spec as c 195:0"},
		{name: "path outside /dev", opts: []SpecOpt{WithDeviceNode(DeviceNode{Path: "/etc/passwd", Access: "r"})}, err: `device "/etc/passwd": path must be under /dev/`},
		{name: "mknod access refused", opts: []SpecOpt{WithDeviceNode(DeviceNode{Path: "/dev/x", Access: "rwm"})}, err: `access "rwm"`},
		{name: "empty visible id", opts: []SpecOpt{WithVisibleDevices("")}, err: "device id"},
		{name: "no visible ids", opts: []SpecOpt{WithVisibleDevices()}, err: "no device ids"},
		{name: "MIG instance without caps minor", opts: []SpecOpt{WithMIGDevice(testMajors, minors, mig.Instance{ParentMinor: 0, GI: 7, CI: 0, UUID: "MIG-x"})}, err: "no capability gpu0/gi7/access"},
		{name: "GI without CI", opts: []SpecOpt{WithMIGDevice(testMajors, minors, mig.Instance{GI: 1, CI: -1})}, err: "no compute instance"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &specs.Spec{Process: &specs.Process{Env: []string{"PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"}}}
			err := ApplySpecOpts(s, tt.opts...)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			if s.Linux != nil {
				if len(s.Linux.Devices) != len(s.Linux.Resources.Devices) {
					t.Fatalf("%d devices, %d cgroup rules", len(s.Linux.Devices), len(s.Linux.Resources.Devices))
				}
				for i, d := range s.Linux.Devices {
					r := s.Linux.Resources.Devices[i]
					if !r.Allow || r.Type != "c" || *r.Major != d.Major || *r.Minor != d.Minor || d.Type != "c" {
						t.Fatalf("cgroup rule %+v for %+v", r, d)
					}
					got = append(got, d.Path+" "+itoa(d.Major)+":"+itoa(d.Minor)+" "+r.Access)
				}
			}
			if strings.Join(got, "|") != strings.Join(tt.devices, "|") {
				t.Fatalf("devices\n got %v\nwant %v", got, tt.devices)
			}
			if tt.env != nil && strings.Join(s.Process.Env, "|") != strings.Join(tt.env, "|") {
				t.Fatalf("env %v, want %v", s.Process.Env, tt.env)
			}
		})
	}
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

// The spec Bulkhead writes is one the CDI library itself reads, validates
// and injects: the device nodes and environment of the slice, nothing else.
func TestCDISpec(t *testing.T) {
	minors, _ := ParseMIGMinors("testdata/mig-minors")
	inst := testInstance()
	e, err := MIGEdits(testMajors, minors, inst)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := CDISpec(CDIKind, ControlEdits(testMajors), map[string]Edits{inst.UUID: e})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path, err := WriteCDISpec(dir, "sb1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "bulkhead.dev-gpu_sb1.json") {
		t.Fatalf("path %s", path)
	}
	data, _ := os.ReadFile(path)
	var back cdi.Spec
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Kind != CDIKind || len(back.Devices) != 1 || back.Devices[0].Name != "MIG-1234" ||
		len(back.Devices[0].ContainerEdits.DeviceNodes) != 3 || back.Devices[0].ContainerEdits.Env[0] != "NVIDIA_VISIBLE_DEVICES=MIG-1234" ||
		len(back.ContainerEdits.DeviceNodes) != 3 {
		t.Fatalf("spec %s", data)
	}
	if n := back.Devices[0].ContainerEdits.DeviceNodes[2]; n.Path != "/dev/nvidia-caps/nvidia-cap157" || n.Major != 235 || n.Minor != 157 || n.Permissions != "r" {
		t.Fatalf("ci node %+v", n)
	}
	name := CDIName(CDIKind, inst.UUID)
	if name != "bulkhead.dev/gpu=MIG-1234" {
		t.Fatal(name)
	}
	// CDI's own reader validates the file (schema rules, names, edits).
	if _, err := cdilib.ReadSpec(path, 0); err != nil {
		t.Fatalf("CDI refuses the spec: %v", err)
	}
	// A CDI-aware runtime resolves the name from the directory and gives
	// the container what WithMIGDevice gives it.
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dir), cdilib.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	viaCDI := &specs.Spec{Process: &specs.Process{}}
	if unresolved, err := cache.InjectDevices(viaCDI, name); err != nil {
		t.Fatalf("inject %s: %v (unresolved %v)", name, err, unresolved)
	}
	direct := &specs.Spec{}
	if err := ApplySpecOpts(direct, WithMIGDevice(testMajors, minors, inst)); err != nil {
		t.Fatal(err)
	}
	paths := func(s *specs.Spec) (out []string) {
		for _, d := range s.Linux.Devices {
			out = append(out, d.Path)
		}
		sort.Strings(out)
		return out
	}
	if got, want := paths(viaCDI), paths(direct); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("CDI injects %v, WithMIGDevice %v", got, want)
	}
	if strings.Join(viaCDI.Process.Env, " ") != "NVIDIA_VISIBLE_DEVICES=MIG-1234" {
		t.Fatalf("CDI env %v", viaCDI.Process.Env)
	}
	bad := []struct {
		kind string
		devs map[string]Edits
		want string
	}{
		{"bulkhead", map[string]Edits{"a": e}, `cdi kind "bulkhead"`},
		{"bulkhead.dev/g pu", map[string]Edits{"a": e}, `cdi kind "bulkhead.dev/g pu"`},
		{CDIKind, map[string]Edits{"bad name": e}, `cdi device name "bad name"`},
		{CDIKind, map[string]Edits{"a": {}}, "cdi device a: no edits"},
		{CDIKind, nil, "no devices"},
	}
	for _, b := range bad {
		if _, err := CDISpec(b.kind, Edits{}, b.devs); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("CDISpec(%q): %v, want %q", b.kind, err, b.want)
		}
	}
}

// Specs are files of their owner: written, listed and removed by owner, and
// removing twice or listing a missing directory is no error.
func TestCDISpecFiles(t *testing.T) {
	dir := t.TempDir()
	spec, err := CDISpec(CDIKind, Edits{}, map[string]Edits{"GPU-1": {Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-1"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"b2", "a1"} {
		if _, err := WriteCDISpec(dir, owner, spec); err != nil {
			t.Fatal(err)
		}
	}
	// Not ours: another vendor's spec and a file that only looks close.
	for _, f := range []string{"nvidia.com-gpu.json", "bulkhead.dev-gpu_x.yaml", ".bulkhead.dev-gpu_c3.json-123"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	owners, err := CDISpecOwners(dir, CDIKind)
	if err != nil || strings.Join(owners, ",") != "a1,b2" {
		t.Fatalf("owners %v, %v", owners, err)
	}
	for range 2 {
		if err := RemoveCDISpec(dir, CDIKind, "a1"); err != nil {
			t.Fatal(err)
		}
	}
	if owners, _ := CDISpecOwners(dir, CDIKind); strings.Join(owners, ",") != "b2" {
		t.Fatalf("after remove: %v", owners)
	}
	if owners, err := CDISpecOwners(filepath.Join(dir, "missing"), CDIKind); err != nil || owners != nil {
		t.Fatalf("missing dir: %v %v", owners, err)
	}
	bad := []struct {
		dir, owner, want string
	}{
		{"relative", "a", `cdi spec dir "relative": must be an absolute path`},
		{dir, "../x", `cdi spec owner "../x"`},
		{dir, ".hidden", `cdi spec owner ".hidden"`},
		{dir, "", `cdi spec owner ""`},
	}
	for _, b := range bad {
		if _, err := WriteCDISpec(b.dir, b.owner, spec); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("WriteCDISpec(%q, %q): %v, want %q", b.dir, b.owner, err, b.want)
		}
	}
}

func TestWithCDIDevices(t *testing.T) {
	s := &specs.Spec{Annotations: map[string]string{CDIAnnotation: "bulkhead.dev/gpu=GPU-forged"}}
	if err := WithCDIDevices(CDIName(CDIKind, "MIG-1"))(s); err != nil {
		t.Fatal(err)
	}
	// CDI's own annotation parser reads what Bulkhead wrote.
	keys, devices, err := cdilib.ParseAnnotations(s.Annotations)
	if err != nil || len(keys) != 1 || keys[0] != CDIAnnotation || len(devices) != 1 || devices[0] != "bulkhead.dev/gpu=MIG-1" {
		t.Fatalf("CDI reads %v %v %v", keys, devices, err)
	}
	if key, err := cdilib.AnnotationKey("bulkhead.dev", "gpu"); err != nil || key != CDIAnnotation {
		t.Fatalf("CDI's key for plugin bulkhead.dev, device gpu: %q %v", key, err)
	}
	if err := WithCDIDevices("MIG-1")(s); err == nil {
		t.Fatal("an unqualified name was accepted")
	}
}
