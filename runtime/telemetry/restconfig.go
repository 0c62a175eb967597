package telemetry

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig is how the node agent reaches the API server: with the
// kubeconfig at path, or, when path is "", with the pod's in-cluster config
// if KUBERNETES_SERVICE_HOST is set. Without either it returns nil and no
// error: the agent runs without an API server. NewEvents connects the same
// way.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	switch {
	case kubeconfig != "":
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		cfg, err = rest.InClusterConfig()
	default:
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: kubeconfig %q: %w", kubeconfig, err)
	}
	return cfg, nil
}
