package deploy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	srvconfig "github.com/containerd/containerd/v2/cmd/containerd/server/config"
)

// Existing host configurations the installer must extend without losing
// anything: containerd 2.x (version 3) and 1.x (version 2) files, with and
// without imports, and no file at all.
var hostConfigs = []struct {
	name    string
	version int
	config  string // "" means no /etc/containerd/config.toml
	cri     string // the CRI runtime plugin's name for this version
}{
	{name: "v3 with runc", version: 3, cri: "io.containerd.cri.v1.runtime", config: `version = 3

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dir = "/opt/cni/bin"
`},
	{name: "v3 with empty imports", version: 3, cri: "io.containerd.cri.v1.runtime", config: `version = 3
imports = []

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`},
	{name: "v3 with other imports", version: 3, cri: "io.containerd.cri.v1.runtime", config: `version = 3
imports = [
  "/etc/containerd/other.toml",
]

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`},
	{name: "v2 with runc", version: 2, cri: "io.containerd.grpc.v1.cri", config: `version = 2

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
`},
	{name: "no config file", version: 3, cri: "io.containerd.cri.v1.runtime"},
}

// hostRoot prepares a fake host root: the image's binaries, the mounted
// ConfigMaps and the host's containerd config.
type hostRoot struct {
	dir, src, restarts string
}

func newHostRoot(t *testing.T, config string) hostRoot {
	t.Helper()
	h := hostRoot{dir: t.TempDir(), src: t.TempDir()}
	h.restarts = filepath.Join(h.src, "restarts")
	write := func(path, content string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(h.src, "bin/containerd-shim-bulkhead-v1"), "#!/bin/true shim\n")
	write(filepath.Join(h.src, "bin/runsc"), "#!/bin/true runsc\n")
	write(filepath.Join(h.src, "bin/containerd-shim-bulkhead-runc-v1"), "#!/bin/true runc shim\n")
	write(filepath.Join(h.src, "bin/runc"), "#!/bin/true runc\n")
	write(filepath.Join(h.src, "policy/bundle.tar.gz"), "bundle v1")
	// The key comes from its own ConfigMap's mount (POLICY_KEY_SRC); a
	// bundle.pem beside the bundle, as releases before the split shipped
	// it, is never installed.
	write(filepath.Join(h.src, "policy/bundle.pem"), "a key from the bundle's ConfigMap")
	write(filepath.Join(h.src, "policy-key/bundle.pem"), "key")
	if config != "" {
		write(filepath.Join(h.dir, "etc/containerd/config.toml"), config)
	}
	return h
}

// run runs install.sh in mode against the fake host.
func (h hostRoot) run(t *testing.T, mode string) string {
	t.Helper()
	out, err := h.command(t, mode).CombinedOutput()
	if err != nil {
		t.Fatalf("install.sh %s: %v\n%s", mode, err, out)
	}
	return string(out)
}

// command is install.sh in mode against the fake host, not started.
func (h hostRoot) command(t *testing.T, mode string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh on PATH")
	}
	cmd := exec.Command("sh", "node/install.sh", mode)
	cmd.Env = append(os.Environ(),
		"HOST_ROOT="+h.dir,
		"BIN_SRC="+filepath.Join(h.src, "bin"),
		"CONFIG_SRC=node/config.toml",
		"POLICY_SRC="+filepath.Join(h.src, "policy"),
		"POLICY_KEY_SRC="+filepath.Join(h.src, "policy-key"),
		"RESTART_CONTAINERD=echo restart >> "+h.restarts,
		"CONTAINERD_VERSION_CMD=echo containerd github.com/containerd/containerd/v2 v2.1.5",
		"READY_FILE="+filepath.Join(h.src, "ready"),
	)
	return cmd
}

func (h hostRoot) restartCount(t *testing.T) int {
	b, err := os.ReadFile(h.restarts)
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "restart")
}

// load reads the host's containerd config with containerd's own loader,
// following imports inside the fake root.
func (h hostRoot) load(t *testing.T) *srvconfig.Config {
	t.Helper()
	main := filepath.Join(h.dir, "etc/containerd/config.toml")
	b, err := os.ReadFile(main)
	if err != nil {
		t.Fatal(err)
	}
	// Imports name host paths; point them into the fake root.
	rooted := strings.ReplaceAll(string(b), `"/etc/containerd/`, `"`+h.dir+`/etc/containerd/`)
	copyPath := filepath.Join(h.src, "config.rooted.toml")
	if err := os.WriteFile(copyPath, []byte(rooted), 0o644); err != nil {
		t.Fatal(err)
	}
	// Imports that do not exist in the fake root are skipped by containerd
	// only for globs; create the other one the test config names.
	if err := os.WriteFile(filepath.Join(h.dir, "etc/containerd/other.toml"), []byte("version = 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfg srvconfig.Config
	if err := srvconfig.LoadConfig(context.Background(), copyPath, &cfg); err != nil {
		t.Fatalf("containerd cannot load the config:\n%s\n%v", rooted, err)
	}
	return &cfg
}

// lookup walks nested TOML tables.
func lookup(v any, path ...string) (any, bool) {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

// TestInstallerRegistersRuntime runs the DaemonSet's installer against each
// host configuration and loads the result with containerd's config loader.
func TestInstallerRegistersRuntime(t *testing.T) {
	for _, hc := range hostConfigs {
		t.Run(hc.name, func(t *testing.T) {
			h := newHostRoot(t, hc.config)
			h.run(t, "once")

			cfg := h.load(t)
			if cfg.Version != hc.version {
				t.Errorf("config version %d, want %d", cfg.Version, hc.version)
			}
			cri := cfg.Plugins[hc.cri]
			checks := []struct {
				path []string
				want any
			}{
				{[]string{"restrict_oom_score_adj"}, true},
				{[]string{"containerd", "runtimes", "bulkhead", "runtime_type"}, "io.containerd.bulkhead.v1"},
				{[]string{"containerd", "runtimes", "bulkhead", "runtime_path"}, "/usr/local/bin/containerd-shim-bulkhead-v1"},
				{[]string{"containerd", "runtimes", "bulkhead-runc", "runtime_type"}, "io.containerd.bulkhead-runc.v1"},
				{[]string{"containerd", "runtimes", "bulkhead-runc", "runtime_path"}, "/usr/local/bin/containerd-shim-bulkhead-runc-v1"},
			}
			if hc.config != "" {
				// What the host had survives the merge.
				checks = append(checks, struct {
					path []string
					want any
				}{[]string{"containerd", "runtimes", "runc", "runtime_type"}, "io.containerd.runc.v2"})
			}
			for _, c := range checks {
				got, ok := lookup(cri, c.path...)
				if !ok || fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Errorf("plugins.%q.%s = %v (set %v), want %v", hc.cri, strings.Join(c.path, "."), got, ok, c.want)
				}
			}
			if ann, _ := lookup(cri, "containerd", "runtimes", "bulkhead", "pod_annotations"); !strings.Contains(fmt.Sprint(ann), "bulkhead.dev/*") {
				t.Errorf("pod_annotations = %v: the shim needs the bulkhead.dev/ annotations", ann)
			}
			for _, f := range []string{"usr/local/bin/containerd-shim-bulkhead-v1", "usr/local/bin/runsc", "usr/local/bin/containerd-shim-bulkhead-runc-v1", "usr/local/bin/bulkhead-runc", "etc/bulkhead/config.toml", "etc/bulkhead/bundle.tar.gz", "etc/bulkhead/keys/bundle.pem"} {
				if _, err := os.Stat(filepath.Join(h.dir, f)); err != nil {
					t.Errorf("not installed: %v", err)
				}
			}
			if b, err := os.ReadFile(filepath.Join(h.dir, "etc/bulkhead/keys/bundle.pem")); err != nil || string(b) != "key" {
				t.Errorf("installed key %q (%v), want POLICY_KEY_SRC's, never the bundle's ConfigMap's", b, err)
			}
			if fi, err := os.Stat(filepath.Join(h.dir, "usr/local/bin/runsc")); err == nil && fi.Mode().Perm()&0o111 == 0 {
				t.Errorf("runsc installed without execute permission: %v", fi.Mode())
			}
			if n := h.restartCount(t); n != 1 {
				t.Errorf("containerd restarted %d times on first install, want 1", n)
			}

			// Idempotent: a second run (pod restart) changes nothing and
			// does not restart containerd.
			h.run(t, "once")
			if n := h.restartCount(t); n != 1 {
				t.Errorf("containerd restarted again on an unchanged config (%d restarts)", n)
			}
			b, _ := os.ReadFile(filepath.Join(h.dir, "etc/containerd/config.toml"))
			if n := strings.Count(string(b), "conf.d/bulkhead.toml"); n != 1 {
				t.Errorf("main config imports the drop-in %d times:\n%s", n, b)
			}

			// Uninstall leaves a config containerd loads, without the runtime.
			h.run(t, "uninstall")
			cfg = h.load(t)
			for _, rt := range []string{"bulkhead", "bulkhead-runc"} {
				if _, ok := lookup(cfg.Plugins[hc.cri], "containerd", "runtimes", rt); ok {
					t.Errorf("runtime %s still configured after uninstall", rt)
				}
			}
			if hc.config != "" {
				if _, ok := lookup(cfg.Plugins[hc.cri], "containerd", "runtimes", "runc"); !ok {
					t.Error("uninstall lost the host's runc runtime")
				}
			}
			for _, f := range []string{"containerd-shim-bulkhead-v1", "containerd-shim-bulkhead-runc-v1", "bulkhead-runc", "runsc"} {
				if _, err := os.Stat(filepath.Join(h.dir, "usr/local/bin", f)); !os.IsNotExist(err) {
					t.Errorf("%s left after uninstall: %v", f, err)
				}
			}
			if _, err := os.Stat(filepath.Join(h.dir, "etc/bulkhead")); !os.IsNotExist(err) {
				t.Errorf("/etc/bulkhead left after uninstall: %v", err)
			}
			// The marker the agent's readiness probe passes on while the
			// rollout of remove goes on; a new install takes it away.
			marker := filepath.Join(h.dir, "run/bulkhead/removed")
			if _, err := os.Stat(marker); err != nil {
				t.Errorf("no /run/bulkhead/removed after uninstall: %v", err)
			}
			h.run(t, "once")
			if _, err := os.Stat(marker); !os.IsNotExist(err) {
				t.Errorf("/run/bulkhead/removed left by a new install: %v", err)
			}
		})
	}
}

// TestUninstallKeepsAMountPoint: on a node whose /etc/bulkhead is a mount
// point, uninstall removes its files, keeps the directory and goes on to
// restart containerd (it used to stop at rm's "Device or resource busy").
func TestUninstallKeepsAMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind-mount /etc/bulkhead")
	}
	h := newHostRoot(t, "")
	h.run(t, "once")
	etc := filepath.Join(h.dir, "etc/bulkhead")
	src := t.TempDir()
	if err := os.CopyFS(src, os.DirFS(etc)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(src, etc, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("cannot bind-mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(etc, unix.MNT_DETACH) })
	before := h.restartCount(t)
	h.run(t, "uninstall")
	entries, err := os.ReadDir(etc)
	if err != nil {
		t.Fatalf("the mount point went: %v", err)
	}
	if len(entries) != 0 {
		t.Errorf("files left in the mounted /etc/bulkhead: %v", entries)
	}
	if n := h.restartCount(t); n != before+1 {
		t.Errorf("containerd restarted %d times by uninstall, want 1", n-before)
	}
}
