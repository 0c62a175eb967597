package runtime

// RuncHandler is the CRI runtime handler (RuntimeClass handler) of the runc
// tier, the handler a runc-tier sandbox is judged as when containerd does
// not say which one it used.
const RuncHandler = "bulkhead-runc"
