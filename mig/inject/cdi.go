package inject

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"

	cdi "tags.cncf.io/container-device-interface/specs-go"
)

// CDIKind is the CDI kind ("vendor/class") of Bulkhead's GPU devices.
const CDIKind = "bulkhead.dev/gpu"

var (
	cdiKindRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$`)
	cdiDeviceRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9_.:-]*[a-zA-Z0-9])?$`)
)

// CDIName is the fully qualified CDI device name, e.g.
// "bulkhead.dev/gpu=MIG-4f6...". A container runtime with CDI enabled
// injects the device when the name is in its CDI device list.
func CDIName(kind, device string) string { return kind + "=" + device }

// CDISpec renders devices (keyed by CDI device name) and the edits every
// container using any of them needs (the control nodes) as a CDI spec.
func CDISpec(kind string, common Edits, devices map[string]Edits) (*cdi.Spec, error) {
	if !cdiKindRE.MatchString(kind) {
		return nil, fmt.Errorf("cdi kind %q: want vendor/class (e.g. %s)", kind, CDIKind)
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("cdi spec %s: no devices", kind)
	}
	names := make([]string, 0, len(devices))
	for n := range devices {
		if !cdiDeviceRE.MatchString(n) {
			return nil, fmt.Errorf("cdi device name %q: letters, digits, '_', '.', ':' and '-' only, starting and ending alphanumeric", n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	spec := &cdi.Spec{Kind: kind, ContainerEdits: cdiEdits(common)}
	for _, n := range names {
		spec.Devices = append(spec.Devices, cdi.Device{Name: n, ContainerEdits: cdiEdits(devices[n])})
	}
	v, err := cdi.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("cdi spec %s: %w", kind, err)
	}
	spec.Version = v
	return spec, nil
}

func cdiEdits(e Edits) cdi.ContainerEdits {
	out := cdi.ContainerEdits{Env: append([]string(nil), e.Env...)}
	for _, d := range e.Devices {
		mode := d.FileMode
		out.DeviceNodes = append(out.DeviceNodes, &cdi.DeviceNode{
			Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, FileMode: &mode, Permissions: d.Access,
		})
	}
	return out
}

// WriteCDISpec writes spec as JSON to dir/<vendor>-<class>.json atomically
// (CDI readers may scan the directory at any time) and returns the path.
func WriteCDISpec(dir string, spec *cdi.Spec) (string, error) {
	if err := cdi.ValidateVersion(spec); err != nil {
		return "", fmt.Errorf("cdi spec %s: %w", spec.Kind, err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := regexp.MustCompile(`[^a-zA-Z0-9_.-]`).ReplaceAllString(spec.Kind, "-") + ".json"
	path := filepath.Join(dir, name)
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}
