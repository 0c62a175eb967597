package admission

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The webhook's garbage collector settings. A review allocates tens of
// kilobytes (TLS records, the decoded object, the policy's values) and the
// live heap is small, so with Go's default (collect when the heap doubles)
// the collector runs every few hundred reviews and costs about a third of
// the CPU at full load. The webhook runs in a container with a memory
// limit, so it trades memory it is allowed for CPU: the heap may grow to
// GCPercent over the live heap, and the runtime's soft memory limit (a
// share of the container's limit) makes it collect earlier when that
// would approach the limit. Without a limit Go's defaults stay.
const (
	// DefaultGCPercent is the heap growth allowed when a memory limit is
	// in force (Go's default is 100).
	DefaultGCPercent = 400
	// MemoryLimitShare is the share of the container's memory limit given
	// to the Go runtime as its soft limit; the rest is for memory the
	// runtime does not count (thread stacks outside the heap, the page
	// cache of the bundle) and for the time the collector needs to react.
	MemoryLimitShare = 0.9
	// MemoryLimitAuto asks for MemoryLimitShare of the cgroup's limit.
	MemoryLimitAuto = "auto"
)

// cgroupView is where this process's cgroup is: the cgroup file system's
// mount point and the content of /proc/self/cgroup (nil when unreadable).
type cgroupView struct {
	root string
	self []byte
}

// memoryFiles are the files that may hold the process's memory limit, most
// specific first: its own cgroup's (v2 "0::<path>", v1 "<n>:memory:<path>"
// in /proc/self/cgroup), then the mount point's, which is the container's
// own cgroup when it has a cgroup namespace.
func (c cgroupView) memoryFiles() []string {
	var v2, v1 []string
	for _, line := range strings.Split(string(c.self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = append(v2, filepath.Join(c.root, parts[2], "memory.max"))
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1 = append(v1, filepath.Join(c.root, "memory", parts[2], "memory.limit_in_bytes"))
		}
	}
	v2 = append(v2, filepath.Join(c.root, "memory.max"))
	v1 = append(v1, filepath.Join(c.root, "memory", "memory.limit_in_bytes"))
	return append(v2, v1...)
}

// GCSettings is what ConfigureGC decided; it is logged at start.
type GCSettings struct {
	// GCPercent is the collector's target heap growth in percent.
	GCPercent int
	// MemoryLimit is the soft memory limit in bytes; 0 means none.
	MemoryLimit int64
	// Source says where each value came from.
	Source string
}

// gcPlan works out the settings without changing them. env is the process
// environment lookup, cg where to find the process's cgroup.
func gcPlan(gcPercent int, memoryLimit string, env func(string) (string, bool), cg cgroupView) (GCSettings, error) {
	var s GCSettings
	var sources []string
	// The Go runtime's own variables win: an operator who sets them has
	// decided.
	if v, ok := env("GOMEMLIMIT"); ok && v != "" {
		sources = append(sources, "memory limit from GOMEMLIMIT")
		s.MemoryLimit = debug.SetMemoryLimit(-1)
		if s.MemoryLimit == math.MaxInt64 {
			s.MemoryLimit = 0
		}
	} else {
		limit, auto, err := parseMemoryLimit(memoryLimit)
		switch {
		case err != nil:
			return s, err
		case auto:
			limit, err := cgroupMemoryLimit(cg)
			if err != nil {
				return s, fmt.Errorf("--memory-limit auto: %w", err)
			}
			if limit > 0 {
				s.MemoryLimit = shareOf(limit)
				sources = append(sources, fmt.Sprintf("memory limit %.0f%% of the cgroup's %d bytes", MemoryLimitShare*100, limit))
			} else {
				sources = append(sources, "no memory limit (the cgroup has none)")
			}
		case limit == 0:
			sources = append(sources, "no memory limit (--memory-limit 0)")
		default:
			s.MemoryLimit = limit
			sources = append(sources, "memory limit from --memory-limit")
		}
	}
	switch v, ok := env("GOGC"); {
	case ok && v != "":
		s.GCPercent = gogcPercent(v)
		sources = append(sources, "GC percent from GOGC")
	case gcPercent <= 0:
		return s, fmt.Errorf("--gc-percent %d: must be positive", gcPercent)
	case s.MemoryLimit == 0:
		// Growing the heap fourfold with nothing to stop it is not this
		// process's decision to make.
		s.GCPercent = 100
		sources = append(sources, "GC percent 100 (Go's default: no memory limit to bound a larger heap)")
	default:
		s.GCPercent = gcPercent
		sources = append(sources, "GC percent from --gc-percent")
	}
	s.Source = strings.Join(sources, "; ")
	return s, nil
}

// gogcPercent is the GC percent the Go runtime takes from GOGC: "off" is
// -1, anything else not a number is Go's default.
func gogcPercent(v string) int {
	if v == "off" {
		return -1
	}
	if n, err := strconv.Atoi(v); err == nil {
		return n
	}
	return 100
}

// shareOf is the soft limit for a container limit of limit bytes.
func shareOf(limit int64) int64 { return int64(float64(limit) * MemoryLimitShare) }

// parseMemoryLimit reads --memory-limit: "auto", "0" (none) or a positive
// quantity.
func parseMemoryLimit(v string) (limit int64, auto bool, err error) {
	switch v = strings.TrimSpace(v); v {
	case MemoryLimitAuto:
		return 0, true, nil
	case "", "0":
		return 0, false, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return 0, false, fmt.Errorf("--memory-limit %q: must be %q, 0 or a positive quantity such as 460Mi", v, MemoryLimitAuto)
	}
	return q.Value(), false, nil
}

// ConfigureGC applies the collector settings for the webhook process (see
// the constants above) and returns them. It changes process-wide runtime
// settings: call it once, from main.
func ConfigureGC(gcPercent int, memoryLimit string) (GCSettings, error) {
	self, _ := os.ReadFile("/proc/self/cgroup")
	s, err := gcPlan(gcPercent, memoryLimit, os.LookupEnv, cgroupView{root: "/sys/fs/cgroup", self: self})
	if err != nil {
		return s, err
	}
	applyGC(s)
	return s, nil
}

func applyGC(s GCSettings) {
	debug.SetGCPercent(s.GCPercent)
	if s.MemoryLimit > 0 {
		debug.SetMemoryLimit(s.MemoryLimit)
	}
}

// cgroupMemoryLimit is the memory limit of this process's cgroup in bytes,
// 0 when it has none (v2 "max", v1's page-rounded maximum) or when no
// cgroup memory controller is mounted.
func cgroupMemoryLimit(cg cgroupView) (int64, error) {
	for _, name := range cg.memoryFiles() {
		raw, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		v := strings.TrimSpace(string(raw))
		if v == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s: %q is not a memory limit", name, v)
		}
		// cgroup v1 reports "no limit" as the largest page-aligned int64.
		if n >= math.MaxInt64/2 {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}
