package gvisor

import (
	"encoding/json"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"os"
	"path/filepath"

	"github.com/containerd/typeurl/v2"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/types/known/anypb"
	gvisorrunsc "gvisor.dev/gvisor/pkg/shim/v1/runsc"
	"gvisor.dev/gvisor/pkg/shim/v1/runtimeoptions"
)

// runtimeOptionsTypeURL names gVisor's runtime options when Bulkhead hands
// them to gVisor's task service as JSON. containerd's CRI sends them as
// protobuf under "runtimeoptions.v1.Options", which gVisor's library cannot
// decode in a Go-module build; registering a JSON type under our own URL
// gives typeurl a decoder for the same Go type.
const runtimeOptionsTypeURL = "bulkhead.dev/gvisor/runtimeoptions/v1"

func init() {
	typeurl.Register(&runtimeoptions.Options{}, runtimeOptionsTypeURL)
}

// runscOptions maps Bulkhead's configuration to gVisor's shim options.
func runscOptions(cfg config.Config) gvisorrunsc.Options {
	opts := gvisorrunsc.Options{
		BinaryName:  cfg.RunscPath,
		Root:        cfg.RunscRoot,
		Grouping:    true, // one shim per pod: the pod extension needs it
		RunscConfig: cfg.RunscFlags(),
	}
	if cfg.Debug {
		opts.LogLevel = "debug"
		if cfg.LogDir != "" {
			opts.LogPath = cfg.LogDir + "/"
			opts.RunscConfig["debug"] = "true"
			opts.RunscConfig["debug-log"] = filepath.Join(cfg.LogDir, "%ID%") + "/"
		}
	}
	return opts
}

// encodeRunscOptions renders gVisor's options as the TOML its library reads.
func encodeRunscOptions(cfg config.Config) ([]byte, error) {
	data, err := toml.Marshal(runscOptions(cfg))
	if err != nil {
		return nil, fmt.Errorf("encode runsc options: %w", err)
	}
	return data, nil
}

// writeRunscOptions writes gVisor's options file at path.
func writeRunscOptions(path string, cfg config.Config) error {
	data, err := encodeRunscOptions(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// containerOptions returns the task options that point gVisor's task service
// at the options file written for a sandbox.
func containerOptions(configPath string) (*anypb.Any, error) {
	value, err := json.Marshal(&runtimeoptions.Options{ConfigPath: configPath})
	if err != nil {
		return nil, err
	}
	return &anypb.Any{TypeUrl: runtimeOptionsTypeURL, Value: value}, nil
}
