package helmtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
		"--set", "pprof.enabled=true",
		"--set", "tls.enabled=true", "--set", "tls.existingSecret=tls",
		"--set", "telemetry.serviceMonitor.enabled=true",
		"--set", "priorityClass.create=true",
		"--set", "gateway.jfr.enabled=true")
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
		// The agent's ClusterRole (kubernetesMetadata) is the only RBAC
		// (TestKubernetesMetadataRBAC).
		if o["kind"] == "PersistentVolumeClaim" || o["kind"] == "Role" {
			t.Errorf("unexpected %v %s by default", o["kind"], str(o, "metadata", "name"))
		}
		if o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding" {
			continue
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
