package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestPrivateRoot: a node with PrivateRoot has a real node's paths of its
// own (a file the node writes at /etc/bulkhead is in <Dir>/root, not in the
// host's /etc/bulkhead), its containerd serves on /run/containerd's socket
// with a real node's configuration file, is started again when it is killed
// through its pid file (the installer's restart), and Stop leaves no mount
// point it created on the host, no process and no mount.
func TestPrivateRoot(t *testing.T) {
	bins := BinDirs()
	if err := Requirements(bins); err != nil {
		t.Skipf("node: %v", err)
	}
	for _, bin := range []string{"containerd-shim-runc-v2", "runc", "unshare", "nsenter"} {
		if _, err := lookPath(bin, bins); err != nil {
			t.Skipf("node: needs %s (make tools; util-linux)", bin)
		}
	}
	var created []string
	for _, p := range RootPaths {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			created = append(created, p)
		}
	}
	dir, err := os.MkdirTemp("", "bh-root-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := Start(ctx, Options{Dir: dir, BinDir: bins, Bridge: fmt.Sprintf("bhr%d", os.Getpid()%100000),
		Subnet: fmt.Sprintf("10.197.%d.0/24", os.Getpid()%250), PrivateRoot: true, DefaultRuntime: UpstreamRuncHandler})
	if err != nil {
		t.Fatalf("start node: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			n.Stop(context.Background())
		}
	})

	mapping := []struct{ in, want string }{
		{"/etc/bulkhead/config.toml", filepath.Join(dir, "root/etc/bulkhead/config.toml")},
		{"/var/run/netns/cni-1", filepath.Join(dir, "root/run/netns/cni-1")},
		{"/sys/fs/bpf/bulkhead", filepath.Join(dir, "root/sys/fs/bpf/bulkhead")},
		{"/etc/passwd", "/etc/passwd"},
		{"/etc/bulkheadx", "/etc/bulkheadx"},
	}
	for _, m := range mapping {
		if got := n.HostPath(m.in); got != m.want {
			t.Errorf("HostPath(%q) = %q, want %q", m.in, got, m.want)
		}
	}
	if out, err := n.Command(ctx, "sh", "-c", "echo node >/etc/bulkhead/probe && grep -q '^root = \"/var/lib/containerd\"' /etc/containerd/config.toml").CombinedOutput(); err != nil {
		t.Fatalf("in the node's namespace: %v: %s", err, out)
	}
	if b, err := os.ReadFile(n.HostPath("/etc/bulkhead/probe")); err != nil || string(b) != "node\n" {
		t.Errorf("the node's /etc/bulkhead/probe at %s: %q, %v", n.HostPath("/etc/bulkhead/probe"), b, err)
	}
	if _, err := os.Stat("/etc/bulkhead/probe"); err == nil {
		t.Errorf("the node's file reached the host's /etc/bulkhead")
	}
	if n.Socket != n.HostPath("/run/containerd/containerd.sock") {
		t.Errorf("Socket %s, want the node's /run/containerd/containerd.sock", n.Socket)
	}
	if st, err := os.Stat(n.HostPath("/sys/fs/bpf")); err != nil || !st.IsDir() {
		t.Errorf("the node's bpffs: %v", err)
	}

	// The installer's restart: kill the pid of the pid file.
	b, err := os.ReadFile(n.HostPath("/run/containerd/containerd.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid == 0 {
		t.Fatalf("pid file: %q, %v", b, err)
	}
	if out, err := n.Command(ctx, "sh", "-c", "kill $(cat /run/containerd/containerd.pid)").CombinedOutput(); err != nil {
		t.Fatalf("kill containerd: %v: %s", err, out)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(n.HostPath("/run/containerd/containerd.pid"))
		newPid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		_, verr := n.Runtime.Version(ctx, &cri.VersionRequest{})
		if newPid != 0 && newPid != pid && verr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd not started again after it was killed (pid %d, CRI: %v):\n%s", newPid, verr, n.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(n.Processes()) == 0 {
		t.Errorf("no process in the node's namespace")
	}

	n.Stop(context.Background())
	stopped = true
	if pids := n.Processes(); len(pids) > 0 {
		t.Errorf("processes left in the node's namespace: %v", pids)
	}
	if m := MountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s left", dir)
	}
	for _, p := range created {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("mount point %s, created on the host for the node, left", p)
		}
	}
}

// TestPrivateRootRefuses: what a PrivateRoot node cannot have is refused
// by name before anything is created.
func TestPrivateRootRefuses(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{PrivateRoot: true, PipelineEnabled: true, DefaultRuntime: UpstreamRuncHandler}, "Options.PipelineEnabled"},
		{Options{PrivateRoot: true, ShimConfig: "[x]", DefaultRuntime: UpstreamRuncHandler}, "Options.ShimConfig"},
		{Options{PrivateRoot: true}, "Options.DefaultRuntime"},
	} {
		tc.opts.Dir, tc.opts.Bridge = filepath.Join(t.TempDir(), "node"), "bhx0"
		_, err := Start(context.Background(), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%+v) = %v, want an error naming %s", tc.opts, err, tc.want)
		}
		if _, serr := os.Stat(tc.opts.Dir); serr == nil {
			t.Errorf("Start created %s before refusing", tc.opts.Dir)
		}
	}
}
