package deploy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/bulkhead-runtime/bulkhead/runtime/config"
)

// The GPU nodes' configuration is config.toml with gpu.toml appended: the
// result is a valid node configuration that differs from every other
// node's only in [mig] (the NVML backend) and [dra] (the kubelet plugin on).
func TestGPUConfigIsTheBaseWithMIGAndDRA(t *testing.T) {
	base, err := os.ReadFile("node/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := os.ReadFile("node/gpu.toml")
	if err != nil {
		t.Fatal(err)
	}
	// Appending is only valid TOML while config.toml leaves both tables
	// to gpu.toml.
	var tables map[string]any
	if err := toml.Unmarshal(base, &tables); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mig", "dra"} {
		if _, ok := tables[name]; ok {
			t.Errorf("node/config.toml defines [%s]: gpu.toml, appended on GPU nodes, owns it", name)
		}
	}
	plain, err := config.Parse(base)
	if err != nil {
		t.Fatalf("config.toml: %v", err)
	}
	onGPU, err := config.Parse([]byte(string(base) + "\n" + string(gpu)))
	if err != nil {
		t.Fatalf("config.toml + gpu.toml: %v", err)
	}
	if onGPU.MIG.Backend != "nvml" || !onGPU.DRA.Enabled || onGPU.MIG.CDISpecDir == "" {
		t.Errorf("GPU node: mig %+v, dra %+v; want backend nvml, a CDI directory and the kubelet plugin on", onGPU.MIG, onGPU.DRA)
	}
	onGPU.MIG, onGPU.DRA = plain.MIG, plain.DRA
	if !reflect.DeepEqual(plain, onGPU) {
		t.Errorf("gpu.toml changes more than [mig] and [dra]:\n%+v\n%+v", plain, onGPU)
	}
}

// The installer gives a node gpu.toml as GPU_NODE says: "auto" where the
// NVIDIA driver is loaded, "true", "false"; a bad value is refused by name.
func TestInstallerChoosesTheGPUConfig(t *testing.T) {
	driver := filepath.Join(t.TempDir(), "version")
	if err := os.WriteFile(driver, []byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(t.TempDir(), "absent")
	for _, tc := range []struct {
		name, gpuNode, driverProc string
		wantGPU                   bool
	}{
		{"auto with the driver loaded", "auto", driver, true},
		{"auto without a driver", "auto", absent, false},
		{"default is auto", "", driver, true},
		{"forced on", "true", absent, true},
		{"forced off", "false", driver, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GPU_NODE", tc.gpuNode)
			t.Setenv("GPU_CONFIG_SRC", "node/gpu.toml")
			t.Setenv("NVIDIA_DRIVER_PROC", tc.driverProc)
			h := newHostRoot(t, "")
			h.run(t, "once")
			got, err := config.Load(filepath.Join(h.dir, "etc/bulkhead/config.toml"))
			if err != nil {
				t.Fatal(err)
			}
			if isGPU := got.MIG.Backend == "nvml" && got.DRA.Enabled; isGPU != tc.wantGPU {
				t.Errorf("mig backend %q, dra %v: GPU configuration %v, want %v", got.MIG.Backend, got.DRA.Enabled, isGPU, tc.wantGPU)
			}
		})
	}
	t.Run("bad value", func(t *testing.T) {
		t.Setenv("GPU_NODE", "yes")
		h := newHostRoot(t, "")
		cmd := h.command(t, "once")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "GPU_NODE=yes: want auto, true or false") {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Join(h.dir, "usr/local/bin/runsc")); err == nil {
			t.Errorf("a refused install copied runsc to the host")
		}
	})
}

// The DaemonSet hands the installer gpu.toml and the auto detection, and
// mounts every directory gpu.toml names at the same path, writable, in the
// agent.
func TestDaemonSetCarriesTheGPUConfig(t *testing.T) {
	tr := loadTree(t)
	ds := mustFind[*appsv1.DaemonSet](t, tr, "bulkhead-node")
	const cmName = "bulkhead-node-config"
	files := tr.generators[cmName].fileKeys()
	if files["gpu.toml"] == "" || files["config.toml"] == "" {
		t.Fatalf("ConfigMap %s is not generated from config.toml and gpu.toml (%v)", cmName, files)
	}
	var install, agent *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		switch c := &ds.Spec.Template.Spec.Containers[i]; c.Name {
		case "install":
			install = c
		case "agent":
			agent = c
		}
	}
	if install == nil || agent == nil {
		t.Fatal("DaemonSet bulkhead-node lacks its install or agent container")
	}
	env := map[string]string{}
	for _, e := range install.Env {
		env[e.Name] = e.Value
	}
	if v := env["GPU_NODE"]; v != "auto" && v != "true" && v != "false" {
		t.Errorf("install container GPU_NODE = %q, want auto, true or false", v)
	}
	if src := env["GPU_CONFIG_SRC"]; src == "" {
		t.Error("install container sets no GPU_CONFIG_SRC")
	} else if name, key := mountedFrom(t, ds.Spec.Template.Spec, *install, src); name != cmName || key != "gpu.toml" {
		t.Errorf("GPU_CONFIG_SRC %s comes from %s/%s, want %s/gpu.toml", src, name, key, cmName)
	}
	var doc []byte
	for _, f := range []string{files["config.toml"], files["gpu.toml"]} {
		b, err := os.ReadFile(filepath.Join("node", f))
		if err != nil {
			t.Fatal(err)
		}
		doc = append(append(doc, b...), '\n')
	}
	gpu, err := config.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{gpu.MIG.CDISpecDir, gpu.DRA.RegistrarDir, gpu.DRA.PluginDir} {
		writable := false
		for _, m := range agent.VolumeMounts {
			if m.MountPath == dir && !m.ReadOnly {
				writable = true
			}
		}
		if !writable {
			t.Errorf("agent container: %s (gpu.toml) is not mounted writable at the same path", dir)
		}
	}
}
