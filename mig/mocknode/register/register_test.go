package register_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bulkhead-runtime/bulkhead/mig"
	_ "github.com/bulkhead-runtime/bulkhead/mig/mocknode/register"
)

// Importing the package links "mock" beside the always-linked "nvml".
func TestLinksMock(t *testing.T) {
	if got := mig.Backends(); !slices.Equal(got, []string{"mock", "nvml"}) {
		t.Fatalf("linked backends %v, want [mock nvml]", got)
	}
}

// The mock opened by name: a read-only open creates no state and sees no
// GPUs until a node process has created the node; then it sees the node's.
func TestOpenMock(t *testing.T) {
	state := filepath.Join(t.TempDir(), "gpus.json")
	opts := mig.BackendOptions{MockModel: "h200", MockGPUs: 2, MockState: state}
	ro := opts
	ro.ReadOnly = true
	tests := []struct {
		name      string
		opts      mig.BackendOptions
		gpus      int
		wantErr   string
		wantState bool // the state file exists afterwards
	}{
		{name: "read-only before the node exists", opts: ro, gpus: 0},
		{name: "creates the node", opts: opts, gpus: 2, wantState: true},
		{name: "read-only sees the node", opts: ro, gpus: 2, wantState: true},
		{name: "another shape of the same node", opts: mig.BackendOptions{MockModel: "h100", MockGPUs: 1, MockState: state}, wantErr: "mig.mock_state", wantState: true},
		{name: "no state file", opts: mig.BackendOptions{MockModel: "h200", MockGPUs: 1}, wantErr: "mig.mock_state", wantState: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, gpus, err := mig.OpenBackend("mock", tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), `mig.backend "mock"`) {
					t.Fatalf("open: %v, want an error naming mig.backend and %s", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if len(gpus) != tt.gpus {
				t.Errorf("%d GPUs, want %d", len(gpus), tt.gpus)
			}
			if (b != nil) != (tt.gpus > 0) {
				t.Errorf("backend %v with %d GPUs", b, len(gpus))
			}
			for _, g := range gpus {
				if g.Model != "h200" || g.NoMIG {
					t.Errorf("GPU %+v, want an h200 in MIG mode", g)
				}
			}
			if _, err := os.Stat(state); (err == nil) != tt.wantState {
				t.Errorf("state file after open: %v, want it to exist: %v", err, tt.wantState)
			}
		})
	}
}
