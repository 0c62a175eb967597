package policy

import (
	"context"
	"slices"
	"testing"
)

// TestNodeContainerInputFitsTheContract: the input a node builds for one
// container (kind container: its memory limit or none, the volumes it
// mounts as the node tells them, one that may be a claim's) fits
// input.schema.json, and the default bundle judges it: the unlimited
// container is named by quota.memory_limit_missing, a volume that may be
// a claim's passes where the tier allows claims, and one of a type no
// claim has is refused below trusted.
func TestNodeContainerInputFitsTheContract(t *testing.T) {
	e := openDefault(t)
	in := agentPod()
	in.Kind, in.Request, in.Usage, in.Node = KindContainer, Request{}, Usage{}, nil
	in.Pod.Containers = []Container{{Name: "sidecar", Image: "registry.local/side@sha256:01"}}
	in.Pod.Volumes = []Volume{{Name: "pv-1", Type: "nfs", MayBeClaim: true}, {Name: "kube-api-access", Type: "projected"}}
	if errs := schemaErrors(t, "input.schema.json", in); errs != nil {
		t.Fatalf("node container input breaks input.schema.json: %v", errs)
	}
	rules := func(in Input) []string {
		d, err := e.Decide(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range d.Reasons {
			out = append(out, r.Rule)
		}
		return out
	}
	if got := rules(in); !slices.Equal(got, []string{"quota.memory_limit_missing"}) {
		t.Errorf("unlimited container, claimable volume: reasons %v, want quota.memory_limit_missing alone", got)
	}
	in.Pod.Containers[0].MemoryBytes = 1 << 20
	in.Pod.Volumes = append(in.Pod.Volumes, Volume{Name: "src", Type: "gitRepo"})
	if got := rules(in); !slices.Equal(got, []string{"workload.volume_type"}) {
		t.Errorf("gitRepo volume: reasons %v, want workload.volume_type alone", got)
	}
}
