// Package rdma keeps RDMA devices out of pods that the policy does not grant
// them, because hardware RDMA bypasses every packet hook.
//
// Verbs and RoCE run in the NIC: once a process can open /dev/infiniband/*
// it moves data without the kernel's network stack, so netpol's TCX programs
// never see it. Bulkhead therefore fences hardware RDMA by device access and
// per-tenant virtual functions, in two layers:
//
//   - Spec (every runtime): an OCI spec option that strips /dev/infiniband/*
//     and rdma_cm device nodes, their bind mounts and their cgroup device
//     rules, keeping only the tenant's own VF nodes when the policy grants
//     RDMA. gVisor pods get no RDMA device at all unless the spec names one,
//     so for them this layer is the whole fence.
//   - DeviceFilter (runc-tier pods): a BPF_PROG_TYPE_CGROUP_DEVICE program on
//     the pod's cgroup v2 directory that refuses RDMA character devices
//     (major 231 and rdma_cm) other than the granted ones, so that a device
//     node created or mounted later still cannot be opened. It is attached
//     with multi-attach semantics: the runtime's own device program still
//     runs and both must allow.
//
// Software RoCEv2 (UDP 4791) that does cross the kernel is dropped between
// tenants by netpol's packet programs.
package rdma

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/opencontainers/runtime-spec/specs-go"
)

// Device paths and numbers.
const (
	// Dir holds the verbs, umad, issm and rdma_cm nodes.
	Dir = "/dev/infiniband"
	// InfinibandMajor is the character major of uverbs, umad and issm nodes.
	InfinibandMajor = 231
	rdmaCMName      = "rdma_cm"
)

// Grant is the policy's RDMA decision for one pod.
type Grant struct {
	// Allowed grants RDMA. Without it every RDMA device is removed.
	Allowed bool
	// Devices are the device paths of the tenant's own VF (for example
	// /dev/infiniband/uverbs3); they are kept when Allowed, with rdma_cm.
	// Every path must be under /dev/infiniband.
	Devices []string
}

// Validate checks the grant.
func (g Grant) Validate() error {
	if !g.Allowed && len(g.Devices) > 0 {
		return errors.New("rdma grant: Devices given but Allowed is false")
	}
	for i, d := range g.Devices {
		if filepath.Clean(d) != d || !IsRDMAPath(d) || d == Dir {
			return fmt.Errorf("rdma grant: Devices[%d] %q must be a clean path under %s", i, d, Dir)
		}
	}
	return nil
}

// IsRDMAPath reports whether path names an RDMA device node or directory.
func IsRDMAPath(path string) bool {
	path = filepath.Clean(path)
	return path == Dir || strings.HasPrefix(path, Dir+"/") || path == "/dev/"+rdmaCMName
}

func (g Grant) keeps(path string) bool {
	if !g.Allowed {
		return false
	}
	path = filepath.Clean(path)
	return filepath.Base(path) == rdmaCMName || slices.Contains(g.Devices, path)
}

// SpecOpt strips from the spec every RDMA device node, bind mount and cgroup
// device rule the grant does not keep, and adds deny rules for them. It has
// the shape of Bulkhead's other spec options.
func SpecOpt(g Grant) func(*specs.Spec) error {
	return func(s *specs.Spec) error {
		if err := g.Validate(); err != nil {
			return err
		}
		if s == nil {
			return errors.New("rdma: nil spec")
		}
		var mounts []specs.Mount
		for _, m := range s.Mounts {
			rdma := IsRDMAPath(m.Destination) || IsRDMAPath(m.Source)
			if rdma && !(g.keeps(m.Destination) && (g.keeps(m.Source) || !IsRDMAPath(m.Source))) {
				continue
			}
			mounts = append(mounts, m)
		}
		s.Mounts = mounts
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		var (
			devices  []specs.LinuxDevice
			stripped []specs.LinuxDevice
			kept     []specs.LinuxDevice
		)
		for _, d := range s.Linux.Devices {
			switch {
			case !IsRDMAPath(d.Path):
				devices = append(devices, d)
			case g.keeps(d.Path):
				devices = append(devices, d)
				kept = append(kept, d)
			default:
				stripped = append(stripped, d)
			}
		}
		s.Linux.Devices = devices
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		s.Linux.Resources.Devices = deviceRules(s.Linux.Resources.Devices, stripped, kept)
		return nil
	}
}

// deviceRules drops allow rules that name an RDMA device, then appends (rules
// apply in order, the last match wins) a deny for the whole InfiniBand major
// and each stripped device, then an allow for each kept one.
func deviceRules(rules []specs.LinuxDeviceCgroup, stripped, kept []specs.LinuxDevice) []specs.LinuxDeviceCgroup {
	strippedNum := map[[2]int64]bool{}
	for _, d := range stripped {
		strippedNum[[2]int64{d.Major, d.Minor}] = true
	}
	var out []specs.LinuxDeviceCgroup
	for _, r := range rules {
		if r.Allow && r.Major != nil {
			if *r.Major == InfinibandMajor {
				continue
			}
			if r.Minor != nil && strippedNum[[2]int64{*r.Major, *r.Minor}] {
				continue
			}
		}
		out = append(out, r)
	}
	ptr := func(v int64) *int64 { return &v }
	out = append(out, specs.LinuxDeviceCgroup{Allow: false, Type: "c", Major: ptr(InfinibandMajor), Access: "rwm"})
	for _, d := range stripped {
		if d.Major == InfinibandMajor {
			continue
		}
		out = append(out, specs.LinuxDeviceCgroup{Allow: false, Type: "c", Major: ptr(d.Major), Minor: ptr(d.Minor), Access: "rwm"})
	}
	for _, d := range kept {
		out = append(out, specs.LinuxDeviceCgroup{Allow: true, Type: "c", Major: ptr(d.Major), Minor: ptr(d.Minor), Access: "rwm"})
	}
	return out
}
