package helmtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/profsym/profsym/internal/testfixture"
)

const release, namespace = "ps", "profiling"

// obj is one rendered Kubernetes object.
type obj = map[string]any

// docs is a rendered chart.
type docs []obj

var (
	helmOnce sync.Once
	helmPath string
)

// helm returns the helm binary (testfixture.Helm), looked up once.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() { helmPath = testfixture.Helm(t) })
	if helmPath == "" {
		testfixture.SkipOrFail(t, "helm is not installed (go install helm.sh/helm/v3/cmd/helm@v3.22.0)")
	}
	return helmPath
}

func chartDir(t *testing.T) string {
	return filepath.Join(testfixture.Root(t), "deploy", "helm", "profsym")
}

// template runs helm template with the given extra arguments.
func template(t *testing.T, args ...string) (docs, error) {
	t.Helper()
	cmdArgs := append([]string{"template", release, chartDir(t), "--namespace", namespace}, args...)
	cmd := exec.Command(helm(t), cmdArgs...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %v\n%s", strings.Join(cmdArgs, " "), err, stderr.String())
	}
	var out docs
	dec := yaml.NewDecoder(&stdout)
	for {
		var o obj
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("parsing helm template output: %v", err)
		}
		if o != nil {
			out = append(out, o)
		}
	}
	return out, nil
}

func mustTemplate(t *testing.T, args ...string) docs {
	t.Helper()
	d, err := template(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// get walks maps by key and lists by index ("0").
func get(v any, path ...string) any {
	for _, p := range path {
		switch x := v.(type) {
		case map[string]any:
			v = x[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

func str(v any, path ...string) string {
	s, _ := get(v, path...).(string)
	return s
}

func list(v any, path ...string) []any {
	l, _ := get(v, path...).([]any)
	return l
}

func mapping(v any, path ...string) map[string]any {
	switch m := get(v, path...).(type) {
	case map[string]any:
		return m
	}
	return nil
}

func strs(v any, path ...string) []string {
	var out []string
	for _, x := range list(v, path...) {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

// find returns the object of that kind and name, or nil.
func (d docs) find(kind, name string) obj {
	for _, o := range d {
		if o["kind"] == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

func (d docs) must(t *testing.T, kind, name string) obj {
	t.Helper()
	o := d.find(kind, name)
	if o == nil {
		t.Fatalf("no %s %q rendered; have %v", kind, name, d.names())
	}
	return o
}

func (d docs) names() []string {
	var n []string
	for _, o := range d {
		n = append(n, fmt.Sprintf("%v/%s", o["kind"], str(o, "metadata", "name")))
	}
	sort.Strings(n)
	return n
}

// container returns the first container of a workload.
func container(o obj) map[string]any {
	return mapping(o, "spec", "template", "spec", "containers", "0")
}

// env returns a container's env as name -> entry.
func env(c map[string]any) map[string]map[string]any {
	m := map[string]map[string]any{}
	for _, e := range list(c, "env") {
		m[str(e, "name")] = e.(map[string]any)
	}
	return m
}

// collectorConfig parses config.yaml of a ConfigMap.
func collectorConfig(t *testing.T, cm obj) map[string]any {
	t.Helper()
	text := str(cm, "data", "config.yaml")
	if text == "" {
		t.Fatalf("ConfigMap %s has no config.yaml", str(cm, "metadata", "name"))
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("config.yaml of %s: %v\n%s", str(cm, "metadata", "name"), err, text)
	}
	return m
}

// selects reports whether selector labels are a subset of labels.
func selects(selector, labels map[string]any) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func wantEqual[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

var (
	agentName   = release + "-agent"
	gatewayName = release + "-gateway"
	symbolsName = release + "-symbols"
)

func TestLint(t *testing.T) {
	cmd := exec.Command(helm(t), "lint", "--strict", chartDir(t))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm lint --strict: %v\n%s", err, out)
	}
	// Lint with the overrides the other tests use too.
	cmd = exec.Command(helm(t), "lint", "--strict", chartDir(t),
		"--set", "gateway.cache.persistence.enabled=true",
		"--set", "gateway.backend.endpoint=backend:4317",
		"--set", "agent.securityContext.privileged=true",
		"--set", "gateway.autoscaling.enabled=false",
		"--set", "pprof.enabled=true")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm lint --strict with overrides: %v\n%s", err, out)
	}
}

func TestDefaults(t *testing.T) {
	d := mustTemplate(t)
	t.Logf("rendered: %v", d.names())
	for _, want := range [][2]string{
		{"DaemonSet", agentName}, {"Deployment", gatewayName},
		{"HorizontalPodAutoscaler", gatewayName}, {"Service", gatewayName},
		{"Service", gatewayName + "-headless"}, {"PodDisruptionBudget", gatewayName},
		{"ConfigMap", agentName}, {"ConfigMap", gatewayName}, {"ServiceAccount", release},
	} {
		d.must(t, want[0], want[1])
	}
	for _, o := range d {
		if o["kind"] == "PersistentVolumeClaim" || o["kind"] == "ClusterRole" || o["kind"] == "Role" {
			t.Errorf("unexpected %v %s by default", o["kind"], str(o, "metadata", "name"))
		}
		if ns := str(o, "metadata", "namespace"); ns != namespace {
			t.Errorf("%v %s in namespace %q, want %q", o["kind"], str(o, "metadata", "name"), ns, namespace)
		}
	}
	t.Run("agent", func(t *testing.T) { checkAgent(t, d) })
	t.Run("gateway", func(t *testing.T) { checkGateway(t, d) })
	t.Run("agent-to-gateway", func(t *testing.T) { checkAgentTargetsGateway(t, d, true) })
}

func checkAgent(t *testing.T, d docs) {
	ds := d.must(t, "DaemonSet", agentName)
	pod := mapping(ds, "spec", "template", "spec")
	if pod["hostPID"] != true {
		t.Errorf("hostPID = %v, want true", pod["hostPID"])
	}
	if !selects(mapping(ds, "spec", "selector", "matchLabels"), mapping(ds, "spec", "template", "metadata", "labels")) {
		t.Error("DaemonSet selector does not match its pod labels")
	}
	if !slices.ContainsFunc(list(pod, "tolerations"), func(x any) bool {
		return str(x, "operator") == "Exists" && str(x, "key") == "" && str(x, "effect") == ""
	}) {
		t.Errorf("tolerations %v do not tolerate every taint", pod["tolerations"])
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(str(ds, "spec", "template", "metadata", "annotations", "checksum/config")) {
		t.Error("no checksum/config annotation on agent pods")
	}

	c := container(ds)
	if !slices.Contains(strs(c, "args"), "--feature-gates=service.profilesSupport") {
		t.Errorf("agent args %v lack the profiles feature gate", c["args"])
	}
	sc := mapping(c, "securityContext")
	if sc["privileged"] != false {
		t.Errorf("privileged = %v, want false", sc["privileged"])
	}
	if sc["allowPrivilegeEscalation"] != false {
		t.Errorf("allowPrivilegeEscalation = %v, want false", sc["allowPrivilegeEscalation"])
	}
	add := strs(sc, "capabilities", "add")
	sort.Strings(add)
	want := []string{"BPF", "DAC_READ_SEARCH", "PERFMON", "SYSLOG", "SYS_PTRACE", "SYS_RESOURCE"}
	if !slices.Equal(add, want) {
		t.Errorf("capabilities.add = %v, want %v", add, want)
	}
	if drop := strs(sc, "capabilities", "drop"); !slices.Equal(drop, []string{"ALL"}) {
		t.Errorf("capabilities.drop = %v, want [ALL]", drop)
	}

	// Host paths, each mounted read-only.
	hostPaths := map[string]string{} // volume name -> host path
	for _, v := range list(pod, "volumes") {
		if p := str(v, "hostPath", "path"); p != "" {
			hostPaths[str(v, "name")] = p
		}
	}
	mounted := map[string]bool{} // host path -> mounted read-only
	for _, m := range list(c, "volumeMounts") {
		if p, ok := hostPaths[str(m, "name")]; ok {
			mounted[p] = get(m, "readOnly") == true
		}
	}
	for _, p := range []string{"/proc", "/sys/kernel/btf", "/sys/kernel/notes", "/sys/module", "/sys/fs/cgroup"} {
		ro, ok := mounted[p]
		switch {
		case !ok:
			t.Errorf("host %s is not mounted (host paths mounted: %v)", p, mounted)
		case !ro:
			t.Errorf("host %s is mounted read-write", p)
		}
	}

	for k, v := range map[string]string{"requests.cpu": "100m", "requests.memory": "256Mi", "limits.cpu": "500m", "limits.memory": "512Mi"} {
		kind, res, _ := strings.Cut(k, ".")
		wantEqual(t, "agent resources."+k, fmt.Sprint(get(c, "resources", kind, res)), v)
	}

	e := env(c)
	wantEqual(t, "HOST_NAME fieldPath", str(e["HOST_NAME"], "valueFrom", "fieldRef", "fieldPath"), "spec.nodeName")
	if str(e["PROFSYM_GATEWAY_ENDPOINT"], "value") == "" {
		t.Error("PROFSYM_GATEWAY_ENDPOINT is not set")
	}
	if get(c, "readinessProbe", "httpGet") == nil || get(c, "livenessProbe", "httpGet") == nil {
		t.Error("agent lacks health_check probes")
	}

	cfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	if mapping(cfg, "receivers", "profiling") == nil {
		t.Error("agent config has no profiling receiver")
	}
	for name := range mapping(cfg, "processors") {
		if strings.HasPrefix(name, "symbolization") {
			t.Errorf("agent config runs %s; the gateway symbolizes", name)
		}
	}
	wantEqual(t, "agent otlp_grpc endpoint", str(cfg, "exporters", "otlp_grpc", "endpoint"), "${env:PROFSYM_GATEWAY_ENDPOINT}")
	p := mapping(cfg, "service", "pipelines", "profiles")
	if !slices.Contains(strs(p, "receivers"), "profiling") || !slices.Contains(strs(p, "exporters"), "otlp_grpc") {
		t.Errorf("agent profiles pipeline = %v", p)
	}
	wantEqual(t, "health_check endpoint", str(cfg, "extensions", "health_check", "endpoint"), "${env:MY_POD_IP}:13133")
}

func checkGateway(t *testing.T, d docs) {
	dep := d.must(t, "Deployment", gatewayName)
	pod := mapping(dep, "spec", "template", "spec")
	podLabels := mapping(dep, "spec", "template", "metadata", "labels")
	if !selects(mapping(dep, "spec", "selector", "matchLabels"), podLabels) {
		t.Error("Deployment selector does not match its pod labels")
	}
	if _, ok := mapping(dep, "spec")["replicas"]; ok {
		t.Error("Deployment sets replicas although the HPA owns them")
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(str(dep, "spec", "template", "metadata", "annotations", "checksum/config")) {
		t.Error("no checksum/config annotation on gateway pods")
	}
	c := container(dep)
	if !slices.Contains(strs(c, "args"), "--feature-gates=service.profilesSupport") {
		t.Errorf("gateway args %v lack the profiles feature gate", c["args"])
	}
	ports := map[string]int{}
	for _, p := range list(c, "ports") {
		ports[str(p, "name")] = get(p, "containerPort").(int)
	}
	wantEqual(t, "health port", ports["health"], 13133)
	wantEqual(t, "otlp-grpc port", ports["otlp-grpc"], 4317)
	wantEqual(t, "otlp-http port", ports["otlp-http"], 4318)
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		wantEqual(t, probe+" port", fmt.Sprint(get(c, probe, "httpGet", "port")), "health")
	}
	e := env(c)
	wantEqual(t, "PROFSYM_GATEWAY_LISTEN", str(e["PROFSYM_GATEWAY_LISTEN"], "value"), "0.0.0.0:4317")
	if _, ok := e["DEBUGINFOD_URLS"]; !ok {
		t.Error("DEBUGINFOD_URLS is not set")
	}
	if _, ok := e["PROFSYM_BACKEND_ENDPOINT"]; ok {
		t.Error("PROFSYM_BACKEND_ENDPOINT set without gateway.backend.endpoint")
	}
	if get(c, "resources", "requests", "memory") == nil || get(c, "resources", "limits", "memory") == nil {
		t.Error("gateway resources are not set")
	}

	// The cache volume (emptyDir by default) holds debuginfod's cache_dir.
	var cacheVol map[string]any
	for _, v := range list(pod, "volumes") {
		if str(v, "name") == "cache" {
			cacheVol = v.(map[string]any)
		}
	}
	if cacheVol == nil || cacheVol["emptyDir"] == nil {
		t.Errorf("cache volume = %v, want an emptyDir", cacheVol)
	}
	cacheMount := ""
	for _, m := range list(c, "volumeMounts") {
		if str(m, "name") == "cache" {
			cacheMount = str(m, "mountPath")
		}
	}

	cfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	sym := mapping(cfg, "processors", "symbolization")
	if sym == nil {
		t.Fatal("gateway config has no symbolization processor")
	}
	if dir := str(sym, "debuginfod", "cache_dir"); cacheMount == "" || !strings.HasPrefix(dir, cacheMount+"/") {
		t.Errorf("debuginfod cache_dir %q is not on the cache volume (%q)", dir, cacheMount)
	}
	if get(sym, "cache", "max_bytes") == nil {
		t.Error("symbolization cache.max_bytes is not set")
	}
	if slices.Contains(strs(sym, "sources"), "local") {
		t.Error("gateway symbolization lists the local source")
	}
	p := mapping(cfg, "service", "pipelines", "profiles")
	if !slices.Contains(strs(p, "processors"), "symbolization") || !slices.Contains(strs(p, "receivers"), "otlp") {
		t.Errorf("gateway profiles pipeline = %v", p)
	}
	wantEqual(t, "gateway exporters", strings.Join(strs(p, "exporters"), ","), "file")
	wantEqual(t, "file path", str(cfg, "exporters", "file", "path"), "${env:PROFSYM_OUTPUT}")
	if !strings.HasPrefix(str(cfg, "receivers", "otlp", "protocols", "grpc", "endpoint"), "${env:PROFSYM_GATEWAY_LISTEN") {
		t.Errorf("otlp grpc endpoint = %q", str(cfg, "receivers", "otlp", "protocols", "grpc", "endpoint"))
	}
	if get(cfg, "receivers", "otlp", "protocols", "grpc", "keepalive", "server_parameters", "max_connection_age") == nil {
		t.Error("no max_connection_age: agents would never rebalance onto new gateway pods")
	}

	// Service, PDB, HPA and spread all target the gateway pods.
	svc := d.must(t, "Service", gatewayName)
	wantEqual(t, "Service type", str(svc, "spec", "type"), "ClusterIP")
	if !selects(mapping(svc, "spec", "selector"), podLabels) {
		t.Error("gateway Service does not select the gateway pods")
	}
	svcPorts := map[int]string{}
	for _, p := range list(svc, "spec", "ports") {
		svcPorts[get(p, "port").(int)] = str(p, "targetPort")
	}
	wantEqual(t, "Service 4317 target", svcPorts[4317], "otlp-grpc")
	wantEqual(t, "Service 4318 target", svcPorts[4318], "otlp-http")
	if !selects(mapping(d.must(t, "PodDisruptionBudget", gatewayName), "spec", "selector", "matchLabels"), podLabels) {
		t.Error("PDB does not select the gateway pods")
	}
	hpa := d.must(t, "HorizontalPodAutoscaler", gatewayName)
	wantEqual(t, "HPA apiVersion", str(hpa, "apiVersion"), "autoscaling/v2")
	wantEqual(t, "HPA target", str(hpa, "spec", "scaleTargetRef", "name"), gatewayName)
	wantEqual(t, "HPA target kind", str(hpa, "spec", "scaleTargetRef", "kind"), "Deployment")
	var resources []string
	for _, m := range list(hpa, "spec", "metrics") {
		resources = append(resources, str(m, "resource", "name"))
	}
	sort.Strings(resources)
	wantEqual(t, "HPA metrics", strings.Join(resources, ","), "cpu,memory")
	if min, max := get(hpa, "spec", "minReplicas"), get(hpa, "spec", "maxReplicas"); min != 2 || max != 10 {
		t.Errorf("HPA min/max = %v/%v, want 2/10", min, max)
	}
	tsc := list(pod, "topologySpreadConstraints")
	if len(tsc) == 0 {
		t.Error("no topology spread constraints on gateway pods")
	}
	for _, c := range tsc {
		if !selects(mapping(c, "labelSelector", "matchLabels"), podLabels) {
			t.Errorf("spread constraint %v does not select the gateway pods", c)
		}
	}
}

// checkAgentTargetsGateway follows the agent's PROFSYM_GATEWAY_ENDPOINT to
// a Service of this release that selects the gateway pods on its gRPC port.
func checkAgentTargetsGateway(t *testing.T, d docs, headless bool) {
	ep := str(env(container(d.must(t, "DaemonSet", agentName)))["PROFSYM_GATEWAY_ENDPOINT"], "value")
	cfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	balancer := str(cfg, "exporters", "otlp_grpc", "balancer_name")
	var host, port string
	if headless {
		m := regexp.MustCompile(`^dns:///([^.:]+)\.` + namespace + `\.svc\.cluster\.local:([0-9]+)$`).FindStringSubmatch(ep)
		if m == nil {
			t.Fatalf("agent endpoint %q is not dns:///<service>.%s.svc.cluster.local:<port>", ep, namespace)
		}
		host, port = m[1], m[2]
		wantEqual(t, "balancer_name", balancer, "round_robin")
	} else {
		var ok bool
		host, port, ok = strings.Cut(ep, ":")
		if !ok {
			t.Fatalf("agent endpoint %q is not host:port", ep)
		}
		wantEqual(t, "balancer_name", balancer, "pick_first")
	}
	svc := d.must(t, "Service", host)
	if isHeadless := str(svc, "spec", "clusterIP") == "None"; isHeadless != headless {
		t.Errorf("Service %s headless = %v, want %v", host, isHeadless, headless)
	}
	podLabels := mapping(d.must(t, "Deployment", gatewayName), "spec", "template", "metadata", "labels")
	if !selects(mapping(svc, "spec", "selector"), podLabels) {
		t.Errorf("Service %s does not select the gateway pods", host)
	}
	if !slices.ContainsFunc(list(svc, "spec", "ports"), func(p any) bool {
		return fmt.Sprint(get(p, "port")) == port && str(p, "targetPort") == "otlp-grpc"
	}) {
		t.Errorf("Service %s has no port %s to the gateway's otlp-grpc port", host, port)
	}
}

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

// collectorBinary returns the built distribution, or "".
func collectorBinary(t *testing.T) string {
	root := testfixture.Root(t)
	for _, p := range []string{"_build/otelcol-profsym", "_build/otelcol-profsym-src/otelcol-profsym"} {
		p = filepath.Join(root, p)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// TestCollectorValidate runs `otelcol-profsym validate` on the rendered
// configurations, with each container's arguments and environment.
func TestCollectorValidate(t *testing.T) {
	helm(t)
	bin := collectorBinary(t)
	if bin == "" {
		// make test builds it first, so under CI this is a failure.
		testfixture.SkipOrFail(t, "the otelcol-profsym distribution is not built (make otelcol)")
	}
	for name, args := range map[string][]string{
		"defaults": nil,
		"backend-events-pprof": {"--set", "gateway.backend.endpoint=backend.example:4317", "--set", "gateway.backend.headers.authorization=Bearer ${env:TOKEN}",
			"--set", "agent.profileEvents.enabled=true", "--set", "gateway.profileEvents.enabled=true", "--set", "pprof.enabled=true",
			"--set", "gateway.symbolization.debuginfodURLs={https://debuginfod.example}"},
		"http-backend-only": {"--set", "gateway.backend.endpoint=https://backend.example", "--set", "gateway.backend.protocol=http", "--set", "gateway.fileOutput.enabled=false"},
		"pick-first-targets": {"--set", "agent.exporter.balancer=pick_first", "--set", "agent.profiling.targets[0].process_name=^java$",
			"--set", "agent.profiling.targets[1].cgroup=/kubepods.slice/", "--set", "agent.profiling.targets[2].pids={1}"},
		"merged": {"--set", "gateway.config.processors.symbolization.demangle=none", "--set", "agent.config.receivers.profiling.sample_rate=49"},
		"symbols-s3-token": {"--set", "symbols.token.value=t0ken",
			"--set", "symbols.store.s3.bucket=symbols", "--set", "symbols.store.s3.endpoint=minio.storage:9000",
			"--set", "symbols.store.s3.existingSecret=s3-creds", "--set", "agent.symbolUpload.exclude={/opt/secret/**}"},
		"symbols-statefulset-token": {"--set", "symbols.token.existingSecret=tok", "--set", "symbols.store.persistence.enabled=false",
			"--set", "symbols.store.config.extensions.symbolstore.max_query_ids=5000"},
		"symbols-off": {"--set", "symbols.enabled=false"},
		"memory-4Gi":  {"--set", "gateway.resources.limits.memory=4Gi", "--set", "gateway.symbolization.limits.maxNameBytes=1024"},
	} {
		t.Run(name, func(t *testing.T) {
			d := mustTemplate(t, args...)
			workloads := [][2]string{{"DaemonSet", agentName}, {"Deployment", gatewayName}}
			if d.find("StatefulSet", symbolsName) != nil {
				workloads = append(workloads, [2]string{"StatefulSet", symbolsName})
			}
			for _, w := range workloads {
				if err := validate(t, bin, d, w[0], w[1]); err != nil {
					t.Error(err)
				}
			}
		})
	}
	// Controls: validate does read what the chart renders.
	for _, tc := range []struct{ set, kind, name, want string }{
		{"agent.config.receivers.profiling.sample_rate=5000", "DaemonSet", agentName, "sample_rate"},
		{"gateway.config.processors.symbolization.demangle=short", "Deployment", gatewayName, "demangle"},
		{"symbols.store.config.extensions.symbolstore.lease_duration=-1s", "StatefulSet", symbolsName, "lease_duration"},
		{"gateway.config.exporters.otlp_grpc/backend.balancer_name=nope", "Deployment", gatewayName, "nope"},
	} {
		args := []string{"--set", tc.set}
		if strings.Contains(tc.set, "backend") {
			args = append(args, "--set", "gateway.backend.endpoint=backend.example:4317")
		}
		err := validate(t, bin, mustTemplate(t, args...), tc.kind, tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate with %s: got %v, want an error about %s", tc.set, err, tc.want)
		}
	}
}

func validate(t *testing.T, bin string, d docs, kind, name string) error {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(str(d.must(t, "ConfigMap", name), "data", "config.yaml")), 0o644); err != nil {
		t.Fatal(err)
	}
	c := container(d.must(t, kind, name))
	args := []string{"validate"}
	for _, a := range strs(c, "args") {
		if strings.HasPrefix(a, "--config=") {
			a = "--config=" + cfg
		}
		args = append(args, a)
	}
	// The container's literal env; downward-API values get stand-ins.
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "MY_POD_IP=127.0.0.1", "HOST_NAME=node-1", "TOKEN=secret"}
	for n, e := range env(c) {
		if v, ok := e["value"].(string); ok {
			if n == "PROFSYM_OUTPUT" {
				v = filepath.Join(dir, "out", "profiles.jsonl")
			}
			environ = append(environ, n+"="+v)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		b, _ := os.ReadFile(cfg)
		return fmt.Errorf("%s %s: %v\n%s\nconfig:\n%s", bin, strings.Join(args, " "), err, out, b)
	}
	return nil
}

// Symbols are on by default, in a StatefulSet of one pod that owns a
// ReadWriteOnce volume and serves the store: the agents upload to its
// Service, every gateway replica reads it over HTTP (the symbolstore
// extension in remote mode, through the symbol_store source), and the token
// is mounted in all three.
func TestSymbols(t *testing.T) {
	d := mustTemplate(t, "--set", "symbols.token.value=t0ken")
	sec := d.must(t, "Secret", release+"-symbols-token")
	wantEqual(t, "token secret data", str(sec, "data", "token"), "dDBrZW4=")
	const url = "http://ps-symbols.profiling.svc.cluster.local:8002"

	sts := d.must(t, "StatefulSet", symbolsName)
	wantEqual(t, "replicas", fmt.Sprint(get(sts, "spec", "replicas")), "1")
	claim := get(sts, "spec", "volumeClaimTemplates", "0")
	wantEqual(t, "claim", str(claim, "metadata", "name"), "data")
	wantEqual(t, "claim access", fmt.Sprint(strs(claim, "spec", "accessModes")), "[ReadWriteOnce]")
	wantEqual(t, "claim size", str(claim, "spec", "resources", "requests", "storage"), "20Gi")
	sc := container(sts)
	wantEqual(t, "store listens", str(env(sc)["PROFSYM_SYMBOLS_LISTEN"], "value"), "0.0.0.0:8002")
	mounts := map[string]string{}
	for _, m := range list(sc, "volumeMounts") {
		mounts[str(m, "name")] = str(m, "mountPath")
	}
	if mounts["data"] != "/var/lib/profsym/symbols" || mounts["symbols-token"] != "/etc/profsym-symbols" {
		t.Errorf("store mounts: %v", mounts)
	}
	scfg := collectorConfig(t, d.must(t, "ConfigMap", symbolsName))
	wantEqual(t, "store directory", str(scfg, "extensions", "symbolstore", "storage", "directory"), "/var/lib/profsym/symbols")
	wantEqual(t, "store auth", str(scfg, "extensions", "symbolstore", "auth", "authenticator"), "bearertokenauth/symbols")
	// The store cannot fill its volume: 90% of persistence.size.
	wantEqual(t, "store max_stored_bytes", fmt.Sprint(get(scfg, "extensions", "symbolstore", "max_stored_bytes")), fmt.Sprint(int64(20<<30)*9/10))
	wantEqual(t, "store max_objects", fmt.Sprint(get(scfg, "extensions", "symbolstore", "max_objects")), "500000")
	if !slices.Contains(strs(scfg, "service", "extensions"), "symbolstore") {
		t.Errorf("the store pod does not run the store: %v", scfg["service"])
	}
	svc := d.must(t, "Service", symbolsName)
	wantEqual(t, "store service port", fmt.Sprint(get(svc, "spec", "ports", "0", "port")), "8002")
	wantEqual(t, "store service selects", str(svc, "spec", "selector", "app.kubernetes.io/component"), "symbols")

	gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	wantEqual(t, "gateway reads the store", str(gcfg, "extensions", "symbolstore", "storage", "remote", "endpoint"), url)
	wantEqual(t, "gateway's token", str(gcfg, "extensions", "symbolstore", "storage", "remote", "auth", "authenticator"), "bearertokenauth/symbols")
	wantEqual(t, "processor reads the store", str(gcfg, "processors", "symbolization", "symbol_store"), "symbolstore")
	if !slices.Contains(strs(gcfg, "service", "extensions"), "symbolstore") || !slices.Contains(strs(gcfg, "processors", "symbolization", "sources"), "symbol_store") {
		t.Errorf("gateway does not read the store: %v", gcfg["service"])
	}
	gw := container(d.must(t, "Deployment", gatewayName))
	if _, ok := env(gw)["PROFSYM_SYMBOLS_LISTEN"]; ok {
		t.Error("gateways listen for uploads with the StatefulSet store")
	}
	for _, p := range list(d.must(t, "Service", gatewayName), "spec", "ports") {
		if str(p, "name") == "symbols" {
			t.Error("the gateway Service has a symbols port with the StatefulSet store")
		}
	}

	ag := d.must(t, "DaemonSet", agentName)
	acfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	wantEqual(t, "upload endpoint", str(acfg, "processors", "symbolupload", "endpoint"), url)
	wantEqual(t, "agent token file", str(acfg, "extensions", "bearertokenauth/symbols", "filename"), "/etc/profsym-symbols/token")
	if !slices.Contains(strs(acfg, "service", "pipelines", "profiles", "processors"), "symbolupload") {
		t.Error("symbolupload not in the agent's pipeline")
	}
	vols := map[string]bool{}
	for _, v := range list(ag, "spec", "template", "spec", "volumes") {
		vols[str(v, "name")] = str(v, "secret", "secretName") == release+"-symbols-token" || str(v, "name") == "symbols-scratch"
	}
	if !vols["symbols-token"] || !vols["symbols-scratch"] {
		t.Errorf("agent volumes: %v", vols)
	}

	// Persistence off: an emptyDir; an existing claim: that claim.
	d = mustTemplate(t, "--set", "symbols.store.persistence.enabled=false")
	sts = d.must(t, "StatefulSet", symbolsName)
	if get(sts, "spec", "volumeClaimTemplates") != nil || str(volume(sts, "data"), "emptyDir", "sizeLimit") != "20Gi" {
		t.Errorf("without persistence: %v", volume(sts, "data"))
	}
	d = mustTemplate(t, "--set", "symbols.store.persistence.enabled=false", "--set", "symbols.store.sizeLimit=1Gi")
	wantEqual(t, "store max_stored_bytes on an emptyDir", fmt.Sprint(get(collectorConfig(t, d.must(t, "ConfigMap", symbolsName)), "extensions", "symbolstore", "max_stored_bytes")), fmt.Sprint(int64(1<<30)*9/10))
	d = mustTemplate(t, "--set", "symbols.store.persistence.existingClaim=symbols-pvc")
	if str(volume(d.must(t, "StatefulSet", symbolsName), "data"), "persistentVolumeClaim", "claimName") != "symbols-pvc" {
		t.Error("existing claim not used")
	}

	// Off: nothing of it.
	d = mustTemplate(t, "--set", "symbols.enabled=false", "--set", "symbols.token.value=t0ken")
	if d.find("Secret", release+"-symbols-token") != nil || d.find("StatefulSet", symbolsName) != nil || d.find("Service", symbolsName) != nil ||
		mapping(collectorConfig(t, d.must(t, "ConfigMap", gatewayName)), "extensions", "symbolstore") != nil ||
		mapping(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "symbolupload") != nil {
		t.Error("symbols rendered while disabled")
	}
}

// With a bucket, every gateway replica runs the store over it and serves
// uploads on the gateway Service; no StatefulSet.
func TestSymbolsS3(t *testing.T) {
	d := mustTemplate(t, "--set", "symbols.token.value=t0ken",
		"--set", "symbols.store.s3.bucket=symbols", "--set", "symbols.store.s3.endpoint=minio.storage:9000",
		"--set", "symbols.store.s3.existingSecret=s3-creds")
	if d.find("StatefulSet", symbolsName) != nil || d.find("Service", symbolsName) != nil {
		t.Error("a StatefulSet store with S3")
	}
	gw := container(d.must(t, "Deployment", gatewayName))
	e := env(gw)
	wantEqual(t, "PROFSYM_SYMBOLS_LISTEN", str(e["PROFSYM_SYMBOLS_LISTEN"], "value"), "0.0.0.0:8002")
	wantEqual(t, "S3 secret key from", str(e["PROFSYM_SYMBOLS_S3_SECRET_KEY"], "valueFrom", "secretKeyRef", "name"), "s3-creds")
	gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	wantEqual(t, "store bucket", str(gcfg, "extensions", "symbolstore", "storage", "s3", "bucket"), "symbols")
	wantEqual(t, "store auth", str(gcfg, "extensions", "symbolstore", "auth", "authenticator"), "bearertokenauth/symbols")
	wantEqual(t, "scratch", str(gcfg, "extensions", "symbolstore", "storage", "scratch_directory"), "/var/lib/profsym/symbols")
	found := false
	for _, p := range list(d.must(t, "Service", gatewayName), "spec", "ports") {
		found = found || (str(p, "name") == "symbols" && fmt.Sprint(get(p, "port")) == "8002")
	}
	if !found {
		t.Error("the gateway Service has no symbols port")
	}
	wantEqual(t, "upload endpoint", str(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "symbolupload", "endpoint"),
		"http://ps-gateway.profiling.svc.cluster.local:8002")
	if _, err := template(t, "--set", "symbols.store.s3.bucket=symbols"); err == nil || !strings.Contains(err.Error(), "s3.endpoint") {
		t.Errorf("bucket without endpoint: %v", err)
	}
}

// volume returns a workload's pod volume by name.
func volume(o obj, name string) map[string]any {
	for _, v := range list(o, "spec", "template", "spec", "volumes") {
		if str(v, "name") == name {
			return v.(map[string]any)
		}
	}
	return nil
}
