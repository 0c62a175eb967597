package specinput

import (
	"github.com/bulkhead-runtime/bulkhead/runtime/specinput/specinputtest"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/types/known/anypb"
)

const gi = int64(1) << 30

func TestMemoryAfter(t *testing.T) {
	limit := func(v int64) *specs.LinuxResources {
		return &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &v}}
	}
	tests := []struct {
		name string
		old  int64
		r    *specs.LinuxResources
		want int64
	}{
		{name: "raise", old: 2 * gi, r: limit(6 * gi), want: 6 * gi},
		{name: "lower", old: 2 * gi, r: limit(gi), want: gi},
		{name: "set on an unbounded container", old: 0, r: limit(gi), want: gi},
		{name: "lift (-1)", old: 2 * gi, r: limit(-1), want: 0},
		{name: "lift (any negative)", old: 2 * gi, r: limit(-5), want: 0},
		{name: "0 leaves the limit", old: 2 * gi, r: limit(0), want: 2 * gi},
		{name: "no limit leaves it", old: 2 * gi, r: &specs.LinuxResources{Memory: &specs.LinuxMemory{}}, want: 2 * gi},
		{name: "CPU only leaves it", old: 2 * gi, r: &specs.LinuxResources{CPU: &specs.LinuxCPU{}}, want: 2 * gi},
		{name: "CPU only leaves none", old: 0, r: &specs.LinuxResources{CPU: &specs.LinuxCPU{}}, want: 0},
		{name: "unified memory.max lifts past memory.limit", old: 2 * gi, r: withUnified(limit(2*gi), "max"), want: 0},
		{name: "unified memory.max bytes", old: 2 * gi, r: withUnified(limit(2*gi), "4294967296"), want: 4 * gi},
		{name: "unified memory.max alone", old: 2 * gi, r: withUnified(&specs.LinuxResources{}, "1073741824\n"), want: gi},
		{name: "unified memory.max with a suffix is none", old: 2 * gi, r: withUnified(nil, "1G"), want: 0},
		{name: "unified memory.max on two lines is none", old: 2 * gi, r: withUnified(nil, "1073741824\nmax"), want: 0},
		{name: "unified without memory.max", old: 2 * gi, r: &specs.LinuxResources{Unified: map[string]string{"memory.high": "max"}}, want: 2 * gi},
	}
	for _, tt := range tests {
		if got := MemoryAfter(tt.old, tt.r); got != tt.want {
			t.Errorf("%s: MemoryAfter(%d) = %d, want %d", tt.name, tt.old, got, tt.want)
		}
	}
}

// withUnified is r (or empty resources) with unified memory.max set to v.
func withUnified(r *specs.LinuxResources, v string) *specs.LinuxResources {
	if r == nil {
		r = &specs.LinuxResources{}
	}
	r.Unified = map[string]string{"memory.max": v}
	return r
}

func TestDecodeResources(t *testing.T) {
	good := specinputtest.ResourcesAny(t, specinputtest.MemoryResources(gi))
	if r, err := DecodeResources(good); err != nil || *r.Memory.Limit != gi {
		t.Fatalf("DecodeResources(1Gi) = %+v, %v", r, err)
	}
	for _, tt := range []struct {
		name string
		a    *anypb.Any
		want string
	}{
		{"missing", nil, "resources: missing"},
		{"windows", &anypb.Any{TypeUrl: "types.containerd.io/opencontainers/runtime-spec/1/WindowsResources", Value: good.Value}, "WindowsResources"},
		{"not json", &anypb.Any{TypeUrl: good.TypeUrl, Value: []byte("\x0a\x01")}, "resources: invalid character"},
		{"limit not a number", &anypb.Any{TypeUrl: good.TypeUrl, Value: []byte(`{"memory":{"limit":"64Gi"}}`)}, "resources: json: cannot unmarshal string"},
	} {
		if _, err := DecodeResources(tt.a); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: DecodeResources = %v, want an error with %q", tt.name, err, tt.want)
		}
	}
}
