package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/bulkhead-runtime/bulkhead/policy"
	bhnode "github.com/bulkhead-runtime/bulkhead/runtime/node"
)

// nodeAgrees waits until the ledger, the fence, the MIG instances and the
// records hold exactly the running pods (each once; instances: migSlices):
// what a crash left is repaired by the agent's GC, at its start and every
// 30 s.
func (pn *pipelineNode) nodeAgrees(t *testing.T, running []string, migSlices int) {
	t.Helper()
	sort.Strings(running)
	deadline := time.Now().Add(90 * time.Second)
	for {
		var problems []string
		var ledger []string
		for _, r := range pn.ledger(t) {
			ledger = append(ledger, r.SandboxID)
		}
		sort.Strings(ledger)
		if !slices.Equal(ledger, running) {
			problems = append(problems, fmt.Sprintf("ledger holds %d reservations %v, want the %d running pods %v", len(ledger), ledger, len(running), running))
		}
		eps, err := pn.fence(t).Endpoints()
		if err != nil {
			t.Fatal(err)
		}
		var fenced []string
		for _, e := range eps {
			fenced = append(fenced, e.SandboxID)
		}
		sort.Strings(fenced)
		if !slices.Equal(fenced, running) {
			problems = append(problems, fmt.Sprintf("fence holds %v, want %v", fenced, running))
		}
		if insts := pn.migInstances(t); len(insts) != migSlices {
			problems = append(problems, fmt.Sprintf("%d MIG instances, want %d", len(insts), migSlices))
		}
		records := dirEntries(filepath.Join(pn.StateDir, "sandboxes"))
		sort.Strings(records)
		if !slices.Equal(records, running) {
			problems = append(problems, fmt.Sprintf("records %v, want %v", records, running))
		}
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s the node does not agree with its pods:\n%s", strings.Join(problems, "\n"))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestAgentKilledDuringConcurrentStarts: kill -9 of the agent while 20
// pods start at once. Starts in flight fail (closed: no pod runs that the
// agent did not finish placing), the agent restarted from the ledger
// repairs what the crash left, and then ledger, fence, MIG instances and
// records hold exactly the pods that run, each charged once; deleting them
// leaves nothing.
func TestAgentKilledDuringConcurrentStarts(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	const starts = 20
	type started struct {
		id     string
		err    error
		config *cri.PodSandboxConfig
	}
	results := make([]started, starts)
	var wg sync.WaitGroup
	for i := range starts {
		// Every fourth pod asks for a GPU (in gVisor a whole one, no MIG
		// instance): the crash can catch a placement being made.
		var ann map[string]string
		if i%4 == 0 {
			ann = map[string]string{policy.AnnotationGPUProfile: "1g.18gb"}
		}
		cfg := podConfig(pn.Node, fmt.Sprintf("burst-%02d", i), "research", ann)
		wg.Go(func() {
			id, err := runPod(ctx, pn.Node, cfg)
			results[i] = started{id: id, err: err, config: cfg}
		})
	}
	// Kill it once some pods are placed (active) and others are still on
	// their way.
	deadline := time.Now().Add(2 * time.Minute)
	for active := 0; active < 3; {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 3 pods placed within 2 minutes")
		}
		time.Sleep(2 * time.Millisecond)
		active = 0
		for _, r := range pn.ledger(t) {
			if r.State == bhnode.StateActive {
				active++
			}
		}
	}
	if err := pn.KillAgent(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	var running []string
	failed := 0
	for _, r := range results {
		if r.err != nil {
			failed++
			continue
		}
		running = append(running, r.id)
	}
	t.Logf("kill -9 of the agent during %d starts: %d ran, %d failed", starts, len(running), failed)
	if failed == 0 || len(running) == 0 {
		t.Errorf("the kill caught no start in flight (%d ran, %d failed): the test proves nothing", len(running), failed)
	}
	for _, r := range results {
		if r.err != nil && !strings.Contains(r.err.Error(), "agent") && !strings.Contains(r.err.Error(), "shim") {
			t.Errorf("a start failed without naming the agent: %v", r.err)
		}
	}
	if err := pn.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	pn.nodeAgrees(t, running, 0)

	// The restarted agent serves the pods the dead one admitted: their
	// containers are judged and their delete releases everything.
	for _, r := range results {
		if r.err != nil {
			continue
		}
		if _, err := startContainer(ctx, pn.Node, r.id, r.config, "main", "exec sleep 3600"); err != nil {
			t.Errorf("container in pod %s after the agent restarted: %v", r.id[:12], err)
		}
		break
	}
	for _, id := range running {
		if err := removePod(ctx, pn.Node, id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}

// TestAgentDownFailsClosed: with the agent stopped a sandbox create is
// refused with a message naming the agent and its socket, running pods keep
// their fence entry and reservation, and an agent started again resumes:
// a new pod starts, and a pod admitted before the stop gets its containers
// judged and its delete released.
func TestAgentDownFailsClosed(t *testing.T) {
	pn := startPipelineNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	beforeCfg := podConfig(pn.Node, "before", "research", map[string]string{policy.AnnotationGPUProfile: "1g.18gb"})
	before, err := runPod(ctx, pn.Node, beforeCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pn.StopAgent(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = runPod(ctx, pn.Node, podConfig(pn.Node, "while-down", "research", nil))
	if err == nil {
		t.Fatal("a pod started while the agent was down")
	}
	if !strings.Contains(err.Error(), "bulkhead-agent") || !strings.Contains(err.Error(), pn.AgentSocket()) {
		t.Errorf("refusal while the agent is down = %v, want it to name bulkhead-agent and %s", err, pn.AgentSocket())
	}
	// A container of a running pod is refused too: nothing is created
	// unjudged.
	if _, err := startContainer(ctx, pn.Node, before, beforeCfg, "while-down", "exec sleep 3600"); err == nil {
		t.Error("a container was created while the agent was down")
	}
	// The running pod keeps its fence entry (pinned maps) and reservation
	// (its GPU is a whole one: gVisor takes no MIG instance).
	pn.nodeAgrees(t, []string{before}, 0)

	if err := pn.StartAgent(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := runPod(ctx, pn.Node, podConfig(pn.Node, "after", "research", nil))
	if err != nil {
		t.Fatalf("a pod after the agent restarted: %v", err)
	}
	if _, err := startContainer(ctx, pn.Node, before, beforeCfg, "main", "exec sleep 3600"); err != nil {
		t.Errorf("a container of the pod admitted before the restart: %v", err)
	}
	pn.nodeAgrees(t, []string{before, after}, 0)
	for _, id := range []string{before, after} {
		if err := removePod(ctx, pn.Node, id); err != nil {
			t.Fatal(err)
		}
	}
	pn.assertNodeClean(t)
}
