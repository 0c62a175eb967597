package agent

import (
	"context"

	"github.com/containerd/log"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/bulkhead-runtime/bulkhead/runtime/dra"
	"github.com/bulkhead-runtime/bulkhead/runtime/telemetry"
)

// startDRA starts the DRA kubelet plugin when dra.enabled is set and the
// agent reaches the API server, and returns what stops it. A plugin that
// cannot start is logged and left out: the shims' pods do not depend on it.
func (a *Agent) startDRA(ctx context.Context) (stop func()) {
	none := func() {}
	if !a.cfg.DRA.Enabled {
		return none
	}
	cfg, err := telemetry.RESTConfig(a.cfg.Agent.Kubeconfig)
	if err == nil && cfg == nil {
		log.G(ctx).Warn("dra.enabled: no kubelet plugin: the agent reaches no API server (set agent.kubeconfig, or run it in a pod)")
		return none
	}
	var client kubernetes.Interface
	if err == nil {
		client, err = kubernetes.NewForConfig(rest.AddUserAgent(cfg, telemetry.EventComponent))
	}
	var d *dra.Driver
	if err == nil {
		d, err = dra.New(dra.Options{
			Pipeline: a.pipeline, NodeName: a.cfg.Agent.Node(), Client: client,
			RegistrarDir: a.cfg.DRA.RegistrarDir, PluginDir: a.cfg.DRA.PluginDir,
		})
	}
	if err == nil {
		err = d.Start(ctx)
	}
	if err != nil {
		log.G(ctx).WithError(err).Error("dra.enabled: the kubelet plugin did not start; claims on mig.bulkhead.dev stay unprepared on this node")
		return none
	}
	log.G(ctx).Infof("dra: kubelet plugin serving in %s, registration socket in %s", a.cfg.DRA.PluginDir, a.cfg.DRA.RegistrarDir)
	return d.Stop
}
