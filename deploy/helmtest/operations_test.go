package helmtest

import (
	"fmt"
	"strings"
	"testing"
)

// The collectors' metrics: a headless Service over every pod's metrics
// port by default; a ServiceMonitor on it or a PodMonitor on the pods for
// prometheus-operator, labelled by component.
func TestMetricsEndpoints(t *testing.T) {
	d := mustTemplate(t)
	svc := d.must(t, "Service", release+"-metrics")
	wantEqual(t, "metrics Service headless", str(svc, "spec", "clusterIP"), "None")
	wantEqual(t, "metrics Service port", fmt.Sprint(get(svc, "spec", "ports", "0", "port")), "8888")
	wantEqual(t, "metrics Service target", str(svc, "spec", "ports", "0", "targetPort"), "metrics")
	for _, w := range [][2]string{{"DaemonSet", agentName}, {"Deployment", gatewayName}, {"StatefulSet", symbolsName}} {
		o := d.must(t, w[0], w[1])
		if !selects(mapping(svc, "spec", "selector"), mapping(o, "spec", "template", "metadata", "labels")) {
			t.Errorf("the metrics Service does not select the %s pods", w[1])
		}
		port := false
		for _, p := range list(container(o), "ports") {
			port = port || str(p, "name") == "metrics" && fmt.Sprint(get(p, "containerPort")) == "8888"
		}
		if !port {
			t.Errorf("%s has no metrics port 8888", w[1])
		}
		// The collector listens on the pod IP, where the Service sends.
		cm := w[1]
		wantEqual(t, w[1]+" metrics host", str(collectorConfig(t, d.must(t, "ConfigMap", cm)), "service", "telemetry", "metrics", "readers", "0", "pull", "exporter", "prometheus", "host"), "${env:MY_POD_IP}")
	}
	for _, kind := range []string{"ServiceMonitor", "PodMonitor"} {
		if d.find(kind, release) != nil {
			t.Errorf("%s rendered by default (needs prometheus-operator)", kind)
		}
	}

	d = mustTemplate(t, "--set", "telemetry.serviceMonitor.enabled=true", "--set", "telemetry.serviceMonitor.labels.release=prom",
		"--set", "telemetry.metricsService.enabled=false")
	sm := d.must(t, "ServiceMonitor", release)
	svc = d.must(t, "Service", release+"-metrics") // the monitor needs it
	if !selects(mapping(sm, "spec", "selector", "matchLabels"), mapping(svc, "metadata", "labels")) {
		t.Error("the ServiceMonitor does not select the metrics Service")
	}
	wantEqual(t, "ServiceMonitor label", str(sm, "metadata", "labels", "release"), "prom")
	wantEqual(t, "ServiceMonitor port", str(sm, "spec", "endpoints", "0", "port"), "metrics")
	wantEqual(t, "ServiceMonitor component label", strings.Join(strs(sm, "spec", "podTargetLabels"), ","), "app.kubernetes.io/component")

	d = mustTemplate(t, "--set", "telemetry.podMonitor.enabled=true", "--set", "telemetry.podMonitor.interval=15s")
	pm := d.must(t, "PodMonitor", release)
	wantEqual(t, "PodMonitor interval", str(pm, "spec", "podMetricsEndpoints", "0", "interval"), "15s")
	for _, w := range [][2]string{{"DaemonSet", agentName}, {"Deployment", gatewayName}, {"StatefulSet", symbolsName}} {
		if !selects(mapping(pm, "spec", "selector", "matchLabels"), mapping(d.must(t, w[0], w[1]), "spec", "template", "metadata", "labels")) {
			t.Errorf("the PodMonitor does not select the %s pods", w[1])
		}
	}
	if _, err := template(t, "--set", "telemetry.podMonitor.enabled=true", "--set", "telemetry.serviceMonitor.enabled=true"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("both monitors: %v", err)
	}
}

// The symbol store's one pod has a PodDisruptionBudget (maxUnavailable 1
// by default: drains proceed, the store being off the samples' path), and
// none when there is no StatefulSet.
func TestSymbolsPDB(t *testing.T) {
	d := mustTemplate(t)
	pdb := d.must(t, "PodDisruptionBudget", symbolsName)
	wantEqual(t, "maxUnavailable", fmt.Sprint(get(pdb, "spec", "maxUnavailable")), "1")
	if !selects(mapping(pdb, "spec", "selector", "matchLabels"), mapping(d.must(t, "StatefulSet", symbolsName), "spec", "template", "metadata", "labels")) {
		t.Error("the PDB does not select the symbols pod")
	}
	if selects(mapping(pdb, "spec", "selector", "matchLabels"), mapping(d.must(t, "Deployment", gatewayName), "spec", "template", "metadata", "labels")) {
		t.Error("the symbols PDB selects gateway pods")
	}
	d = mustTemplate(t, "--set", "symbols.store.podDisruptionBudget.minAvailable=1")
	wantEqual(t, "minAvailable", fmt.Sprint(get(d.must(t, "PodDisruptionBudget", symbolsName), "spec", "minAvailable")), "1")
	for _, args := range [][]string{{"--set", "symbols.store.podDisruptionBudget.enabled=false"},
		{"--set", "symbols.store.s3.bucket=b", "--set", "symbols.store.s3.endpoint=s3:9000"}} {
		if mustTemplate(t, args...).find("PodDisruptionBudget", symbolsName) != nil {
			t.Errorf("symbols PDB with %v", args)
		}
	}
}

// The agent's priority: a PriorityClass of the chart's own on request, or
// an existing one by name.
func TestAgentPriorityClass(t *testing.T) {
	d := mustTemplate(t)
	if d.find("PriorityClass", agentName) != nil || get(d.must(t, "DaemonSet", agentName), "spec", "template", "spec", "priorityClassName") != nil {
		t.Error("a priority class by default")
	}
	d = mustTemplate(t, "--set", "priorityClass.create=true")
	pc := d.must(t, "PriorityClass", agentName)
	wantEqual(t, "value", fmt.Sprint(get(pc, "value")), "1000000")
	wantEqual(t, "globalDefault", get(pc, "globalDefault"), any(false))
	if get(pc, "metadata", "namespace") != nil {
		t.Error("PriorityClass is cluster-scoped")
	}
	wantEqual(t, "agent priorityClassName", str(d.must(t, "DaemonSet", agentName), "spec", "template", "spec", "priorityClassName"), agentName)
	d = mustTemplate(t, "--set", "priorityClass.create=true", "--set", "agent.priorityClassName=node-critical-profilers")
	wantEqual(t, "named class wins", str(d.must(t, "DaemonSet", agentName), "spec", "template", "spec", "priorityClassName"), "node-critical-profilers")
}
