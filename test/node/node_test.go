package node

import (
	"bytes"
	"maps"
	"testing"

	"github.com/pelletier/go-toml/v2"
	gvisorrunsc "gvisor.dev/gvisor/pkg/shim/v1/runsc"
)

// TestUpstreamRunscOptionsDecode: the options file of gVisor's own shim
// decodes into gVisor's own options type with no key left over (gVisor's
// decoder would drop a misspelt key without a word), and carries the runsc,
// the root and the flags Bulkhead's gVisor pods get.
func TestUpstreamRunscOptionsDecode(t *testing.T) {
	data := upstreamRunscOptions("/tools/runsc", "/node/upstream-runsc")
	var opts gvisorrunsc.Options
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&opts); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	if opts.BinaryName != "/tools/runsc" || opts.Root != "/node/upstream-runsc" {
		t.Errorf("binary_name %q, root %q: want the node's runsc and root", opts.BinaryName, opts.Root)
	}
	want := map[string]string{"platform": runscPlatform, "network": runscNetwork}
	if !maps.Equal(opts.RunscConfig, want) {
		t.Errorf("runsc_config = %v, want %v", opts.RunscConfig, want)
	}
}
