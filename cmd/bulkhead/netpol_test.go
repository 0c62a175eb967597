package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNetpolUsage(t *testing.T) {
	offBPFFS := t.TempDir() // holds a file named like the fence's first map
	if err := os.WriteFile(filepath.Join(offBPFFS, "endpoints"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no verb", nil, 2, "usage: bulkhead netpol"},
		{"unknown verb", []string{"frobnicate"}, 2, "usage: bulkhead netpol"},
		{"stats without tenant", []string{"stats"}, 2, "usage: bulkhead netpol"},
		{"no fence", []string{"-pin-dir", filepath.Join(t.TempDir(), "x"), "endpoints"}, 1, "no fence on this node"},
		{"pin dir off bpffs", []string{"-pin-dir", offBPFFS, "endpoints"}, 1, "-pin-dir " + offBPFFS + " is not on a bpf filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := netpolMain(tc.args, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}
