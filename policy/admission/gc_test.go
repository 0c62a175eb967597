package admission

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestGCPlan covers where the collector's settings come from: the
// container's cgroup (v2 and v1, limited or not), the flags, and the Go
// runtime's own variables, which win.
func TestGCPlan(t *testing.T) {
	cgroup := func(t *testing.T, file, content string) string {
		root := t.TempDir()
		if file != "" {
			path := filepath.Join(root, file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return root
	}
	noEnv := func(string) (string, bool) { return "", false }
	tests := []struct {
		name          string
		file, content string
		self          string // /proc/self/cgroup
		gcPercent     int
		memoryLimit   string
		env           func(string) (string, bool)
		wantPercent   int
		wantLimit     int64
		wantSource    string
		wantErr       string
	}{
		{name: "cgroup v2 limit", file: "memory.max", content: "536870912\n", gcPercent: 400, memoryLimit: "auto",
			wantPercent: 400, wantLimit: 483183820, wantSource: "90% of the cgroup's 536870912 bytes"},
		{name: "cgroup v1 limit", file: "memory/memory.limit_in_bytes", content: "1073741824\n", gcPercent: 300, memoryLimit: "auto",
			wantPercent: 300, wantLimit: 966367641},
		{name: "cgroup v2 unlimited keeps Go's default", file: "memory.max", content: "max\n", gcPercent: 400, memoryLimit: "auto",
			wantPercent: 100, wantLimit: 0, wantSource: "no memory limit (the cgroup has none)"},
		{name: "cgroup v1 unlimited", file: "memory/memory.limit_in_bytes", content: "9223372036854771712\n", gcPercent: 400, memoryLimit: "auto",
			wantPercent: 100, wantLimit: 0},
		{name: "cgroup v2, own cgroup without a namespace", file: "kubepods.slice/pod1/ctr/memory.max", content: "268435456\n",
			self: "0::/kubepods.slice/pod1/ctr\n", gcPercent: 400, memoryLimit: "auto", wantPercent: 400, wantLimit: 241591910},
		{name: "cgroup v1, own cgroup without a namespace", file: "memory/kubepods/pod1/ctr/memory.limit_in_bytes", content: "268435456\n",
			self: "12:pids:/kubepods/pod1/ctr\n5:cpu,memory:/kubepods/pod1/ctr\n0::/\n", gcPercent: 400, memoryLimit: "auto", wantPercent: 400, wantLimit: 241591910},
		{name: "own cgroup listed but not visible: the mount point's", file: "memory.max", content: "536870912\n",
			self: "0::/elsewhere\n", gcPercent: 400, memoryLimit: "auto", wantPercent: 400, wantLimit: 483183820},
		{name: "no cgroup controller", gcPercent: 400, memoryLimit: "auto", wantPercent: 100, wantLimit: 0},
		{name: "explicit limit", gcPercent: 400, memoryLimit: "460Mi", wantPercent: 400, wantLimit: 460 << 20,
			wantSource: "memory limit from --memory-limit"},
		{name: "no limit asked", file: "memory.max", content: "536870912", gcPercent: 400, memoryLimit: "0", wantPercent: 100, wantLimit: 0},
		{name: "GOGC wins", file: "memory.max", content: "536870912", gcPercent: 400, memoryLimit: "auto",
			env:         func(k string) (string, bool) { return map[string]string{"GOGC": "150"}[k], k == "GOGC" },
			wantPercent: 150, wantLimit: 483183820, wantSource: "GC percent from GOGC"},
		{name: "GOGC off", gcPercent: 400, memoryLimit: "1Gi",
			env:         func(k string) (string, bool) { return map[string]string{"GOGC": "off"}[k], k == "GOGC" },
			wantPercent: -1, wantLimit: 1 << 30, wantSource: "GC percent from GOGC"},
		{name: "garbage in memory.max", file: "memory.max", content: "lots", gcPercent: 400, memoryLimit: "auto",
			wantErr: `is not a memory limit`},
		{name: "bad quantity", gcPercent: 400, memoryLimit: "half", wantErr: `--memory-limit "half": must be`},
		{name: "negative quantity", gcPercent: 400, memoryLimit: "-1Gi", wantErr: `--memory-limit "-1Gi": must be`},
		{name: "gc percent zero", gcPercent: 0, memoryLimit: "1Gi", wantErr: "--gc-percent 0: must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := tt.env
			if env == nil {
				env = noEnv
			}
			s, err := gcPlan(tt.gcPercent, tt.memoryLimit, env, cgroupView{root: cgroup(t, tt.file, tt.content), self: []byte(tt.self)})
			if !errorAsWanted(t, err, tt.wantErr) {
				return
			}
			if s.GCPercent != tt.wantPercent {
				t.Errorf("GCPercent = %d, want %d (%s)", s.GCPercent, tt.wantPercent, s.Source)
			}
			if s.MemoryLimit != tt.wantLimit {
				t.Errorf("MemoryLimit = %d, want %d (%s)", s.MemoryLimit, tt.wantLimit, s.Source)
			}
			if !strings.Contains(s.Source, tt.wantSource) {
				t.Errorf("Source = %q, want it to contain %q", s.Source, tt.wantSource)
			}
		})
	}
}

// errorAsWanted fails t unless err contains want (want "": err is nil) and
// reports whether the call succeeded, so that its result is worth checking.
func errorAsWanted(t *testing.T, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatal(err)
		}
		return true
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want one containing %q", err, want)
	}
	return false
}

func TestParseFlagsGC(t *testing.T) {
	base := []string{"--tls-cert=c", "--tls-key=k", "--bundle=b", "--insecure-skip-verification"}
	tests := []struct {
		args        []string
		wantErr     string
		wantPercent int
		wantLimit   string
	}{
		{args: nil, wantPercent: DefaultGCPercent, wantLimit: MemoryLimitAuto},
		{args: []string{"--gc-percent=200", "--memory-limit=1Gi"}, wantPercent: 200, wantLimit: "1Gi"},
		{args: []string{"--gc-percent=0"}, wantErr: "--gc-percent 0: must be positive"},
		{args: []string{"--memory-limit=lots"}, wantErr: `--memory-limit "lots": must be "auto", 0 or a positive quantity`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c, err := ParseFlags(append(append([]string{}, base...), tt.args...), io.Discard)
			if !errorAsWanted(t, err, tt.wantErr) {
				return
			}
			if c.GCPercent != tt.wantPercent || c.MemoryLimit != tt.wantLimit {
				t.Errorf("GCPercent, MemoryLimit = %d, %q, want %d, %q", c.GCPercent, c.MemoryLimit, tt.wantPercent, tt.wantLimit)
			}
		})
	}
}

// TestConfigureGCInAMemoryCgroup runs the webhook's collector setup in a
// real memory cgroup of this kernel (v2 or v1) with a 256 MiB limit: it
// must find the limit through /proc/self/cgroup and give the runtime 90%.
func TestConfigureGCInAMemoryCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a memory cgroup")
	}
	const limit = 256 << 20
	var dir, file string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		ctl, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
		if !strings.Contains(string(ctl), "memory") {
			t.Skip("cgroup v2 without the memory controller enabled below the root")
		}
		dir, file = filepath.Join("/sys/fs/cgroup", "bulkhead-gc-test"), "memory.max"
	} else if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		dir, file = filepath.Join("/sys/fs/cgroup/memory", "bulkhead-gc-test"), "memory.limit_in_bytes"
	} else {
		t.Skip("no cgroup memory controller mounted at /sys/fs/cgroup")
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		t.Skip("cannot create a memory cgroup: ", err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The helper moves itself into the cgroup, then becomes this test
	// binary running only TestHelperConfigureGC.
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" -test.run='^TestHelperConfigureGC$' -test.v`,
		"sh", dir, os.Args[0])
	cmd.Env = []string{"BULKHEAD_GC_HELPER=1", "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var got GCSettings
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "gc-settings: "); ok {
			if err := json.Unmarshal([]byte(rest), &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got.MemoryLimit != shareOf(limit) || got.GCPercent != DefaultGCPercent {
		t.Fatalf("in a cgroup limited to %d bytes: %+v, want memory limit %d and GC percent %d\n%s",
			limit, got, shareOf(limit), DefaultGCPercent, out)
	}
}

func TestHelperConfigureGC(t *testing.T) {
	if os.Getenv("BULKHEAD_GC_HELPER") == "" {
		t.Skip("helper process for TestConfigureGCInAMemoryCgroup")
	}
	s, err := ConfigureGC(DefaultGCPercent, MemoryLimitAuto)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(s)
	fmt.Printf("gc-settings: %s\n", raw)
}
