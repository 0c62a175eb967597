package main

import (
	"strings"
	"testing"
	"time"

	"github.com/bulkhead-runtime/bulkhead/runtime/node"
)

func TestClusterLine(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		c    node.ClusterSync
		want string
	}{
		{node.ClusterSync{}, "not watching the API server"},
		{node.ClusterSync{}, "other nodes' addresses are in the cluster only where cluster_cidrs hold them"},
		{node.ClusterSync{Watching: true}, "NOT SYNCED"},
		{node.ClusterSync{Watching: true, Synced: true, LastContact: now.Add(-40 * time.Second), RemoteAddresses: 3, RemoteNodes: 2},
			"API SERVER LOST (last contact 40s ago): 3 remote pod addresses and 2 other node addresses kept as last seen"},
		{node.ClusterSync{Watching: true, Synced: true, Connected: true, LastContact: now.Add(-2 * time.Second), RemoteAddresses: 7, RemoteNodes: 4, LastError: "boom"},
			"synced, 7 remote pod addresses, 4 other node addresses, last contact 2s ago; last error: boom"},
	} {
		if got := clusterLine(tc.c, now); !strings.Contains(got, tc.want) {
			t.Errorf("clusterLine(%+v) = %q, want it to contain %q", tc.c, got, tc.want)
		}
	}
}
