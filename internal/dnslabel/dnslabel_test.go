package dnslabel

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		want string // "" = a label
	}{
		{"agents", ""},
		{"a", ""},
		{"0", ""},
		{"team-42", ""},
		{"kube-system", ""},
		{strings.Repeat("a", 63), ""},
		{"", "empty"},
		{strings.Repeat("a", 64), "64 bytes"},
		{"agents\x00", `holds "\x00" at byte 6`},
		{"\x00agents", `holds "\x00" at byte 0`},
		{"Agents", `holds "A" at byte 0`},
		{"a_b", `holds "_" at byte 1`},
		{"a.b", `holds "." at byte 1`},
		{"a b", `holds " " at byte 1`},
		{"agents\n", `holds "\n"`},
		{"ägents", `holds "\xc3" at byte 0`},
		{"-agents", "starts or ends with '-'"},
		{"agents-", "starts or ends with '-'"},
		{"-", "starts or ends with '-'"},
	} {
		err := Check(tc.name)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Check(%q) = %v, want a label", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Check(%q) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func FuzzCheck(f *testing.F) {
	f.Add("agents")
	f.Add("agents\x00")
	f.Fuzz(func(t *testing.T, name string) {
		if Check(name) != nil {
			return
		}
		// A label is its own lowercase, printable and never holds NUL.
		if len(name) == 0 || len(name) > MaxLen || strings.ToLower(name) != name || strings.ContainsAny(name, "\x00._ /") {
			t.Fatalf("Check accepted %q", name)
		}
	})
}
