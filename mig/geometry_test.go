package mig

import (
	"strings"
	"testing"
)

// Published profile names (NVIDIA MIG user guide) in shape order:
// 1g, 1g+me, 1g double memory, 2g, 3g, 4g, 7g.
var publishedNames = map[string][]string{
	"a100-40gb": {"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
	"a100-80gb": {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"h100":      {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"h200":      {"1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
	"b200":      {"1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"},
}

func TestDerivedNamesMatchPublished(t *testing.T) {
	for model, want := range publishedNames {
		t.Run(model, func(t *testing.T) {
			m, err := Model(model)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Profiles) != len(want) {
				t.Fatalf("%d profiles, want %d", len(m.Profiles), len(want))
			}
			for i, p := range m.Profiles {
				if p.Name != want[i] {
					t.Errorf("profile %d: derived %q, published %q", i, p.Name, want[i])
				}
				got, err := m.Profile(strings.ToUpper("MIG " + want[i]))
				if err != nil || got.Name != want[i] {
					t.Errorf("Profile(%q) = %v, %v", want[i], got, err)
				}
			}
		})
	}
}

// The hardware placement table in memory-slot units (not go-nvml's mock table).
func TestHardwarePlacements(t *testing.T) {
	want := []struct {
		compute, slots, instances int
		starts                    string
	}{
		{1, 1, 7, "[0 1 2 3 4 5 6]"},
		{1, 1, 1, "[0 1 2 3 4 5 6]"},
		{1, 2, 4, "[0 2 4 6]"},
		{2, 2, 3, "[0 2 4]"},
		{3, 4, 2, "[0 4]"},
		{4, 4, 1, "[0]"},
		{7, 8, 1, "[0]"},
	}
	for _, name := range Models() {
		m, _ := Model(name)
		for i, w := range want {
			p := m.Profiles[i]
			got := struct {
				compute, slots, instances int
				starts                    string
			}{p.Compute, p.Slots, p.Instances, fmtInts(p.Starts)}
			if got != w {
				t.Errorf("%s %s: got %+v, want %+v", name, p.Name, got, w)
			}
			for _, s := range p.Starts {
				if s+p.Slots > MemorySlots {
					t.Errorf("%s %s start %d overruns %d slots", name, p.Name, s, MemorySlots)
				}
			}
		}
	}
}

func fmtInts(v []int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, x := range v {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(rune('0' + x)))
	}
	b.WriteByte(']')
	return b.String()
}

func TestModelLookup(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "h200", want: "h200"},
		{in: "H200-141GB", want: "h200"},
		{in: "h100", want: "h100"},
		{in: "a100-40gb", want: "a100-40gb"},
		{in: "a100-80gb", want: "a100-80gb"},
		{in: "b200", want: "b200"},
		{in: "a100", err: `gpu model "a100": unknown`},
		{in: "", err: "unknown"},
	}
	for _, tt := range tests {
		m, err := Model(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Model(%q) error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || m.Name != tt.want {
			t.Errorf("Model(%q) = %v, %v; want %s", tt.in, m, err, tt.want)
		}
	}
}

func TestModelForDevice(t *testing.T) {
	tests := []struct {
		name string
		mib  uint64
		want string
	}{
		{"NVIDIA H200 141GB HBM3e", 144384, "h200"},
		{"NVIDIA H100 80GB HBM3", 81920, "h100"},
		{"NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"},
		{"NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"},
		{"NVIDIA A100-PCIE-80GB", 81920, "a100-80gb"},
		{"NVIDIA B200", 184320, "b200"},
		{"Tesla T4", 15360, ""},
	}
	for _, tt := range tests {
		m, err := ModelForDevice(tt.name, tt.mib)
		if tt.want == "" {
			if err == nil {
				t.Errorf("%s: want error", tt.name)
			}
			continue
		}
		if err != nil || m.Name != tt.want {
			t.Errorf("%s: got %v, %v; want %s", tt.name, m, err, tt.want)
		}
	}
}

func TestProfileUnknown(t *testing.T) {
	m, _ := Model("h200")
	_, err := m.Profile("3g.40gb")
	if err == nil || !strings.Contains(err.Error(), "not a h200 profile") {
		t.Fatalf("error %v", err)
	}
}

func TestSmallest(t *testing.T) {
	m, _ := Model("h200")
	tests := []struct {
		mem, compute int
		media        bool
		want         string
	}{
		{0, 1, false, "1g.18gb"},
		{20, 0, false, "1g.35gb"},
		{35, 2, false, "2g.35gb"},
		{40, 0, false, "3g.71gb"},
		{0, 4, false, "4g.71gb"},
		{100, 0, false, "7g.141gb"},
		{0, 1, true, "1g.18gb+me"},
		{200, 0, false, ""},
	}
	for _, tt := range tests {
		got := m.Smallest(tt.mem, tt.compute, tt.media)
		name := ""
		if len(got) > 0 {
			name = got[0].Name
		}
		if name != tt.want {
			t.Errorf("Smallest(%d,%d,%v) = %q, want %q", tt.mem, tt.compute, tt.media, name, tt.want)
		}
	}
}
