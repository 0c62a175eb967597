package irvm

import (
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
)

// CacheEveryRule makes Load give every rule that can have a cache one,
// however small, until the returned func is called.
func CacheEveryRule() (restore func()) {
	old := minCachedSize
	minCachedSize = 0
	return func() { minCachedSize = old }
}

// CachedRules lists the rules with a cache and the input paths of their keys.
func (p *Program) CachedRules() map[string]string {
	out := map[string]string{}
	for _, fn := range p.funcs {
		if fn.cache != nil {
			s := ""
			for _, d := range fn.cache.paths {
				s += d.path.String()
				if d.exists {
					s += "?"
				}
				s += " "
			}
			out[fn.name] = s
		}
	}
	return out
}

// RoundTrip writes p's binary form and reads it back with caps; it fails
// unless what it read is p as Load made it (sameLoaded).
func RoundTrip(p *Program, caps *ast.Capabilities) (*Program, error) {
	b, err := p.AppendBinary(nil)
	if err != nil {
		return nil, err
	}
	q, err := LoadBinary(b, caps)
	if err != nil {
		return nil, err
	}
	if diff := sameLoaded(p, q); diff != "" {
		return nil, fmt.Errorf("read back differs: %s", diff)
	}
	return q, nil
}

// CallsDynamically reports whether p holds a CallDynamicStmt, whose callee
// LoadBinary cannot check for cycles (it is chosen at evaluation time).
func (p *Program) CallsDynamically() bool {
	found := false
	var walk func(code []instr)
	walk = func(code []instr) {
		for i := range code {
			found = found || code[i].op == opCallDynamic
			for _, b := range code[i].blocks {
				walk(b)
			}
		}
	}
	for _, fn := range append([]*function{p.plan}, p.funcs...) {
		for _, b := range fn.blocks {
			walk(b)
		}
	}
	return found
}
