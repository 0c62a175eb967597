package specinput

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

// linuxResourcesType ends the type URL containerd gives specs.LinuxResources
// ("types.containerd.io/opencontainers/runtime-spec/1/LinuxResources"); the
// Any's value is its JSON, which runc's and gVisor's task services decode.
const linuxResourcesType = "/LinuxResources"

// DecodeResources reads a task update's resources the way runc's and
// gVisor's task services do: JSON of specs.LinuxResources.
func DecodeResources(a *anypb.Any) (*specs.LinuxResources, error) {
	if a == nil {
		return nil, errors.New("resources: missing (a task update carries the container's linux.resources)")
	}
	if !strings.HasSuffix(a.GetTypeUrl(), linuxResourcesType) {
		return nil, fmt.Errorf("resources: type %q is not the OCI LinuxResources", a.GetTypeUrl())
	}
	var r specs.LinuxResources
	if err := json.Unmarshal(a.GetValue(), &r); err != nil {
		return nil, fmt.Errorf("resources: %w", err)
	}
	return &r, nil
}

// MemoryAfter is a container's memory limit (0: none) once r is applied to
// it while its limit is old. runc and runsc leave a limit that r does not
// set (memory or its limit absent, or 0) as it is, and lift it for a
// negative one (-1: unbounded). On cgroup v2 runc writes r.Unified's files
// last, so a "memory.max" there is the limit whatever memory.limit says:
// a plain byte count is read as one, anything else ("max", a suffix, a
// second line) as none (cgroup v1 refuses unified entries altogether).
func MemoryAfter(old int64, r *specs.LinuxResources) int64 {
	if r == nil {
		return old
	}
	if v, ok := r.Unified[unifiedMemoryMax]; ok {
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && n > 0 {
			return n
		}
		return 0
	}
	switch {
	case r.Memory == nil || r.Memory.Limit == nil || *r.Memory.Limit == 0:
		return old
	case *r.Memory.Limit < 0:
		return 0
	default:
		return *r.Memory.Limit
	}
}

// unifiedMemoryMax is cgroup v2's memory limit file, as a key of
// linux.resources.unified (which CRI's LinuxContainerResources.unified
// fills).
const unifiedMemoryMax = "memory.max"
