package gvisor

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/bulkhead-runtime/bulkhead/runtime/config"
	"github.com/bulkhead-runtime/bulkhead/runtime/cri"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	types "github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/log"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/shim/v1/proc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
	"gvisor.dev/gvisor/pkg/shim/v1/runsccmd"

	"github.com/bulkhead-runtime/bulkhead/internal/version"
	"github.com/bulkhead-runtime/bulkhead/runtime/agentapi"
	bhshim "github.com/bulkhead-runtime/bulkhead/runtime/shim"
)

// RuntimeType is the containerd runtime type that selects this shim
// (binary containerd-shim-bulkhead-v1).
const RuntimeType = "io.containerd.bulkhead.v1"

// optionsFile is the file gVisor's shim library reads from its working
// directory (the sandbox bundle) to learn that grouping is on. Bulkhead
// writes it from its own configuration.
const optionsFile = "config.toml"

// optionsPath is the options file in a sandbox's bundle.
func optionsPath(sandboxBundle string) string { return filepath.Join(sandboxBundle, optionsFile) }

// NewManager returns the shim manager: it starts one shim process per pod
// (keyed by the CRI sandbox id) and cleans up after a shim that died.
func NewManager() shim.Manager { return manager{} }

type manager struct{}

func (manager) Name() string { return RuntimeType }

// Start implements shim.Manager. It runs in a short-lived `start` process in
// the container's bundle directory, and either returns the address of the
// pod's running shim or starts a new one.
func (manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ shim.BootstrapParams, retErr error) {
	cfg, err := config.Load(config.Path())
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	annotations, err := readBundleAnnotations(".")
	if err != nil {
		return shim.BootstrapParams{}, fmt.Errorf("container %s: %w", id, err)
	}
	group := id
	if sid := annotations[cri.AnnotationSandboxID]; sid != "" {
		group = sid
	}

	address, err := shim.SocketAddress(ctx, opts.Address, group, opts.Debug)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	params := shim.BootstrapParams{Version: 2, Address: address, Protocol: "ttrpc"}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return shim.BootstrapParams{}, fmt.Errorf("pod %s: create shim socket: %w", group, err)
		}
		// Another container of this pod: its shim is already serving.
		if shim.CanConnect(address) {
			return params, os.WriteFile("address", []byte(address), 0o644)
		}
		// A socket left by a shim that died.
		if err := shim.RemoveSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("pod %s: remove stale shim socket: %w", group, err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("pod %s: create shim socket: %w", group, err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()

	if err := writeRunscOptions(optionsFile, cfg); err != nil {
		return shim.BootstrapParams{}, err
	}
	if err := os.WriteFile("address", []byte(address), 0o644); err != nil {
		return shim.BootstrapParams{}, err
	}
	f, err := socket.File()
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	defer f.Close()

	cmd, err := daemonCommand(ctx, id, opts)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	if err := cmd.Start(); err != nil {
		return shim.BootstrapParams{}, fmt.Errorf("pod %s: start shim: %w", group, err)
	}
	defer func() {
		if retErr != nil {
			_ = cmd.Process.Kill()
		}
	}()
	go func() { _ = cmd.Wait() }()

	if err := shim.WritePidFile("shim.pid", cmd.Process.Pid); err != nil {
		return shim.BootstrapParams{}, err
	}
	if err := setShimOOMScore(cmd.Process.Pid); err != nil {
		return shim.BootstrapParams{}, err
	}
	return params, nil
}

func daemonCommand(ctx context.Context, id string, opts shim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-address", opts.Address, "-id", id}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// Stop implements shim.Manager. containerd calls it (`shim delete`) for a
// container whose shim is gone: it force-deletes the runsc container,
// unmounts its rootfs and drops Bulkhead's record of a dead sandbox.
func (manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	bundle, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return shim.StopStatus{}, err
	}
	var st runsc.State
	if err := st.Load(bundle); err != nil {
		log.G(ctx).WithError(err).Infof("container %s: no runsc state in bundle", id)
	} else {
		r := proc.NewRunsc(st.Options.Root, bundle, ns, st.Options.BinaryName, st.Options.RunscConfig, nil)
		if err := r.Delete(ctx, id, &runsccmd.DeleteOpts{Force: true}); err != nil {
			log.G(ctx).WithError(err).Infof("container %s: runsc delete", id)
		}
		if err := mount.UnmountAll(st.Rootfs, 0); err != nil {
			log.G(ctx).WithError(err).Infof("container %s: unmount rootfs", id)
		}
	}
	if annotations, err := readBundleAnnotations(bundle); err == nil && annotations[cri.AnnotationContainerType] == cri.ContainerTypeSandbox {
		// The shim died with the sandbox: the agent releases what it held
		// (or, when it cannot be told now, its GC does once it serves).
		if cfg, err := config.Load(config.Path()); err != nil {
			log.G(ctx).WithError(err).Warnf("sandbox %s: no node config to reach the agent for its release", id)
		} else if err := bhshim.Release(ctx, cfg, agentapi.RuntimeGVisor, id); err != nil {
			log.G(ctx).WithError(err).Warnf("sandbox %s: release", id)
		}
	}
	return shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(unix.SIGKILL)}, nil
}

// Info implements shim.Manager.
func (manager) Info(ctx context.Context, _ io.Reader) (*types.RuntimeInfo, error) {
	return &types.RuntimeInfo{
		Name:    RuntimeType,
		Version: &types.RuntimeVersion{Version: version.Version},
	}, nil
}

func readBundleAnnotations(bundle string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("read OCI spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode OCI spec: %w", err)
	}
	return spec.Annotations, nil
}
