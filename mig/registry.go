package mig

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrUnknownBackend means mig.backend names a backend this binary does not
// link: a misspelt name, or a test backend left out of a production build.
var ErrUnknownBackend = errors.New("unknown MIG backend")

// BackendOptions carry what a node's config (its mig section) gives the
// backend it names. Only the mock reads the Mock fields.
type BackendOptions struct {
	// MockModel is the mock node's GPU model (mig.mock_model), e.g. "h200".
	MockModel string
	// MockGPUs is the mock node's GPU count (mig.mock_gpus).
	MockGPUs int
	// MockState is the JSON file the mock node's state lives in
	// (mig.mock_state), shared by every process on the node.
	MockState string
	// ReadOnly opens the backend only to read the node's GPUs, for
	// `bulkhead node status`: the opener creates no state. A mock whose
	// state file does not exist yet has no GPUs (nil backend, nil GPUs,
	// nil error).
	ReadOnly bool
}

// BackendOpener opens a backend and returns it with the node's GPUs as the
// allocator sees them (GPUs with MIG mode off marked NoMIG).
type BackendOpener func(BackendOptions) (Backend, []GPU, error)

// taggedBackends are the backends that exist only in builds with a tag,
// by name: the tag that links them. Test machinery stays out of what
// production binaries link, so a production node set to one of these is
// told which build it needs rather than that the name is wrong.
var taggedBackends = map[string]string{
	"mock": "bulkhead_mockgpu",
}

// registry holds the backends linked into this binary.
type registry struct {
	mu      sync.RWMutex // guards openers
	openers map[string]BackendOpener
}

// backends is the process's registry: backend packages register into it
// from init.
var backends registry

// RegisterBackend makes a backend available to OpenBackend under name. It is
// meant for a backend package's init: it panics when name is empty, "none"
// (which means no backend) or already registered, as those are programming
// errors.
func RegisterBackend(name string, open BackendOpener) {
	backends.register(name, open)
}

// OpenBackend opens the backend named by mig.backend with opts. The names
// "" and "none" mean no backend: nil backend, nil GPUs, nil error. A name
// this binary does not link fails with ErrUnknownBackend, and the error
// names the linked backends or, for a test backend, the build tag that
// links it.
func OpenBackend(name string, opts BackendOptions) (Backend, []GPU, error) {
	return backends.open(name, opts)
}

// Backends lists the names of the backends linked into this binary, sorted.
func Backends() []string {
	return backends.names()
}

func (r *registry) register(name string, open BackendOpener) {
	if name == "" || name == "none" || open == nil {
		panic(fmt.Sprintf("mig: RegisterBackend(%q): needs a name other than none and an opener", name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.openers[name]; dup {
		panic(fmt.Sprintf("mig: RegisterBackend(%q): registered twice", name))
	}
	if r.openers == nil {
		r.openers = map[string]BackendOpener{}
	}
	r.openers[name] = open
}

func (r *registry) names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.openers))
	for name := range r.openers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

func (r *registry) open(name string, opts BackendOptions) (Backend, []GPU, error) {
	if name == "" || name == "none" {
		return nil, nil, nil
	}
	r.mu.RLock()
	open := r.openers[name]
	r.mu.RUnlock()
	if open == nil {
		if tag, ok := taggedBackends[name]; ok {
			return nil, nil, fmt.Errorf("mig.backend %q: %w: a test backend, linked only into builds with the tag %s (this binary links: %s)",
				name, ErrUnknownBackend, tag, strings.Join(append([]string{"none"}, r.names()...), ", "))
		}
		return nil, nil, fmt.Errorf("mig.backend %q: %w: not one of %s", name, ErrUnknownBackend,
			strings.Join(append([]string{"none"}, r.names()...), ", "))
	}
	b, gpus, err := open(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("mig.backend %q: %w", name, err)
	}
	return b, gpus, nil
}
