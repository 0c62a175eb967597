package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/internal/atomicfile"
	"os"
	"path/filepath"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdi "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// CDIKind is the CDI kind ("vendor/class") of Bulkhead's GPU devices.
	CDIKind = "bulkhead.dev/gpu"
	// CDIAnnotation is the OCI annotation that names a container's CDI
	// devices, in CDI's own format (key cdi.k8s.io/<plugin>_<device>,
	// value a comma-separated list of qualified device names), so that
	// CDI tooling reading the container's spec finds the devices.
	CDIAnnotation = "cdi.k8s.io/bulkhead.dev_gpu"
)

// CDIName is the fully qualified CDI device name, e.g.
// "bulkhead.dev/gpu=MIG-4f6...". A container runtime with CDI enabled
// injects the device when the name is in its CDI device list.
func CDIName(kind, device string) string { return kind + "=" + device }

func validKind(kind string) error {
	vendor, class := parser.ParseQualifier(kind)
	if vendor == "" {
		return fmt.Errorf("cdi kind %q: want vendor/class (e.g. %s)", kind, CDIKind)
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return fmt.Errorf("cdi kind %q: %w", kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return fmt.Errorf("cdi kind %q: %w", kind, err)
	}
	return nil
}

// CDISpec renders devices (keyed by CDI device name) and the edits every
// container using any of them needs (the control nodes) as a CDI spec.
// Names are checked with CDI's own parser.
func CDISpec(kind string, common Edits, devices map[string]Edits) (*cdi.Spec, error) {
	if err := validKind(kind); err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("cdi spec %s: no devices", kind)
	}
	names := make([]string, 0, len(devices))
	for n, e := range devices {
		if err := parser.ValidateDeviceName(n); err != nil {
			return nil, fmt.Errorf("cdi device name %q: %w", n, err)
		}
		if len(e.Env) == 0 && len(e.Devices) == 0 {
			return nil, fmt.Errorf("cdi device %s: no edits", n)
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

// cdiSpecFile is the file of owner's spec of kind in dir, named as CDI
// names transient specs (<vendor>-<class>_<owner>.json): a spec whose life
// is tied to one owner, here a sandbox.
func cdiSpecFile(dir, kind, owner string) (string, error) {
	if err := validKind(kind); err != nil {
		return "", err
	}
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("cdi spec dir %q: must be an absolute path", dir)
	}
	if owner == "" || owner[0] == '.' || strings.Trim(owner, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != "" {
		return "", fmt.Errorf("cdi spec owner %q: letters, digits, '_', '.' and '-' only, not starting with '.'", owner)
	}
	vendor, class := parser.ParseQualifier(kind)
	return filepath.Join(dir, vendor+"-"+class+"_"+owner+".json"), nil
}

// WriteCDISpec writes owner's spec to dir atomically (CDI readers may scan
// the directory at any time; the temporary file's name is not one they
// read) and returns its path. Writing again replaces it.
func WriteCDISpec(dir, owner string, spec *cdi.Spec) (string, error) {
	path, err := cdiSpecFile(dir, spec.Kind, owner)
	if err != nil {
		return "", err
	}
	if err := cdi.ValidateVersion(spec); err != nil {
		return "", fmt.Errorf("cdi spec %s: %w", spec.Kind, err)
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("cdi spec dir: %w", err)
	}
	return path, atomicfile.Write(path, data, 0o644)
}

// RemoveCDISpec removes owner's spec of kind from dir. Removing a spec
// that does not exist succeeds, so release and GC may repeat it.
func RemoveCDISpec(dir, kind, owner string) error {
	path, err := cdiSpecFile(dir, kind, owner)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cdi spec: %w", err)
	}
	return nil
}

// CDISpecOwners lists the owners of the specs of kind in dir, sorted. A
// directory that does not exist holds none.
func CDISpecOwners(dir, kind string) ([]string, error) {
	if err := validKind(kind); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cdi spec dir: %w", err)
	}
	vendor, class := parser.ParseQualifier(kind)
	prefix := vendor + "-" + class + "_"
	var owners []string
	for _, e := range entries {
		owner, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), prefix), ".json")
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), prefix) || !ok || owner == "" {
			continue
		}
		owners = append(owners, owner)
	}
	sort.Strings(owners)
	return owners, nil
}

// WithCDIDevices names the container's CDI devices in CDIAnnotation,
// replacing whatever the pod author set there.
func WithCDIDevices(names ...string) SpecOpt {
	return func(s *specs.Spec) error {
		if len(names) == 0 {
			return fmt.Errorf("%s: no device names", CDIAnnotation)
		}
		for _, n := range names {
			if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
				return fmt.Errorf("%s: %w", CDIAnnotation, err)
			}
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[CDIAnnotation] = strings.Join(names, ",")
		return nil
	}
}
