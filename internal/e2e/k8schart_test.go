package e2e

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"testing"

	"go.yaml.in/yaml/v3"
)

// chartObjects is a rendered chart.
type chartObjects []map[string]any

func renderChart(t *testing.T, helm, chart string, args ...string) chartObjects {
	t.Helper()
	cmd := exec.Command(helm, append([]string{"template", k8sRelease, chart, "--namespace", k8sReleaseNS}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var out chartObjects
	dec := yaml.NewDecoder(&stdout)
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// one returns the agent's object of a kind (the agent's ServiceAccount,
// not the shared one).
func (c chartObjects) one(t *testing.T, kind string) map[string]any {
	t.Helper()
	for _, o := range c {
		m, _ := o["metadata"].(map[string]any)
		labels, _ := m["labels"].(map[string]any)
		if o["kind"] == kind && (kind != "ServiceAccount" && kind != "ConfigMap" || labels["app.kubernetes.io/component"] == "agent") {
			return o
		}
	}
	t.Fatalf("the chart rendered no agent %s", kind)
	return nil
}

// agentConfig is the chart's agent configuration adapted to a process on
// loopback: the API reached through a kubeconfig (in a pod: the mounted
// service account token), profiles written to a file instead of the
// gateway, no self-metrics endpoint. Everything else is as rendered.
func agentConfig(t *testing.T, c chartObjects) map[string]any {
	t.Helper()
	cm := c.one(t, "ConfigMap")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(cm["data"].(map[string]any)["config.yaml"].(string)), &cfg); err != nil {
		t.Fatal(err)
	}
	k, ok := getPath(cfg, "processors", "k8s_attributes").(map[string]any)
	if !ok {
		t.Fatal("the chart's agent config has no k8s_attributes")
	}
	k["auth_type"] = "kubeConfig"
	for _, p := range getPath(cfg, "service", "pipelines").(map[string]any) {
		p.(map[string]any)["exporters"] = []any{"file"}
	}
	cfg = setPath(cfg, map[string]any{"level": "none"}, "service", "telemetry", "metrics")
	return cfg
}

func getPath(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// setPath returns a deep copy of cfg with path set to v.
func setPath(cfg map[string]any, v any, path ...string) map[string]any {
	b, _ := yaml.Marshal(cfg)
	var c map[string]any
	yaml.Unmarshal(b, &c)
	m := c
	for _, p := range path[:len(path)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
	return c
}

// withoutVerb returns a copy of a ClusterRole where resource lacks verb.
func withoutVerb(role map[string]any, resource, verb string) map[string]any {
	var rules []any
	for _, r := range role["rules"].([]any) {
		rm := r.(map[string]any)
		var others []any
		had := false
		for _, res := range rm["resources"].([]any) {
			if res == resource {
				had = true
			} else {
				others = append(others, res)
			}
		}
		if !had {
			rules = append(rules, rm)
			continue
		}
		if len(others) > 0 {
			rules = append(rules, map[string]any{"apiGroups": rm["apiGroups"], "resources": others, "verbs": rm["verbs"]})
		}
		var verbs []any
		for _, v := range rm["verbs"].([]any) {
			if v != verb {
				verbs = append(verbs, v)
			}
		}
		rules = append(rules, map[string]any{"apiGroups": rm["apiGroups"], "resources": []any{resource}, "verbs": verbs})
	}
	out := map[string]any{}
	for k, v := range role {
		out[k] = v
	}
	out["rules"] = rules
	return out
}
