// Package agentapi is the protocol between Bulkhead's shims and the node
// agent (bulkhead-agent), and its client.
//
// # Invariant
//
// A shim decides nothing: every sandbox create, container create, resource
// update and delete is one call to the agent, which holds the policy, the
// ledger, the GPU backend and the fence. When the agent cannot be reached
// a create or update fails closed, naming the agent and its socket.
//
// # The wire
//
// ttrpc over the agent's unix socket, as containerd talks to its shims.
// The socket is created 0600 and the agent refuses any peer whose
// credentials (SO_PEERCRED) are not root's. Each message is a JSON document
// of this package's types carried in a protobuf BytesValue: the types are
// plain Go structs both sides share, with no generated code.
//
// # Calls that need the task service in the middle
//
// Creating a sandbox or a container, and updating a container's resources,
// need the shim's task service at a point the agent decides: after the pod
// is admitted and placed and before its fence is activated, or after the
// new charge is written and before it is rolled back. Such a call answers
// with a Reply that names an Act (create, update, delete) and an Op; the
// shim performs the act on its task service and reports its outcome with
// Continue(Op), whose Reply is the next act or the final answer. A shim
// that dies while the agent waits is noticed (its pid is gone) and the
// agent unwinds as if the act had failed.
package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Service is the agent's ttrpc service name.
const Service = "bulkhead.agent.v1.Agent"

// Method names of Service.
const (
	MethodCreate   = "Create"
	MethodUpdate   = "Update"
	MethodContinue = "Continue"
	MethodDeleted  = "Deleted"
	MethodStatus   = "Status"
)

// Runtimes a shim runs, as the policy names them (policy.RuntimeGVisor and
// policy.RuntimeRunc; the agent's tests keep them equal).
const (
	RuntimeGVisor = "gvisor"
	RuntimeRunc   = "runc"
)

// Acts the agent asks of a shim's task service.
const (
	// ActCreate creates the container of the call (Reply.ID).
	ActCreate = "create"
	// ActUpdate applies the resource update of the call.
	ActUpdate = "update"
	// ActDelete deletes container Reply.ID again: a later step failed.
	ActDelete = "delete"
)

// Caller says which shim calls: the agent records the shim's pid with what
// the pod holds, so that what a dead shim held can be released.
type Caller struct {
	// Runtime is RuntimeGVisor or RuntimeRunc.
	Runtime string `json:"runtime"`
	// PID is the shim's process id.
	PID int `json:"pid"`
}

// CreateRequest asks the agent to admit container ID, whose OCI bundle is
// Bundle (the agent reads and may rewrite its config.json).
type CreateRequest struct {
	Caller Caller `json:"caller"`
	// Sandbox is the pod's sandbox id, "" when the shim has no sandbox yet
	// (ID is then the sandbox's own container).
	Sandbox string `json:"sandbox,omitempty"`
	ID      string `json:"id"`
	Bundle  string `json:"bundle"`
}

// UpdateRequest asks the agent to judge an update of container ID's
// resources (a task Update: CRI UpdateContainerResources).
type UpdateRequest struct {
	Caller  Caller `json:"caller"`
	Sandbox string `json:"sandbox"`
	ID      string `json:"id"`
	// ResourcesType and Resources are the task API's resources (a
	// protobuf Any: its type URL and value).
	ResourcesType string `json:"resources_type,omitempty"`
	Resources     []byte `json:"resources,omitempty"`
}

// ContinueRequest reports the outcome of the act the agent asked for.
type ContinueRequest struct {
	Op uint64 `json:"op"`
	// Error is the act's failure; "" when it succeeded.
	Error string `json:"error,omitempty"`
}

// DeletedRequest tells the agent the task service deleted container ID of
// sandbox Sandbox (everything the pod holds is released when ID is the
// sandbox).
type DeletedRequest struct {
	Caller  Caller `json:"caller"`
	Sandbox string `json:"sandbox"`
	ID      string `json:"id"`
}

// Reply is the agent's answer: an act for the shim to perform (Act set,
// then Continue(Op)), or the final answer (Act empty; Error "" is success).
type Reply struct {
	Op  uint64 `json:"op,omitempty"`
	Act string `json:"act,omitempty"`
	// ID is the container Act is about.
	ID string `json:"id,omitempty"`
	// Error is the final refusal or failure, worded for containerd, the
	// kubelet and crictl ("bulkhead refused pod NS/NAME (tenant T):
	// [rule.id] message").
	Error string `json:"error,omitempty"`
}

// StatusRequest asks for the node's state.
type StatusRequest struct{}

// StatusReply is the node's state as the agent sees it; Report is the JSON
// document `bulkhead node status --json` prints.
type StatusReply struct {
	Report json.RawMessage `json:"report"`
}

// Marshal wraps v as the wire's message.
func Marshal(v any) (*wrapperspb.BytesValue, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return wrapperspb.Bytes(b), nil
}

// Unmarshal decodes a message of the wire into v, strictly: an unknown
// field is an error (a shim and an agent of different releases say so).
func Unmarshal(m *wrapperspb.BytesValue, v any) error {
	if m == nil {
		return errors.New("agentapi: empty message")
	}
	dec := json.NewDecoder(bytes.NewReader(m.GetValue()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("agentapi: decode %T: %w", v, err)
	}
	return nil
}

// ErrUnavailable wraps every failure to reach the agent.
var ErrUnavailable = errors.New("bulkhead agent unavailable")

// Client calls the agent over its socket. It dials on first use and again
// after the connection broke; it is safe for concurrent use.
type Client struct {
	socket string
	dial   time.Duration

	// mu guards conn, nil until the first call and after a broken one.
	mu   sync.Mutex
	conn *ttrpc.Client
}

// NewClient returns a client of the agent at socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, dial: 2 * time.Second}
}

// Socket is the agent's socket the client calls.
func (c *Client) Socket() string { return c.socket }

func (c *Client) connect(ctx context.Context) (*ttrpc.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return c.conn, nil
	}
	d := net.Dialer{Timeout: c.dial}
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, err
	}
	var client *ttrpc.Client
	// A connection the agent closed (it stopped or died) is forgotten as
	// soon as ttrpc sees it close, so that the next call dials the agent
	// that serves now instead of failing on the dead one's connection.
	client = ttrpc.NewClient(conn, ttrpc.WithOnClose(func() { go c.drop(client) }))
	c.conn = client
	return c.conn, nil
}

// Close closes the connection, if any.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// drop closes conn and forgets it, unless another call already did.
func (c *Client) drop(conn *ttrpc.Client) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.conn.Close()
		c.conn = nil
	}
}

// call sends req to method and decodes the answer into resp. A failure to
// reach the agent, or a connection lost during the call, wraps
// ErrUnavailable and names the socket.
func (c *Client) call(ctx context.Context, method string, req, resp any) error {
	in, err := Marshal(req)
	if err != nil {
		return err
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return fmt.Errorf("%w at %s: %v", ErrUnavailable, c.socket, err)
	}
	var out wrapperspb.BytesValue
	if err := conn.Call(ctx, Service, method, in, &out); err != nil {
		c.drop(conn)
		return fmt.Errorf("%w at %s: %s: %v", ErrUnavailable, c.socket, method, err)
	}
	return Unmarshal(&out, resp)
}

// Create sends a CreateRequest.
func (c *Client) Create(ctx context.Context, r CreateRequest) (Reply, error) {
	var out Reply
	err := c.call(ctx, MethodCreate, r, &out)
	return out, err
}

// Update sends an UpdateRequest.
func (c *Client) Update(ctx context.Context, r UpdateRequest) (Reply, error) {
	var out Reply
	err := c.call(ctx, MethodUpdate, r, &out)
	return out, err
}

// Continue reports an act's outcome.
func (c *Client) Continue(ctx context.Context, r ContinueRequest) (Reply, error) {
	var out Reply
	err := c.call(ctx, MethodContinue, r, &out)
	return out, err
}

// Deleted sends a DeletedRequest.
func (c *Client) Deleted(ctx context.Context, r DeletedRequest) error {
	var out Reply
	if err := c.call(ctx, MethodDeleted, r, &out); err != nil {
		return err
	}
	if out.Error != "" {
		return errors.New(out.Error)
	}
	return nil
}

// Status asks for the node's state.
func (c *Client) Status(ctx context.Context) (StatusReply, error) {
	var out StatusReply
	err := c.call(ctx, MethodStatus, StatusRequest{}, &out)
	return out, err
}
