package helmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestOverrides(t *testing.T) {
	t.Run("pvc-cache", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.cache.persistence.enabled=true", "--set", "gateway.cache.persistence.storageClassName=shared")
		pvc := d.must(t, "PersistentVolumeClaim", gatewayName+"-cache")
		wantEqual(t, "storage", fmt.Sprint(get(pvc, "spec", "resources", "requests", "storage")), "4Gi")
		wantEqual(t, "storageClassName", str(pvc, "spec", "storageClassName"), "shared")
		found := false
		for _, v := range list(d.must(t, "Deployment", gatewayName), "spec", "template", "spec", "volumes") {
			if str(v, "name") == "cache" {
				found = true
				wantEqual(t, "cache claim", str(v, "persistentVolumeClaim", "claimName"), gatewayName+"-cache")
			}
		}
		if !found {
			t.Error("no cache volume")
		}
		// An existing claim: no PVC rendered, the claim is used.
		d = mustTemplate(t, "--set", "gateway.cache.persistence.enabled=true", "--set", "gateway.cache.persistence.existingClaim=mine")
		if d.find("PersistentVolumeClaim", gatewayName+"-cache") != nil {
			t.Error("PVC rendered although existingClaim is set")
		}
	})

	t.Run("backend", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.backend.endpoint=pyroscope.obs:4317")
		cfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
		wantEqual(t, "backend endpoint", str(cfg, "exporters", "otlp_grpc/backend", "endpoint"), "${env:PROFSYM_BACKEND_ENDPOINT}")
		exp := strs(cfg, "service", "pipelines", "profiles", "exporters")
		if !slices.Contains(exp, "otlp_grpc/backend") || !slices.Contains(exp, "file") {
			t.Errorf("profiles exporters = %v", exp)
		}
		wantEqual(t, "PROFSYM_BACKEND_ENDPOINT", str(env(container(d.must(t, "Deployment", gatewayName)))["PROFSYM_BACKEND_ENDPOINT"], "value"), "pyroscope.obs:4317")

		d = mustTemplate(t, "--set", "gateway.backend.endpoint=https://backend", "--set", "gateway.backend.protocol=http", "--set", "gateway.fileOutput.enabled=false")
		cfg = collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
		wantEqual(t, "exporters", strings.Join(strs(cfg, "service", "pipelines", "profiles", "exporters"), ","), "otlp_http/backend")
		if _, ok := env(container(d.must(t, "Deployment", gatewayName)))["PROFSYM_OUTPUT"]; ok {
			t.Error("PROFSYM_OUTPUT set with the file exporter off")
		}
	})

	t.Run("privileged", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.securityContext.privileged=true")
		sc := mapping(container(d.must(t, "DaemonSet", agentName)), "securityContext")
		if sc["privileged"] != true {
			t.Errorf("privileged = %v", sc["privileged"])
		}
		if _, ok := sc["allowPrivilegeEscalation"]; ok {
			t.Error("allowPrivilegeEscalation set on a privileged container (the API server rejects false)")
		}
	})

	t.Run("sys-admin", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.securityContext.sysAdmin=true", "--set", "agent.securityContext.sysResource=false")
		sc := mapping(container(d.must(t, "DaemonSet", agentName)), "securityContext")
		add := strs(sc, "capabilities", "add")
		if !slices.Contains(add, "SYS_ADMIN") || slices.Contains(add, "SYS_RESOURCE") {
			t.Errorf("capabilities.add = %v", add)
		}
		if _, ok := sc["allowPrivilegeEscalation"]; ok {
			t.Error("allowPrivilegeEscalation set with SYS_ADMIN (the API server rejects false)")
		}
		wantEqual(t, "privileged", sc["privileged"], any(false))
	})

	t.Run("hpa-disabled", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.autoscaling.enabled=false", "--set", "gateway.replicas=3")
		if d.find("HorizontalPodAutoscaler", gatewayName) != nil {
			t.Error("HPA rendered although disabled")
		}
		wantEqual(t, "replicas", get(d.must(t, "Deployment", gatewayName), "spec", "replicas"), any(3))
		d.must(t, "PodDisruptionBudget", gatewayName)
	})

	t.Run("debuginfod-urls", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.symbolization.debuginfodURLs={https://debuginfod.debian.net,https://debuginfod.ubuntu.com}")
		wantEqual(t, "DEBUGINFOD_URLS", str(env(container(d.must(t, "Deployment", gatewayName)))["DEBUGINFOD_URLS"], "value"),
			"https://debuginfod.debian.net https://debuginfod.ubuntu.com")
	})

	t.Run("pick-first", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.exporter.balancer=pick_first")
		checkAgentTargetsGateway(t, d, false)
	})

	t.Run("profile-events", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.profileEvents.enabled=true", "--set", "gateway.profileEvents.enabled=true")
		if get(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "service", "pipelines", "logs") == nil {
			t.Error("agent has no logs pipeline")
		}
		gw := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
		// One processor in both pipelines: the collector shares its
		// symbolizer (caches, debuginfod client) between them.
		if !slices.Contains(strs(gw, "service", "pipelines", "logs", "processors"), "symbolization") {
			t.Errorf("gateway logs pipeline = %v", get(gw, "service", "pipelines", "logs"))
		}
	})

	t.Run("config-merge", func(t *testing.T) {
		d1 := mustTemplate(t)
		d2 := mustTemplate(t, "--set", "gateway.config.processors.symbolization.demangle=none",
			"--set", "agent.config.receivers.profiling.sample_rate=49")
		gw := collectorConfig(t, d2.must(t, "ConfigMap", gatewayName))
		wantEqual(t, "merged demangle", str(gw, "processors", "symbolization", "demangle"), "none")
		if get(gw, "processors", "symbolization", "debuginfod", "cache_dir") == nil {
			t.Error("merge dropped generated keys")
		}
		wantEqual(t, "merged sample_rate", get(collectorConfig(t, d2.must(t, "ConfigMap", agentName)), "receivers", "profiling", "sample_rate"), any(49))
		// A config change rolls the pods.
		ck := func(d docs, kind, name string) string {
			return str(d.must(t, kind, name), "spec", "template", "metadata", "annotations", "checksum/config")
		}
		if ck(d1, "Deployment", gatewayName) == ck(d2, "Deployment", gatewayName) || ck(d1, "DaemonSet", agentName) == ck(d2, "DaemonSet", agentName) {
			t.Error("checksum/config did not change with the configuration")
		}
	})

	t.Run("config-replace", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		os.WriteFile(values, []byte(`
gateway:
  configMode: replace
  config:
    receivers: {otlp: {protocols: {grpc: {endpoint: "0.0.0.0:4317"}}}}
    exporters: {debug: {}}
    service: {pipelines: {profiles: {receivers: [otlp], exporters: [debug]}}}
`), 0o644)
		d := mustTemplate(t, "-f", values)
		gw := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
		if get(gw, "processors") != nil || get(gw, "exporters", "debug") == nil {
			t.Errorf("replace mode kept generated keys: %v", gw)
		}
	})

	t.Run("nulls", func(t *testing.T) {
		d := mustTemplate(t, "--set", "agent.securityContext.appArmorProfile=null",
			"--set", "gateway.autoscaling.targetMemoryUtilizationPercentage=null",
			"--set", "gateway.podDisruptionBudget.minAvailable=50%")
		if get(container(d.must(t, "DaemonSet", agentName)), "securityContext", "appArmorProfile") != nil {
			t.Error("appArmorProfile rendered although null")
		}
		if m := list(d.must(t, "HorizontalPodAutoscaler", gatewayName), "spec", "metrics"); len(m) != 1 || str(m[0], "resource", "name") != "cpu" {
			t.Errorf("HPA metrics = %v, want cpu only", m)
		}
		pdb := mapping(d.must(t, "PodDisruptionBudget", gatewayName), "spec")
		if pdb["minAvailable"] != "50%" || pdb["maxUnavailable"] != nil {
			t.Errorf("PDB spec = %v", pdb)
		}
	})

	t.Run("custom-spread", func(t *testing.T) {
		d := mustTemplate(t, "--set", "gateway.topologySpreadConstraints[0].maxSkew=2",
			"--set", "gateway.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
			"--set", "gateway.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule")
		dep := d.must(t, "Deployment", gatewayName)
		tsc := list(dep, "spec", "template", "spec", "topologySpreadConstraints")
		if len(tsc) != 1 || get(tsc[0], "maxSkew") != 2 {
			t.Fatalf("topologySpreadConstraints = %v", tsc)
		}
		if !selects(mapping(tsc[0], "labelSelector", "matchLabels"), mapping(dep, "spec", "template", "metadata", "labels")) {
			t.Error("labelSelector not filled in")
		}
	})
}

func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string // in helm's error
	}{
		{[]string{"gateway.replicas=-1"}, "replicas"},
		{[]string{"gateway.replicas=two"}, "replicas"},
		{[]string{"agent.profiling.sampleRate=5000"}, "sampleRate"},
		{[]string{"agent.profiling.reportInterval=10"}, "reportInterval"},
		{[]string{"agent.exporter.balancer=random"}, "balancer"},
		{[]string{"gateway.symbolization.sources={local,remote}"}, "sources"},
		{[]string{"gateway.symbolization.debuginfodURLs={ftp://x}"}, "debuginfodURLs"},
		{[]string{"gateway.symbolization.demangle=short"}, "demangle"},
		{[]string{"gateway.autoscaling.maxReplicas=0"}, "maxReplicas"},
		{[]string{"gateway.cahce.sizeLimit=1Gi"}, "cahce"},
		{[]string{"image.pullPolicy=Sometimes"}, "pullPolicy"},
		{[]string{"featureGates={foo}"}, "featureGates"},
		{[]string{"agent.securityContext.extraCapabilities={CAP_BPF}"}, "extraCapabilities"},
		{[]string{"gateway.service.grpcPort=70000"}, "grpcPort"},
		// Checks in the templates rather than the schema.
		{[]string{"gateway.autoscaling.minReplicas=5", "gateway.autoscaling.maxReplicas=3"}, "minReplicas"},
		{[]string{"gateway.cache.persistence.enabled=true", "gateway.cache.persistence.accessModes={ReadWriteOnce}"}, "ReadWriteMany"},
		{[]string{"gateway.fileOutput.enabled=false"}, "nothing to export"},
		{[]string{"gateway.symbolization.cache.maxBytes=1000000000"}, "soft limit"},
		{[]string{"gateway.resources.limits.memory=512Mi", "gateway.symbolization.cache.memoryPercentage=90"}, "soft limit"},
		{[]string{"gateway.symbolization.cache.memoryPercentage=0"}, "memoryPercentage"},
		{[]string{"gateway.goMemLimitPercentage=150"}, "goMemLimitPercentage"},
		{[]string{"gateway.resources.limits.memory=lots"}, "memory"},
	} {
		t.Run(strings.Join(tc.set, ","), func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			_, err := template(t, args...)
			if err == nil {
				t.Fatalf("helm template --set %v succeeded", tc.set)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
	// A single-replica gateway may use a ReadWriteOnce claim.
	if _, err := template(t, "--set", "gateway.cache.persistence.enabled=true", "--set", "gateway.cache.persistence.accessModes={ReadWriteOnce}",
		"--set", "gateway.autoscaling.enabled=false", "--set", "gateway.replicas=1"); err != nil {
		t.Error(err)
	}
}
