package agentapi

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// serve answers Status on a fresh socket at path until the returned stop
// is called; the server's connections close with it.
func serve(t *testing.T, path string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	srv.RegisterService(Service, &ttrpc.ServiceDesc{Methods: map[string]ttrpc.Method{
		MethodStatus: func(ctx context.Context, unmarshal func(any) error) (any, error) {
			var in wrapperspb.BytesValue
			if err := unmarshal(&in); err != nil {
				return nil, err
			}
			return Marshal(StatusReply{Report: []byte(`{"ok":true}`)})
		},
	}})
	go srv.Serve(context.Background(), l)
	return func() { srv.Close() }
}

// TestClientRedialsAnAgentThatRestarted: a shim's client outlives the
// agent it first reached; after the agent restarts, the next call reaches
// the new one instead of failing on the dead connection.
func TestClientRedialsAnAgentThatRestarted(t *testing.T) {
	ctx := context.Background()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	stop := serve(t, sock)
	c := NewClient(sock)
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	// The client lets go of the dead agent's connection by itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		held := c.conn != nil
		c.mu.Unlock()
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the client still holds the stopped agent's connection after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := c.Status(ctx); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Errorf("call while the agent is down: %v, want it unavailable", err)
	}
	stop = serve(t, sock)
	defer stop()
	// The first call after the restart reaches the new agent.
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("first call after the agent restarted: %v", err)
	}
}
