package netpol

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

type attachMode string

const (
	attachTCX    attachMode = "tcx"
	attachClsact attachMode = "clsact"
)

// clsact filter identity: priority 1 runs before filters a CNI adds with
// the usual higher numbers.
const (
	clsactPriority = 1
	clsactHandle   = 0xb01c
	clsactName     = "bulkhead-fence"
)

func (m *Manager) linkPin(ifindex int, dir Direction) string {
	return filepath.Join(m.opts.PinDir, "links", fmt.Sprintf("%d-%s", ifindex, dir))
}

// attach puts both programs on the interface: TCX links at the head of the
// chain, pinned so they outlive this process, or clsact filters where TCX is
// missing (or clsact was asked for).
func (m *Manager) attach(ifindex int, clsact bool) (attachMode, error) {
	if !clsact && !m.opts.ForceClsact {
		err := m.attachTCX(ifindex)
		if err == nil {
			return attachTCX, nil
		}
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return "", err
		}
	}
	return attachClsact, m.attachClsact(ifindex)
}

func (m *Manager) attachTCX(ifindex int) error {
	for _, dir := range []Direction{FromPod, ToPod} {
		prog := m.dp.program(dir)
		pin := m.linkPin(ifindex, dir)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			// Re-registration: swap the program atomically, no gap.
			err = l.Update(prog)
			if err == nil {
				l.Close()
				continue
			}
			// A defunct link (its interface is gone): replace it.
			_ = l.Unpin()
			l.Close()
		}
		attach := ebpf.AttachTCXIngress
		if dir == ToPod {
			attach = ebpf.AttachTCXEgress
		}
		l, err := link.AttachTCX(link.TCXOptions{
			Interface: ifindex,
			Program:   prog,
			Attach:    attach,
			Anchor:    link.Head(),
		})
		if err != nil {
			return fmt.Errorf("attach tcx %s: %w", dir, err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin tcx %s link: %w", dir, err)
		}
		l.Close()
	}
	return nil
}

func clsactParent(dir Direction) uint32 {
	if dir == FromPod {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

func (m *Manager) attachClsact(ifindex int) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("clsact qdisc: %w", err)
	}
	for _, dir := range []Direction{FromPod, ToPod} {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: ifindex, Parent: clsactParent(dir), Handle: clsactHandle,
				Priority: clsactPriority, Protocol: unix.ETH_P_ALL,
			},
			Fd:           m.dp.program(dir).FD(),
			Name:         clsactName,
			DirectAction: true,
		}
		if err := netlink.FilterReplace(f); err != nil {
			return fmt.Errorf("cls_bpf %s filter: %w", dir, err)
		}
	}
	return nil
}

// detach removes both programs from the interface; an interface or link that
// is already gone is not an error.
func (m *Manager) detach(ifindex int, ifname string, clsact bool) error {
	for _, dir := range []Direction{FromPod, ToPod} {
		pin := m.linkPin(ifindex, dir)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("load pinned %s link: %w", dir, err)
		}
		if err := l.Unpin(); err != nil {
			l.Close()
			return fmt.Errorf("unpin %s link: %w", dir, err)
		}
		// Closing the last reference detaches the program.
		l.Close()
	}
	if !clsact {
		return nil
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil || l.Attrs().Name != ifname {
		return nil // the interface, and its filters, are gone
	}
	for _, dir := range []Direction{FromPod, ToPod} {
		f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: clsactParent(dir), Handle: clsactHandle,
			Priority: clsactPriority, Protocol: unix.ETH_P_ALL,
		}}
		if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete cls_bpf %s filter: %w", dir, err)
		}
	}
	return nil
}

// sweepLinks closes pinned links that belong to no live endpoint.
func (m *Manager) sweepLinks(live map[uint32]endpointValue) error {
	dir := filepath.Join(m.opts.PinDir, "links")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list pinned links: %w", err)
	}
	for _, ent := range entries {
		idx, _, ok := strings.Cut(ent.Name(), "-")
		n, err := strconv.ParseUint(idx, 10, 32)
		if !ok || err != nil {
			continue
		}
		if _, ok := live[uint32(n)]; ok {
			continue
		}
		path := filepath.Join(dir, ent.Name())
		l, err := link.LoadPinnedLink(path, nil)
		if err != nil {
			_ = os.Remove(path)
			continue
		}
		_ = l.Unpin()
		l.Close()
	}
	return nil
}

// bpffsMagic is BPF_FS_MAGIC.
const bpffsMagic = 0xcafe4a11

// requireBPFFS checks that dir, or its nearest existing parent, is on bpffs.
func requireBPFFS(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if errors.Is(err, unix.ENOENT) && p != "/" {
			continue
		}
		if err != nil {
			return fmt.Errorf("netpol: PinDir %s: %w", dir, err)
		}
		if uint32(st.Type) != bpffsMagic {
			return fmt.Errorf("netpol: PinDir %s is not on a bpf filesystem (%s is not bpffs; mount one with netpol.MountBPFFS or `mount -t bpf bpf /sys/fs/bpf`)", dir, p)
		}
		return nil
	}
}

// MountBPFFS mounts a bpf filesystem on dir unless one is there already.
func MountBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && uint32(st.Type) == bpffsMagic {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("netpol: bpffs mount point: %w", err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("netpol: mount bpffs on %s: %w", dir, err)
	}
	return nil
}
