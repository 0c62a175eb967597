package fspath

import "testing"

func TestUnder(t *testing.T) {
	for _, tc := range []struct {
		p, root string
		want    bool
	}{
		{"/a/b", "/a", true},
		{"/a", "/a", true},
		{"/ab", "/a", false},
		{"/a", "/a/b", false},
		{"/x", "/", true},
	} {
		if got := Under(tc.p, tc.root); got != tc.want {
			t.Errorf("Under(%q, %q) = %v, want %v", tc.p, tc.root, got, tc.want)
		}
	}
}
