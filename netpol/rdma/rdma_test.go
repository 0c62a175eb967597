package rdma

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf/rlimit"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func i64(v int64) *int64 { return &v }

// testSpec is a pod spec the runtime handed a whole HCA: two verbs nodes,
// umad, rdma_cm, a bind mount of the directory and allow rules for them.
func testSpec() *specs.Spec {
	return &specs.Spec{
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev/infiniband", Type: "bind", Source: "/dev/infiniband", Options: []string{"rbind"}},
			{Destination: "/data", Type: "bind", Source: "/srv/data", Options: []string{"rbind"}},
		},
		Linux: &specs.Linux{
			Devices: []specs.LinuxDevice{
				{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 0},
				{Path: "/dev/infiniband/uverbs0", Type: "c", Major: 231, Minor: 192},
				{Path: "/dev/infiniband/uverbs3", Type: "c", Major: 231, Minor: 195},
				{Path: "/dev/infiniband/umad0", Type: "c", Major: 231, Minor: 0},
				{Path: "/dev/infiniband/rdma_cm", Type: "c", Major: 10, Minor: 58},
			},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
				{Allow: false, Access: "rwm"},
				{Allow: true, Type: "c", Major: i64(195), Minor: i64(0), Access: "rwm"},
				{Allow: true, Type: "c", Major: i64(231), Access: "rwm"},
				{Allow: true, Type: "c", Major: i64(10), Minor: i64(58), Access: "rwm"},
			}},
		},
	}
}

func devicePaths(s *specs.Spec) []string {
	var out []string
	for _, d := range s.Linux.Devices {
		out = append(out, d.Path)
	}
	return out
}

func mountDests(s *specs.Spec) []string {
	var out []string
	for _, m := range s.Mounts {
		out = append(out, m.Destination)
	}
	return out
}

func rules(s *specs.Spec) []string {
	var out []string
	for _, r := range s.Linux.Resources.Devices {
		num := func(p *int64) string {
			if p == nil {
				return "*"
			}
			return fmt.Sprint(*p)
		}
		verb := "deny"
		if r.Allow {
			verb = "allow"
		}
		out = append(out, fmt.Sprintf("%s %s %s:%s", verb, r.Type, num(r.Major), num(r.Minor)))
	}
	return out
}

func TestSpecOpt(t *testing.T) {
	for _, tc := range []struct {
		name        string
		grant       Grant
		wantDevices []string
		wantMounts  []string
		wantRules   []string
	}{
		{
			name:        "no grant strips every rdma device",
			grant:       Grant{},
			wantDevices: []string{"/dev/nvidia0"},
			wantMounts:  []string{"/proc", "/data"},
			wantRules:   []string{"deny  *:*", "allow c 195:0", "deny c 231:*", "deny c 10:58"},
		},
		{
			name:        "grant keeps the tenant's VF and rdma_cm",
			grant:       Grant{Allowed: true, Devices: []string{"/dev/infiniband/uverbs3"}},
			wantDevices: []string{"/dev/nvidia0", "/dev/infiniband/uverbs3", "/dev/infiniband/rdma_cm"},
			wantMounts:  []string{"/proc", "/data"},
			wantRules:   []string{"deny  *:*", "allow c 195:0", "allow c 10:58", "deny c 231:*", "allow c 231:195", "allow c 10:58"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testSpec()
			if err := SpecOpt(tc.grant)(s); err != nil {
				t.Fatal(err)
			}
			if got := devicePaths(s); !slices.Equal(got, tc.wantDevices) {
				t.Errorf("devices %v, want %v", got, tc.wantDevices)
			}
			if got := mountDests(s); !slices.Equal(got, tc.wantMounts) {
				t.Errorf("mounts %v, want %v", got, tc.wantMounts)
			}
			if got := rules(s); !slices.Equal(got, tc.wantRules) {
				t.Errorf("rules %v, want %v", got, tc.wantRules)
			}
		})
	}
}

func TestSpecOptEmptySpec(t *testing.T) {
	s := &specs.Spec{}
	if err := SpecOpt(Grant{})(s); err != nil {
		t.Fatal(err)
	}
	if got := rules(s); !slices.Equal(got, []string{"deny c 231:*"}) {
		t.Errorf("rules %v", got)
	}
}

func TestGrantValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grant Grant
		want  string
	}{
		{"ok", Grant{Allowed: true, Devices: []string{"/dev/infiniband/uverbs1"}}, ""},
		{"devices without grant", Grant{Devices: []string{"/dev/infiniband/uverbs1"}}, "Allowed is false"},
		{"outside infiniband", Grant{Allowed: true, Devices: []string{"/dev/nvidia0"}}, "Devices[0]"},
		{"unclean", Grant{Allowed: true, Devices: []string{"/dev/infiniband/../sda"}}, "Devices[0]"},
		{"the directory", Grant{Allowed: true, Devices: []string{"/dev/infiniband"}}, "Devices[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.grant.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
			if tc.want != "" {
				if err := SpecOpt(tc.grant)(testSpec()); err == nil {
					t.Fatal("SpecOpt accepted an invalid grant")
				}
			}
		})
	}
}

// TestDeviceFilter attaches the program to a fresh cgroup and opens device
// nodes from a process inside it: refused nodes give EPERM (the program);
// allowed ones reach the driver, which here has no HCA and answers another
// error, or succeed.
func TestDeviceFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups, device nodes and BPF programs")
	}
	if os.Getenv("BULKHEAD_DEVOPEN") != "" {
		t.Skip("helper process")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Skip(err)
	}
	root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup"
		var st unix.Statfs_t
		if unix.Statfs(root, &st) != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
			t.Skip("no cgroup v2 hierarchy mounted")
		}
	}
	cg := filepath.Join(root, fmt.Sprintf("bulkhead-rdma-test-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("cannot create a cgroup: %v", err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })

	dir := t.TempDir()
	nodes := map[string]DeviceNumber{
		"uverbs0": {231, 192}, "uverbs3": {231, 195}, "rdma_cm": {10, 58}, "null": {1, 3},
	}
	for name, d := range nodes {
		if err := unix.Mknod(filepath.Join(dir, name), unix.S_IFCHR|0o666, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			t.Skipf("cannot create device nodes here: %v", err)
		}
	}
	rdmaCM := nodes["rdma_cm"]
	for _, tc := range []struct {
		name  string
		allow []DeviceNumber
		want  map[string]string
	}{
		{"no grant", nil, map[string]string{"uverbs0": refused, "uverbs3": refused, "rdma_cm": refused, "null": allowed}},
		{"own VF", []DeviceNumber{nodes["uverbs3"], rdmaCM}, map[string]string{"uverbs0": refused, "uverbs3": allowed, "rdma_cm": allowed, "null": allowed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := AttachDeviceNumbers(cg, &rdmaCM, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := openInCgroup(t, cg, dir)
			for name, want := range tc.want {
				verdict := allowed
				if got[name] == "EPERM" {
					verdict = refused
				}
				if got[name] == "" || verdict != want {
					t.Errorf("open %s: %q, want %s", name, got[name], want)
				}
			}
		})
	}
}

const (
	refused = "refused (EPERM)"
	allowed = "allowed (reaches the driver)"
)

// openInCgroup starts this test binary inside the cgroup to open each node.
func openInCgroup(t *testing.T, cg, dir string) map[string]string {
	fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperDeviceOpen$")
	cmd.Env = append(os.Environ(), "BULKHEAD_DEVOPEN="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if name, res, ok := strings.Cut(line, "="); ok && strings.HasPrefix(name, "open:") {
			got[strings.TrimPrefix(name, "open:")] = res
		}
	}
	return got
}

func TestHelperDeviceOpen(t *testing.T) {
	dir := os.Getenv("BULKHEAD_DEVOPEN")
	if dir == "" {
		t.Skip("helper process for TestDeviceFilter")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		f, err := os.OpenFile(filepath.Join(dir, e.Name()), os.O_RDWR, 0)
		res := "ok"
		var errno syscall.Errno
		switch {
		case err == nil:
			f.Close()
		case errors.As(err, &errno):
			res = unix.ErrnoName(errno)
		default:
			res = err.Error()
		}
		fmt.Printf("open:%s=%s\n", e.Name(), res)
	}
}
