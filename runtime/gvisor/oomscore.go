package gvisor

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/sys"
	"github.com/containerd/log"
)

// shimOOMScore keeps the shim killable but well behind the workloads it
// serves. (The runc shim uses containerd's runc manager, which sets its
// own: containerd's score + 1.)
const shimOOMScore = -999

// setShimOOMScore gives the shim process pid -999 where the caller may
// lower scores (CAP_SYS_RESOURCE) and otherwise containerd's own score + 1.
// It must not log: containerd reads the start command's output as bootstrap
// parameters. The shim itself warns about the fallback once it serves
// (warnOOMScore).
func setShimOOMScore(pid int) error {
	if err := sys.SetOOMScore(pid, shimOOMScore); err != nil {
		if err := shim.AdjustOOMScore(pid); err != nil {
			return fmt.Errorf("shim pid %d: set oom_score_adj: %w", pid, err)
		}
	}
	return nil
}

// warnOOMScore logs a warning when the running shim did not get the
// oom_score_adj it wanted.
func warnOOMScore(ctx context.Context) {
	score, err := sys.GetOOMScoreAdj(os.Getpid())
	if err == nil && score != shimOOMScore {
		log.G(ctx).Warnf("shim oom_score_adj is %d, not %d: this node denies CAP_SYS_RESOURCE, so the shim uses containerd's score + 1", score, shimOOMScore)
	}
}
