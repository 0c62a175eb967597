package rdma

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DeviceNumber is a character device's major and minor.
type DeviceNumber struct {
	Major, Minor uint32
}

// bpf_cgroup_dev_ctx and its constants (include/uapi/linux/bpf.h).
const (
	devCtxAccessType = 0 // (access << 16) | type
	devCtxMajor      = 4
	devCtxMinor      = 8
	devTypeChar      = 2 // BPF_DEVCG_DEV_CHAR
)

// DeviceFilterSpec returns a cgroup device program that refuses character
// devices of the InfiniBand major, and rdmaCM when it is not nil, except the
// devices in allow. Everything else is left to the runtime's own rules.
func DeviceFilterSpec(rdmaCM *DeviceNumber, allow []DeviceNumber) *ebpf.ProgramSpec {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, devCtxAccessType, asm.Word),
		asm.And.Imm32(asm.R2, 0xffff),
		asm.JNE.Imm32(asm.R2, devTypeChar, "allow"),
		asm.LoadMem(asm.R3, asm.R1, devCtxMajor, asm.Word),
		asm.LoadMem(asm.R4, asm.R1, devCtxMinor, asm.Word),
	}
	for i, d := range allow {
		next := fmt.Sprintf("allow_next_%d", i)
		insns = append(insns,
			asm.JNE.Imm32(asm.R3, int32(d.Major), next),
			asm.JEq.Imm32(asm.R4, int32(d.Minor), "allow"),
			asm.Ja.Label(next),
			// A no-op target for the jumps above.
			asm.Mov.Reg(asm.R3, asm.R3).WithSymbol(next),
		)
	}
	insns = append(insns, asm.JEq.Imm32(asm.R3, InfinibandMajor, "deny"))
	if rdmaCM != nil {
		insns = append(insns,
			asm.JNE.Imm32(asm.R3, int32(rdmaCM.Major), "allow"),
			asm.JEq.Imm32(asm.R4, int32(rdmaCM.Minor), "deny"),
		)
	}
	insns = append(insns,
		asm.Mov.Imm(asm.R0, 1).WithSymbol("allow"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("deny"),
		asm.Return(),
	)
	return &ebpf.ProgramSpec{
		Name: "bulkhead_rdma", Type: ebpf.CGroupDevice, AttachType: ebpf.AttachCGroupDevice,
		License: "GPL", Instructions: insns,
	}
}

// DeviceNumberOf stats a device node.
func DeviceNumberOf(path string) (DeviceNumber, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return DeviceNumber{}, fmt.Errorf("rdma: stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return DeviceNumber{}, fmt.Errorf("rdma: %s is not a character device", path)
	}
	return DeviceNumber{Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)}, nil
}

// AttachDeviceFilter loads the device program for the grant and attaches it
// to the cgroup v2 directory of a runc-tier pod. The grant's devices and the
// host's rdma_cm node (when present) are read from the host's /dev. Closing
// the returned link detaches the program; pin it to outlive the caller.
func AttachDeviceFilter(cgroupDir string, g Grant) (link.Link, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	var rdmaCM *DeviceNumber
	if d, err := DeviceNumberOf(Dir + "/" + rdmaCMName); err == nil {
		rdmaCM = &d
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var allow []DeviceNumber
	if g.Allowed {
		for _, p := range g.Devices {
			d, err := DeviceNumberOf(p)
			if err != nil {
				return nil, err
			}
			allow = append(allow, d)
		}
		if rdmaCM != nil {
			allow = append(allow, *rdmaCM)
		}
	}
	return AttachDeviceNumbers(cgroupDir, rdmaCM, allow)
}

// AttachDeviceNumbers is AttachDeviceFilter with the numbers given.
func AttachDeviceNumbers(cgroupDir string, rdmaCM *DeviceNumber, allow []DeviceNumber) (link.Link, error) {
	prog, err := ebpf.NewProgram(DeviceFilterSpec(rdmaCM, allow))
	if err != nil {
		return nil, fmt.Errorf("rdma: load device filter: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupDir, Attach: ebpf.AttachCGroupDevice, Program: prog})
	if err != nil {
		return nil, fmt.Errorf("rdma: attach device filter to %s: %w", cgroupDir, err)
	}
	return l, nil
}
