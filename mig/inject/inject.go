// Package inject hands a GPU or MIG slice to a container, as OCI spec
// options (the shape of containerd's oci.SpecOpts, each tested on a plain
// specs.Spec) and as a CDI spec that names the same edits.
//
// Invariant: a container gets exactly the device nodes its GPU needs and a
// device-cgroup rule for each (never mknod), and NVIDIA_VISIBLE_DEVICES names
// only its own GPU or MIG device, whatever the image or the pod author set.
package inject

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/mig"
)

// Device paths a CUDA process needs next to its GPU or MIG device.
const (
	DevNvidiaCtl      = "/dev/nvidiactl"
	DevNvidiaUVM      = "/dev/nvidia-uvm"
	DevNvidiaUVMTools = "/dev/nvidia-uvm-tools"
	// NvidiaCtlMinor is /dev/nvidiactl's minor on the nvidia major.
	NvidiaCtlMinor = 255
	// VisibleDevicesEnv is the variable the NVIDIA container stack and
	// CUDA read to pick devices.
	VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
)

// DefaultMIGMinorsPath is where the driver lists MIG capability minors.
const DefaultMIGMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// SpecOpt changes an OCI spec, in the shape of containerd's oci.SpecOpts.
type SpecOpt func(*specs.Spec) error

// ApplySpecOpts applies opts in order and stops at the first error.
func ApplySpecOpts(s *specs.Spec, opts ...SpecOpt) error {
	for _, o := range opts {
		if err := o(s); err != nil {
			return err
		}
	}
	return nil
}

// Majors are the character-device majors of the NVIDIA driver.
type Majors struct {
	// Nvidia is the major of /dev/nvidiaN and /dev/nvidiactl (195).
	Nvidia int64
	// UVM is the major of /dev/nvidia-uvm; dynamic.
	UVM int64
	// Caps is the major of /dev/nvidia-caps/*; dynamic.
	Caps int64
}

// ParseProcDevices reads the driver majors from a /proc/devices file.
func ParseProcDevices(path string) (Majors, error) {
	f, err := os.Open(path)
	if err != nil {
		return Majors{}, err
	}
	defer f.Close()
	var m Majors
	char := false
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		switch {
		case t == "Character devices:":
			char = true
			continue
		case strings.HasSuffix(t, "devices:"):
			char = false
			continue
		case t == "" || !char:
			continue
		}
		f := strings.Fields(t)
		if len(f) != 2 {
			return Majors{}, fmt.Errorf("%s:%d: %q: want \"<major> <name>\"", path, line, t)
		}
		major, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || major < 0 {
			return Majors{}, fmt.Errorf("%s:%d: major %q: not a number", path, line, f[0])
		}
		switch f[1] {
		case "nvidia-frontend", "nvidia":
			m.Nvidia = major
		case "nvidia-uvm":
			m.UVM = major
		case "nvidia-caps":
			m.Caps = major
		}
	}
	if err := sc.Err(); err != nil {
		return Majors{}, err
	}
	switch {
	case m.Nvidia == 0:
		return m, fmt.Errorf("%s: no nvidia-frontend character device: is the driver loaded?", path)
	case m.UVM == 0:
		return m, fmt.Errorf("%s: no nvidia-uvm character device: is nvidia-uvm loaded?", path)
	}
	return m, nil
}

// MIGMinors maps capability names ("gpu0/gi1/access", "gpu0/gi1/ci0/access")
// to minors of the nvidia-caps major.
type MIGMinors map[string]int64

// ParseMIGMinors reads /proc/driver/nvidia-caps/mig-minors (or a copy).
func ParseMIGMinors(path string) (MIGMinors, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := MIGMinors{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" {
			continue
		}
		fs := strings.Fields(t)
		if len(fs) != 2 {
			return nil, fmt.Errorf("%s:%d: %q: want \"<capability> <minor>\"", path, line, t)
		}
		minor, err := strconv.ParseInt(fs[1], 10, 64)
		if err != nil || minor < 0 {
			return nil, fmt.Errorf("%s:%d: minor %q of %s: not a number", path, line, fs[1], fs[0])
		}
		if _, dup := out[fs[0]]; dup {
			return nil, fmt.Errorf("%s:%d: capability %s listed twice", path, line, fs[0])
		}
		out[fs[0]] = minor
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no capabilities listed", path)
	}
	return out, nil
}

// GI is the capability minor that grants access to a GPU instance.
func (m MIGMinors) GI(gpuMinor, gi int) (int64, error) {
	return m.lookup(fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, gi))
}

// CI is the capability minor that grants access to a compute instance.
func (m MIGMinors) CI(gpuMinor, gi, ci int) (int64, error) {
	return m.lookup(fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, gi, ci))
}

func (m MIGMinors) lookup(key string) (int64, error) {
	v, ok := m[key]
	if !ok {
		return 0, fmt.Errorf("mig-minors: no capability %s", key)
	}
	return v, nil
}

// DeviceNode is one character device to give a container.
type DeviceNode struct {
	Path  string
	Major int64
	Minor int64
	// FileMode is the node's permission bits inside the container.
	FileMode os.FileMode
	// Access is the device-cgroup access: "r", "rw" (never "m").
	Access string
}

// Edits is what a container needs for one device: nodes and environment.
// It renders both as OCI spec options and as CDI container edits.
type Edits struct {
	Env     []string
	Devices []DeviceNode
}

// Merge appends other's env and devices.
func (e Edits) Merge(other Edits) Edits {
	return Edits{
		Env:     append(append([]string(nil), e.Env...), other.Env...),
		Devices: append(append([]DeviceNode(nil), e.Devices...), other.Devices...),
	}
}

// ControlEdits are the driver's shared nodes: nvidiactl, nvidia-uvm and
// nvidia-uvm-tools.
func ControlEdits(m Majors) Edits {
	return Edits{Devices: []DeviceNode{
		{Path: DevNvidiaCtl, Major: m.Nvidia, Minor: NvidiaCtlMinor, FileMode: 0o666, Access: "rw"},
		{Path: DevNvidiaUVM, Major: m.UVM, Minor: 0, FileMode: 0o666, Access: "rw"},
		{Path: DevNvidiaUVMTools, Major: m.UVM, Minor: 1, FileMode: 0o666, Access: "rw"},
	}}
}

// WholeGPUEdits give a container an entire GPU: /dev/nvidia<minor> and its UUID.
func WholeGPUEdits(m Majors, info mig.GPUInfo) Edits {
	return Edits{
		Env:     []string{VisibleDevicesEnv + "=" + info.UUID},
		Devices: []DeviceNode{{Path: fmt.Sprintf("/dev/nvidia%d", info.Minor), Major: m.Nvidia, Minor: int64(info.Minor), FileMode: 0o666, Access: "rw"}},
	}
}

// MIGEdits give a container one MIG device: the parent /dev/nvidiaN, the
// GI and CI capability nodes (read-only, as the driver creates them) and
// NVIDIA_VISIBLE_DEVICES=MIG-<uuid>.
func MIGEdits(m Majors, minors MIGMinors, inst mig.Instance) (Edits, error) {
	if inst.UUID == "" || inst.CI < 0 {
		return Edits{}, fmt.Errorf("gpu %d GI %d: no compute instance to inject", inst.GPU, inst.GI)
	}
	if m.Caps == 0 {
		return Edits{}, fmt.Errorf("gpu %d GI %d: nvidia-caps major unknown", inst.GPU, inst.GI)
	}
	gi, err := minors.GI(inst.ParentMinor, inst.GI)
	if err != nil {
		return Edits{}, err
	}
	ci, err := minors.CI(inst.ParentMinor, inst.GI, inst.CI)
	if err != nil {
		return Edits{}, err
	}
	return Edits{
		Env: []string{VisibleDevicesEnv + "=" + inst.UUID},
		Devices: []DeviceNode{
			{Path: fmt.Sprintf("/dev/nvidia%d", inst.ParentMinor), Major: m.Nvidia, Minor: int64(inst.ParentMinor), FileMode: 0o666, Access: "rw"},
			{Path: fmt.Sprintf("%s/nvidia-cap%d", mig.DevNvidiaCaps, gi), Major: m.Caps, Minor: gi, FileMode: 0o444, Access: "r"},
			{Path: fmt.Sprintf("%s/nvidia-cap%d", mig.DevNvidiaCaps, ci), Major: m.Caps, Minor: ci, FileMode: 0o444, Access: "r"},
		},
	}, nil
}

// WithDeviceNode adds a character device and a device-cgroup rule allowing
// it. Adding the same path twice is an error unless it is identical.
func WithDeviceNode(d DeviceNode) SpecOpt {
	return func(s *specs.Spec) error {
		if !strings.HasPrefix(d.Path, "/dev/") {
			return fmt.Errorf("device %q: path must be under /dev/", d.Path)
		}
		if d.Access == "" || strings.Trim(d.Access, "rw") != "" {
			return fmt.Errorf("device %s: access %q: want r, w or rw", d.Path, d.Access)
		}
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		for _, e := range s.Linux.Devices {
			if e.Path != d.Path {
				continue
			}
			if e.Type != "c" || e.Major != d.Major || e.Minor != d.Minor {
				return fmt.Errorf("device %s: already in the spec as %s %d:%d", d.Path, e.Type, e.Major, e.Minor)
			}
			return nil
		}
		mode, uid, gid := d.FileMode, uint32(0), uint32(0)
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, FileMode: &mode, UID: &uid, GID: &gid})
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		major, minor := d.Major, d.Minor
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: &major, Minor: &minor, Access: d.Access})
		return nil
	}
}

// WithVisibleDevices sets NVIDIA_VISIBLE_DEVICES to the given UUIDs,
// replacing any value the image or pod author set.
func WithVisibleDevices(ids ...string) SpecOpt {
	return func(s *specs.Spec) error {
		if len(ids) == 0 {
			return fmt.Errorf("%s: no device ids", VisibleDevicesEnv)
		}
		for _, id := range ids {
			if id == "" || strings.ContainsAny(id, ", =") {
				return fmt.Errorf("%s: device id %q: must be a non-empty UUID", VisibleDevicesEnv, id)
			}
		}
		return withEnv(s, VisibleDevicesEnv, strings.Join(ids, ","))
	}
}

func withEnv(s *specs.Spec, key, value string) error {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
	kept := s.Process.Env[:0]
	for _, e := range s.Process.Env {
		if !strings.HasPrefix(e, key+"=") {
			kept = append(kept, e)
		}
	}
	s.Process.Env = append(kept, key+"="+value)
	return nil
}

// WithEdits applies every device node and environment variable of edits.
func WithEdits(edits Edits) SpecOpt {
	return func(s *specs.Spec) error {
		for _, d := range edits.Devices {
			if err := WithDeviceNode(d)(s); err != nil {
				return err
			}
		}
		for _, e := range edits.Env {
			k, v, ok := strings.Cut(e, "=")
			if !ok || k == "" {
				return fmt.Errorf("env %q: want KEY=value", e)
			}
			if err := withEnv(s, k, v); err != nil {
				return err
			}
		}
		return nil
	}
}

// WithMIGDevice gives a container one MIG device and the control nodes.
func WithMIGDevice(m Majors, minors MIGMinors, inst mig.Instance) SpecOpt {
	return func(s *specs.Spec) error {
		e, err := MIGEdits(m, minors, inst)
		if err != nil {
			return err
		}
		return WithEdits(ControlEdits(m).Merge(e))(s)
	}
}
