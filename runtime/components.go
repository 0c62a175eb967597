package runtime

import (
	"github.com/bulkhead-runtime/bulkhead/mig"
	"github.com/bulkhead-runtime/bulkhead/netpol"
)

// Ledger is the node's ledger.
func (p *Pipeline) Ledger() *Ledger { return p.ledger }

// Backend is the node's GPU backend; nil without GPUs.
func (p *Pipeline) Backend() mig.Backend { return p.backend }

// Fence is the node's fence; nil when netpol.enabled is false.
func (p *Pipeline) Fence() *netpol.Manager { return p.fence }
