// Package telemetry is what the node agent tells the outside about its
// node: Prometheus metrics on /metrics, a health check on /healthz, and a
// Kubernetes Event on every pod it refuses.
//
// Every metric it exports, with its labels and meaning, and the Event are
// listed in docs/metrics.md; a series added here is added there.
//
// # Invariant
//
// Telemetry never decides and never blocks a decision. Counting a decision
// or a stage is a counter increment; the fence, quota and MIG series are
// read from their sources at scrape time, not copied on the hot path; an
// event is queued and sent in the background. A source that fails to read
// drops only its own series from that scrape.
//
// # What is exported
//
//   - Metrics (NewMetrics, Options): the registry, with Decided, Stage,
//     Started, BundleLoaded and BundleReloadFailed for the agent to call,
//     and Handler, Serve and ServeListener to serve it. A nil *Metrics
//     records nothing.
//   - FenceSource and NodeSource, read at scrape time: NetpolFence adapts a
//     *netpol.Manager or *netpol.Reader (a node without a fence answers
//     ErrNoFence, and bulkhead_node_fence_loaded is 0); the agent
//     implements NodeSource from its ledger.
//   - Events (NewEvents, NewEventsForClient): Refused records a Warning
//     BulkheadRefused event on a Pod. A nil *Events, what NewEvents returns
//     with no kubeconfig outside a cluster, records nothing.
//
// This package imports netpol and policy for their types only, and never
// package runtime: the agent imports it.
package telemetry
