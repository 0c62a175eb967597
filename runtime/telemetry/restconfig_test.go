package telemetry

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRESTConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	os.Unsetenv("KUBERNETES_SERVICE_HOST")
	cfg, err := RESTConfig("")
	if cfg != nil || err != nil {
		t.Errorf("no kubeconfig, not in a pod: %v, %v; want nil, nil", cfg, err)
	}

	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://192.0.2.1:6443"}}]
users: [{name: u, user: {token: t0ken}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = RESTConfig(path)
	if err != nil || cfg == nil || cfg.Host != "https://192.0.2.1:6443" || cfg.BearerToken != "t0ken" {
		t.Errorf("RESTConfig(%s) = %+v, %v", path, cfg, err)
	}

	_, err = RESTConfig(filepath.Join(t.TempDir(), "missing"))
	if err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing kubeconfig: %v, want an error naming it", err)
	}
}
