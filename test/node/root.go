package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RootPaths are the host paths a real node's Bulkhead, containerd and
// kubelet use (deploy/node's DaemonSet mounts them, its installer writes
// them), which a node with Options.PrivateRoot has of its own: inside the
// node's mount namespace each is a bind mount of <Dir>/root<path>, and
// /sys/fs/bpf is a bpffs of the node's own. Everything else of the host is
// shared, as on any machine. /var/run is /run's link on the host, so
// /var/run/cdi and /var/run/netns are /run/cdi and /run/netns.
var RootPaths = []string{
	"/etc/bulkhead", "/etc/containerd", "/usr/local/bin",
	"/run/bulkhead", "/run/containerd", "/run/netns", "/run/cdi",
	"/var/lib/bulkhead", "/var/lib/containerd", "/var/lib/kubelet",
	"/sys/fs/bpf",
}

// hostMountPoints are the RootPaths the host lacked (a bind mount needs its
// mount point), which nodes create and the last node on the host removes.
// Nodes of this process are counted in refs; processes (go test runs
// test/node's and test/cluster's packages at once) share a lock file: each
// holds it shared while it has nodes, and the one that then gets it
// exclusively removes every path the file lists. Removing a directory that
// is a mount point in another process's node namespace would detach that
// node's mount.
var hostMountPoints = struct {
	sync.Mutex
	// refs counts this process's running nodes.
	refs int
	// lock is the lock file, held shared while refs > 0.
	lock *os.File
}{}

// mountPointsLock is the lock file; it lists the mount points nodes made,
// one a line.
const mountPointsLock = "/run/bulkhead-test-node-mountpoints"

// acquireMountPoints creates the RootPaths the host lacks, recording them
// in the lock file, and counts a node of this process.
func acquireMountPoints() (retErr error) {
	hostMountPoints.Lock()
	defer hostMountPoints.Unlock()
	if hostMountPoints.refs > 0 {
		hostMountPoints.refs++
		return nil
	}
	f, err := lockMountPoints()
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			f.Close()
		}
	}()
	for _, p := range RootPaths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if _, err := fmt.Fprintln(f, p); err != nil {
			return err
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		return fmt.Errorf("lock %s: %w", mountPointsLock, err)
	}
	hostMountPoints.lock = f
	hostMountPoints.refs = 1
	return nil
}

// lockMountPoints opens the lock file and locks it exclusively. A file
// that the last node removed while this one waited is not the lock any
// more: it opens the path again.
func lockMountPoints() (*os.File, error) {
	for {
		f, err := os.OpenFile(mountPointsLock, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", mountPointsLock, err)
		}
		held, err1 := f.Stat()
		named, err2 := os.Stat(mountPointsLock)
		if err1 == nil && err2 == nil && os.SameFile(held, named) {
			return f, nil
		}
		f.Close()
	}
}

// releaseMountPoints uncounts a node of this process; the last one, when no
// other process holds the lock, removes the recorded mount points (only
// empty ones: on the host they are, the nodes' files are in their roots).
func releaseMountPoints() {
	hostMountPoints.Lock()
	defer hostMountPoints.Unlock()
	hostMountPoints.refs--
	if hostMountPoints.refs > 0 {
		return
	}
	f := hostMountPoints.lock
	hostMountPoints.lock = nil
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return // another process's nodes run: the last of them removes
	}
	b, _ := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	lines := strings.Fields(string(b))
	for i := len(lines) - 1; i >= 0; i-- {
		_ = os.Remove(lines[i])
	}
	_ = os.Remove(mountPointsLock)
}

// root is the mount namespace of a node with Options.PrivateRoot.
type root struct {
	// dir is <Dir>/root: the host's view of the node's RootPaths.
	dir string
	// holder is the process that keeps the namespace: every process of
	// the node enters it through holder's pid. It exits when hold is
	// closed (Stop, or this process's death).
	holder *exec.Cmd
	hold   io.WriteCloser
	// mntNS is the namespace's /proc/PID/ns/mnt link.
	mntNS string
	// counted: the node is counted in hostMountPoints.
	counted bool
}

// startRoot creates the node's directories, its bpffs and its mount
// namespace, in which each of RootPaths is the node's own, and makes every
// mount of the namespace shared: the kubelet's HostToContainer and
// Bidirectional volumes (the DaemonSet's /run/netns, /sys/fs/bpf) need it.
func startRoot(dir string) (_ *root, retErr error) {
	r := &root{dir: rootDir(dir)}
	defer func() {
		if retErr != nil {
			r.stop()
		}
	}()
	if err := acquireMountPoints(); err != nil {
		return nil, err
	}
	r.counted = true
	for _, p := range RootPaths {
		if err := os.MkdirAll(r.dir+p, 0o755); err != nil {
			return nil, err
		}
	}
	if err := syscall.Mount("bpf", r.dir+"/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("mount bpffs on %s: %w", r.dir+"/sys/fs/bpf", err)
	}
	// The holder's command line names the node's directory, so that
	// KillUnder finds it as it finds every other process of the node.
	r.holder = exec.Command("unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", "read -r _", "bulkhead-node-root", dir)
	r.holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if r.hold, err = r.holder.StdinPipe(); err != nil {
		return nil, err
	}
	if err := r.holder.Start(); err != nil {
		return nil, fmt.Errorf("unshare --mount: %w", err)
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, err
	}
	pid := strconv.Itoa(r.holder.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		ns, err := os.Readlink("/proc/" + pid + "/ns/mnt")
		if err == nil && ns != self {
			r.mntNS = ns
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("unshare --mount: pid %s has no mount namespace of its own after 10s (%v)", pid, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for _, p := range RootPaths {
		fmt.Fprintf(&script, "mount --bind %q %q\n", r.dir+p, p)
	}
	script.WriteString("mount --make-rshared /\n")
	if out, err := r.command(context.Background(), "sh", "-c", script.String()).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("the node's mounts: %v: %s", err, out)
	}
	return r, nil
}

// enter is the command line that runs a command in the namespace.
func (r *root) enter() []string {
	return []string{"nsenter", "--target", strconv.Itoa(r.holder.Process.Pid), "--mount", "--"}
}

// command is cmd with args, run in the namespace.
func (r *root) command(ctx context.Context, cmd string, args ...string) *exec.Cmd {
	e := r.enter()
	return exec.CommandContext(ctx, e[0], append(append(e[1:], cmd), args...)...)
}

// rootDir is the host's view of a node's RootPaths: <dir>/root.
func rootDir(dir string) string { return filepath.Join(dir, "root") }

// processes lists the pids of the processes in the namespace (containerd,
// the kubelet, the shims), but not the holder.
func (r *root) processes() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || pid == r.holder.Process.Pid {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && ns == r.mntNS {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stop kills every process of the namespace and the holder (the namespace
// and its mounts go with the last), unmounts the node's bpffs and releases
// the host's mount points.
func (r *root) stop() {
	if r.holder != nil && r.holder.Process != nil {
		if r.mntNS != "" {
			for _, pid := range r.processes() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		r.hold.Close()
		_ = r.holder.Process.Kill()
		_ = r.holder.Wait()
	}
	_ = syscall.Unmount(r.dir+"/sys/fs/bpf", syscall.MNT_DETACH)
	if r.counted {
		releaseMountPoints()
		r.counted = false
	}
}

// path is the host's view of p, a path in the namespace.
func (r *root) path(p string) string {
	clean := filepath.Clean(p)
	if clean == "/var/run" || strings.HasPrefix(clean, "/var/run/") {
		clean = strings.TrimPrefix(clean, "/var")
	}
	for _, rp := range RootPaths {
		if clean == rp || strings.HasPrefix(clean, rp+"/") {
			return r.dir + clean
		}
	}
	return p
}
