package gvisor

import (
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"strings"
	"testing"
)

func TestRunscOptionsRoundTrip(t *testing.T) {
	cfg, err := config.Parse([]byte("[pipeline]\nenabled=false\nbenchmark_baseline=true\n[runsc]\nextra_flags=[\"overlay2=none\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	data, err := encodeRunscOptions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"grouping = true", "binary_name = '/usr/local/bin/runsc'", "root = '/run/bulkhead/runsc'", "overlay2 = 'none'", "platform = 'systrap'"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("gVisor options lack %q:\n%s", want, data)
		}
	}
	// The task options gVisor receives decode back to the file's path.
	anyOpts, err := containerOptions("/run/k8s/bundles/x/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if anyOpts.TypeUrl != runtimeOptionsTypeURL || !strings.Contains(string(anyOpts.Value), "/run/k8s/bundles/x/config.toml") {
		t.Errorf("task options = %s %s", anyOpts.TypeUrl, anyOpts.Value)
	}
}
