package symbolizationprocessor

import (
	"strings"
	"testing"
)

// The gateway symbolizes what agents send and must pass their resources on
// as they came: the Kubernetes names the agent's k8s_attributes added are
// on no other path to the backend (docs/deployment.md#kubernetes-metadata).
func TestKeepsResourceAttributes(t *testing.T) {
	h := newHarness(t, func(*Config) {})
	pd := profile(variant{id: strings.Repeat("ab", 20), hot: 0x1100})
	want := map[string]any{
		"process.pid": int64(4242), "process.vpid": int64(1),
		"container.id":       "7e3f6b1c2d9a4e8f0b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f70",
		"k8s.pod.uid":        "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",
		"k8s.namespace.name": "shop", "k8s.pod.name": "web-7c9f8d6b5-x7k2q", "k8s.container.name": "app",
		"k8s.deployment.name": "web", "k8s.node.name": "node-1",
	}
	if err := pd.ResourceProfiles().At(0).Resource().Attributes().FromRaw(want); err != nil {
		t.Fatal(err)
	}
	h.run(t, pd)
	all := h.sink.AllProfiles()
	got := all[len(all)-1].ResourceProfiles().At(0).Resource().Attributes().AsRaw()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v after symbolization, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("resource %v, want %v", got, want)
	}
}
