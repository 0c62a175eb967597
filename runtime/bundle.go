package runtime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
)

// encodeSpec is the spec as Bulkhead would write it, to compare before and
// after a change.
func encodeSpec(spec *specs.Spec) ([]byte, error) { return json.Marshal(spec) }

// writeSpecIfChanged rewrites the bundle's config.json when spec no longer
// encodes to read: a rewrite goes through our copy of the spec types and
// must not happen for nothing.
func writeSpecIfChanged(bundle string, read []byte, spec *specs.Spec) error {
	now, err := encodeSpec(spec)
	if err != nil {
		return err
	}
	if bytes.Equal(read, now) {
		return nil
	}
	return atomicfile.Write(filepath.Join(bundle, "config.json"), now, 0o644)
}

func readSpec(bundle string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode OCI spec: %w", err)
	}
	if spec.Annotations == nil {
		spec.Annotations = map[string]string{}
	}
	return &spec, nil
}
