package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestNetpolUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no verb", nil, 2, "usage: bulkhead netpol"},
		{"unknown verb", []string{"frobnicate"}, 2, "usage: bulkhead netpol"},
		{"stats without tenant", []string{"stats"}, 2, "usage: bulkhead netpol"},
		{"pin dir off bpffs", []string{"-pin-dir", filepath.Join(t.TempDir(), "x"), "-lock", filepath.Join(t.TempDir(), "l"), "endpoints"}, 1, "not on a bpf filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := netpolMain(tc.args, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}
