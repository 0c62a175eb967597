package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// agentBinary is the node agent's command (cmd/bulkhead-agent).
const agentBinary = "bulkhead-agent"

// agentReadyTimeout bounds how long a started agent may take to accept a
// connection on its socket: it opens the policy, the ledger, the GPU
// backend and the fence and runs GC first.
const agentReadyTimeout = 30 * time.Second

// agentLogTail is how many of the agent log's last lines Log and a failed
// start show.
const agentLogTail = 50

// agentProcess is one run of the agent.
type agentProcess struct {
	cmd *exec.Cmd
	// exited is closed once the process has exited; err is then its
	// wait status.
	exited chan struct{}
	err    error
}

func (p *agentProcess) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// AgentSocket returns the agent's socket (the node file's [agent] socket).
func (n *Node) AgentSocket() string { return n.agentSocket }

// AgentPID returns the running agent's process id, or 0 when none runs.
func (n *Node) AgentPID() int {
	if !n.agentRunning() {
		return 0
	}
	return n.agent.cmd.Process.Pid
}

func (n *Node) agentRunning() bool { return n.agent != nil && n.agent.running() }

// AgentLogPath returns the file the agent's output goes to (every start's,
// appended): <Dir>/agent.log.
func (n *Node) AgentLogPath() string { return filepath.Join(n.opts.Dir, "agent.log") }

// StartAgent starts the agent on the node's file, as Start does when the
// pipeline is enabled, and returns once its socket accepts a connection.
// It is an error while an agent runs. The agent's output is appended to
// <Dir>/agent.log. An agent that does not become ready within 30 seconds
// is killed; the error ends with its log's last lines.
func (n *Node) StartAgent(ctx context.Context) error {
	if n.agentRunning() {
		return fmt.Errorf("%s already runs (pid %d)", agentBinary, n.agent.cmd.Process.Pid)
	}
	if n.agentBin == "" {
		bin, err := AgentPath(n.opts.BinDir)
		if err != nil {
			return err
		}
		n.agentBin = bin
	}
	log, err := os.OpenFile(n.AgentLogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close() // the process has its own descriptor
	fmt.Fprintf(log, "--- %s: starting %s --config %s\n", time.Now().Format(time.RFC3339Nano), n.agentBin, n.ShimConf)
	cmd := exec.Command(n.agentBin, "--config", n.ShimConf)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = n.env()
	// Its own process group, as containerd's: a Ctrl-C of the parent
	// reaches it only through Stop, after the pods are gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", agentBinary, err)
	}
	p := &agentProcess{cmd: cmd, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	n.agent = p
	if err := n.waitAgent(ctx, p); err != nil {
		_ = cmd.Process.Kill()
		<-p.exited
		return err
	}
	return nil
}

// waitAgent polls the agent's socket until it accepts a connection.
func (n *Node) waitAgent(ctx context.Context, p *agentProcess) error {
	ctx, cancel := context.WithTimeout(ctx, agentReadyTimeout)
	defer cancel()
	var d net.Dialer
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited before serving %s: %v; %s ends:\n%s", agentBinary, n.agentSocket, p.err, n.AgentLogPath(), n.agentLogTail(agentLogTail))
		default:
		}
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		conn, err := d.DialContext(dctx, "unix", n.agentSocket)
		dcancel()
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not serving %s: %v (%v); %s ends:\n%s", agentBinary, n.agentSocket, err, ctx.Err(), n.AgentLogPath(), n.agentLogTail(agentLogTail))
		case <-p.exited:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StopAgent sends the agent SIGTERM and waits for it to exit; an exit
// status other than 0 is an error. When ctx ends first the agent is
// killed and the error says so. Running pods keep their fence and
// reservations; sandbox creates are refused until StartAgent.
func (n *Node) StopAgent(ctx context.Context) error {
	p, err := n.runningAgent()
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("%s: SIGTERM: %w", agentBinary, err)
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not exit on SIGTERM (%v): killed; %s ends:\n%s", agentBinary, ctx.Err(), n.AgentLogPath(), n.agentLogTail(agentLogTail))
	}
	if p.err != nil {
		return fmt.Errorf("%s exited on SIGTERM: %v; %s ends:\n%s", agentBinary, p.err, n.AgentLogPath(), n.agentLogTail(agentLogTail))
	}
	return nil
}

// KillAgent sends the agent SIGKILL and waits for it to be gone, as a
// crash would leave the node: its socket file stays behind.
func (n *Node) KillAgent() error {
	p, err := n.runningAgent()
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("%s: SIGKILL: %w", agentBinary, err)
	}
	<-p.exited
	return nil
}

// runningAgent returns the running agent, or an error saying why none runs.
func (n *Node) runningAgent() (*agentProcess, error) {
	switch {
	case n.agent == nil:
		return nil, fmt.Errorf("%s was never started on this node", agentBinary)
	case !n.agent.running():
		return nil, fmt.Errorf("%s is not running (it exited: %v)", agentBinary, n.agent.err)
	}
	return n.agent, nil
}

// agentLogTail returns the agent log's last lines.
func (n *Node) agentLogTail(lines int) string {
	b, err := os.ReadFile(n.AgentLogPath())
	if errors.Is(err, os.ErrNotExist) {
		return "(no log)"
	}
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}
