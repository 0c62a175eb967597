package mig

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// A registry opens the backend named in the config, says "no backend" for
// "" and "none", and refuses other names with an error that names the field,
// the linked backends and, for a test backend, the tag that links it.
func TestRegistryOpen(t *testing.T) {
	var got BackendOptions
	r := &registry{}
	r.register("hw", func(o BackendOptions) (Backend, []GPU, error) {
		got = o
		return nil, NodeGPUs("h200", 2), nil
	})
	r.register("broken", func(BackendOptions) (Backend, []GPU, error) {
		return nil, nil, errors.New("no driver")
	})
	opts := BackendOptions{MockModel: "h200", MockGPUs: 2, MockState: "/x/gpus.json", ReadOnly: true}
	tests := []struct {
		name     string
		gpus     int
		wantErr  []string // parts of the error; nil for none
		unknown  bool     // the error is ErrUnknownBackend
		wantOpts bool     // the opener saw opts
	}{
		{name: "", gpus: 0},
		{name: "none", gpus: 0},
		{name: "hw", gpus: 2, wantOpts: true},
		{name: "broken", wantErr: []string{`mig.backend "broken"`, "no driver"}},
		{name: "nvlm", unknown: true, wantErr: []string{`mig.backend "nvlm"`, "not one of none, broken, hw"}},
		{name: "mock", unknown: true, wantErr: []string{`mig.backend "mock"`, "test backend", "tag bulkhead_mockgpu", "links: none, broken, hw"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = BackendOptions{}
			b, gpus, err := r.open(tt.name, opts)
			if b != nil {
				t.Errorf("backend %v, want nil from these openers", b)
			}
			if len(gpus) != tt.gpus {
				t.Errorf("%d GPUs, want %d", len(gpus), tt.gpus)
			}
			if tt.wantErr == nil && err != nil {
				t.Fatalf("open %q: %v", tt.name, err)
			}
			if tt.wantErr != nil && err == nil {
				t.Fatalf("open %q succeeded, want an error with %q", tt.name, tt.wantErr)
			}
			for _, part := range tt.wantErr {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("open %q: %v, want it to say %q", tt.name, err, part)
				}
			}
			if errors.Is(err, ErrUnknownBackend) != tt.unknown {
				t.Errorf("open %q: errors.Is(%v, ErrUnknownBackend) = %v, want %v", tt.name, err, !tt.unknown, tt.unknown)
			}
			if tt.wantOpts != (got == opts) {
				t.Errorf("opener saw %+v, want %+v passed through: %v", got, opts, tt.wantOpts)
			}
		})
	}
}

// Registering without a name, as "none", without an opener or twice is a
// programming error and panics at init rather than surprising a node later.
func TestRegistryRefuses(t *testing.T) {
	open := func(BackendOptions) (Backend, []GPU, error) { return nil, nil, nil }
	tests := []struct {
		name string
		open BackendOpener
	}{
		{"", open},
		{"none", open},
		{"nil-opener", nil},
		{"twice", open},
	}
	r := &registry{}
	r.register("twice", open)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("register(%q) did not panic", tt.name)
				}
			}()
			r.register(tt.name, tt.open)
		})
	}
	if names := r.names(); !reflect.DeepEqual(names, []string{"twice"}) {
		t.Errorf("names after refusals: %v, want [twice]", names)
	}
}
