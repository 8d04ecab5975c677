package e2e

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/profsym/profsym/internal/testfixture"
)

// TestKubernetesSelection runs the built distribution with the chart's
// agent configuration, whose one target selects the pods of namespace shop
// labelled app=web, against a real kube-apiserver, authenticated with the
// chart's agent ServiceAccount and limited by its ClusterRole. Four busy
// processes run in cgroups named as the kubelet names them: web (shop,
// app=web), api (shop, app=api), batch (namespace jobs, app=web) and one
// outside any pod. Only web's samples reach the output, and the others'
// are counted not_selected in the kernel, before any walk. Then api's pod
// is relabelled app=web: its process is selected from then on (a rescan of
// the cgroups and a new decision after sampling), with no restart. A second
// target selects the namespaces labelled team=batch: batch's namespace gains
// the label last, and batch's process is selected from then on.
func TestKubernetesSelection(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the agent's eBPF sampler and the test's cgroups need root")
	}
	const jobsNS = "jobs"
	web := &k8sFixture{
		deployment: "web", hash: "6b7c8d9f5", container: "app", driver: "systemd",
		containerID: "0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7",
	}
	apiPod := &k8sFixture{
		deployment: "api", hash: "5f6d7c8b9", container: "server", driver: "cgroupfs",
		containerID: "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
	}
	// In another namespace, with the selected label: the namespace
	// leaves it out.
	batch := &k8sFixture{
		deployment: "web", hash: "7d8e9f0a1", container: "worker", driver: "systemd", ns: jobsNS,
		containerID: "b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9a0",
	}
	host := &k8sFixture{}
	fixtures := []*k8sFixture{web, apiPod, batch, host}
	k := startK8sAgent(t, fixtures, []string{jobsNS}, nil,
		"--set-string", "agent.profiling.targets[0].kubernetes.pod_labels=app=web",
		"--set-string", "agent.profiling.targets[1].kubernetes.namespace_labels=team=batch")
	api, out, metrics, agent := k.api, k.out, k.metrics, k.agent

	pids := map[int64]bool{}
	for _, f := range fixtures {
		pids[int64(f.pid)] = true
	}
	// Until web is in the output, then 4 s more.
	for deadline := time.Now().Add(time.Minute); load(t, out, pids).samples[int64(web.pid)] == 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no sample of the selected pod's process in a minute; agent log:\n%s", tail(agent.log.String(), 4000))
		}
	}
	left := []*k8sFixture{apiPod, batch, host}
	cpuLeft := func() (d time.Duration) {
		for _, f := range left {
			d += cpuTime(t, f.pid)
		}
		return d
	}
	before, cpuBefore := selectionVerdicts(t, metrics), cpuLeft()
	time.Sleep(4 * time.Second)
	ty := load(t, out, pids)
	after, cpuAfter := selectionVerdicts(t, metrics), cpuLeft()
	t.Logf("web %d, api %d, batch %d, host %d samples; verdicts %v -> %v while the processes left out ran %v", ty.samples[int64(web.pid)], ty.samples[int64(apiPod.pid)],
		ty.samples[int64(batch.pid)], ty.samples[int64(host.pid)], before, after, cpuAfter-cpuBefore)
	for _, f := range left {
		if n := ty.samples[int64(f.pid)]; n != 0 {
			t.Errorf("%d samples of %s (pid %d), which the target does not select", n, describeFixture(f), f.pid)
		}
	}
	// The processes left out are sampled at 99 Hz of their CPU time, and
	// dropped in the kernel (the time read lags the samples by a report
	// at most): half of that is asked, as in TestCollectorCgroupSelection.
	// The verdicts scraped lag by up to a report too, so the window's
	// counts are compared with its CPU time less a second of it.
	cpu := cpuAfter - cpuBefore
	want := (cpu.Seconds() - 1) * 99 / 2
	if got := after["cpu/not_selected"] - before["cpu/not_selected"]; got < want {
		t.Errorf("%v samples not selected in the kernel while the processes left out ran %v, want at least %.0f", got, cpu, want)
	}

	// api's pod gains the label: selected from the next rescan on.
	api.do(t, "PUT", "/api/v1/namespaces/"+k8sAppNS+"/pods/"+apiPod.podName, relabel(t, api, apiPod, "web"))
	for deadline := time.Now().Add(30 * time.Second); load(t, out, pids).samples[int64(apiPod.pid)] == 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("api's process not selected 30 s after its pod was labelled app=web; agent log:\n%s", tail(agent.log.String(), 4000))
		}
	}
	ty = load(t, out, pids)
	t.Logf("after the relabel: web %d, api %d, batch %d, host %d samples", ty.samples[int64(web.pid)], ty.samples[int64(apiPod.pid)],
		ty.samples[int64(batch.pid)], ty.samples[int64(host.pid)])
	if ty.samples[int64(batch.pid)] != 0 || ty.samples[int64(host.pid)] != 0 {
		t.Errorf("batch or host sampled after the relabel")
	}

	// batch's namespace gains the second target's label.
	nsObj := api.do(t, "GET", "/api/v1/namespaces/"+jobsNS, nil)
	meta := nsObj["metadata"].(map[string]any)
	if meta["labels"] == nil {
		meta["labels"] = map[string]any{}
	}
	meta["labels"].(map[string]any)["team"] = "batch"
	api.do(t, "PUT", "/api/v1/namespaces/"+jobsNS, nsObj)
	for deadline := time.Now().Add(30 * time.Second); load(t, out, pids).samples[int64(batch.pid)] == 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("batch's process not selected 30 s after its namespace was labelled team=batch; agent log:\n%s", tail(agent.log.String(), 4000))
		}
	}
	agent.stop(t)
	ty = load(t, out, pids)
	t.Logf("after the namespace label: web %d, api %d, batch %d, host %d samples", ty.samples[int64(web.pid)], ty.samples[int64(apiPod.pid)],
		ty.samples[int64(batch.pid)], ty.samples[int64(host.pid)])
	if ty.samples[int64(host.pid)] != 0 {
		t.Errorf("the process outside any pod sampled")
	}
	if t.Failed() {
		t.Logf("agent log (tail):\n%s", tail(agent.log.String(), 4000))
	}
}

// TestKubernetesOffCPURetake runs the agent with the chart's configuration,
// a target selecting every pod of namespace shop and off_cpu.targets only
// its pods labelled app=web, over two busy processes of shop (web and api;
// four on the two cores beside the test's, so preempted often). api's
// waits are asked about and refused; then its pod is labelled app=web, and
// the agent, seeing the pods change, has the processes it refused asked
// again (Sampler.RetakeOffCPUAnswers, each selection.rescan_interval):
// api's waits are recorded from then on. Without the retake a refused
// process stays refused for its life (issue 30).
func TestKubernetesOffCPURetake(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the agent's eBPF sampler and the test's cgroups need root")
	}
	web := &k8sFixture{
		deployment: "web", hash: "6b7c8d9f5", container: "app", driver: "systemd",
		containerID: "1e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f7",
	}
	apiPod := &k8sFixture{
		deployment: "api", hash: "5f6d7c8b9", container: "server", driver: "cgroupfs",
		containerID: "b1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
	}
	busy := []*k8sFixture{{}, {}} // host processes: more threads than cores
	fixtures := append([]*k8sFixture{web, apiPod}, busy...)
	k := startK8sAgent(t, fixtures, nil, func(cfg map[string]any) map[string]any {
		return setPath(cfg, map[string]any{
			"enabled": true,
			"targets": []any{map[string]any{"kubernetes": map[string]any{"namespaces": []any{k8sAppNS}, "pod_labels": "app=web"}}},
		}, "receivers", "profiling", "off_cpu")
	})
	waits := func() map[int64]int64 {
		n := map[int64]int64{}
		eachSampleOf(t, k.out, map[int64]bool{int64(web.pid): true, int64(apiPod.pid): true}, func(s sampleOf) {
			if s.typ == "off_cpu" {
				n[s.pid] += s.n
			}
		})
		return n
	}
	cpu := func(pid int) int64 {
		var n int64
		eachSampleOf(t, k.out, map[int64]bool{int64(pid): true}, func(s sampleOf) {
			if s.typ == "samples" { // the CPU profile
				n += s.n
			}
		})
		return n
	}
	// Until both are sampled and web's waits recorded, then 3 s more:
	// api's waits were asked about and refused by then.
	for deadline := time.Now().Add(time.Minute); waits()[int64(web.pid)] == 0 || cpu(apiPod.pid) == 0; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("in a minute: %v waits recorded (web pid %d, api pid %d), %d CPU samples of api; agent log:\n%s",
				waits(), web.pid, apiPod.pid, cpu(apiPod.pid), tail(k.agent.log.String(), 4000))
		}
	}
	time.Sleep(3 * time.Second)
	if n := waits()[int64(apiPod.pid)]; n != 0 {
		t.Fatalf("%d waits of api's process recorded before its pod was labelled app=web", n)
	}
	k.api.do(t, "PUT", "/api/v1/namespaces/"+k8sAppNS+"/pods/"+apiPod.podName, relabel(t, k.api, apiPod, "web"))
	labelled := time.Now()
	for waits()[int64(apiPod.pid)] == 0 {
		if time.Since(labelled) > 30*time.Second {
			t.Fatalf("no wait of api's process recorded 30 s after its pod was labelled app=web (web: %d); agent log:\n%s",
				waits()[int64(web.pid)], tail(k.agent.log.String(), 4000))
		}
		time.Sleep(500 * time.Millisecond)
	}
	k.agent.stop(t)
	w := waits()
	t.Logf("waits recorded: web %d, api %d (the first %v after the relabel)", w[int64(web.pid)], w[int64(apiPod.pid)], time.Since(labelled).Round(100*time.Millisecond))
}

// cpuTime is the user and system time pid has run.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)        // utime, field 14
	st, _ := strconv.ParseInt(f[12], 10, 64)        // stime, field 15
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// relabel returns f's pod as the API holds it with label app set to app.
func relabel(t *testing.T, api *kubeAPI, f *k8sFixture, app string) map[string]any {
	t.Helper()
	pod := api.do(t, "GET", "/api/v1/namespaces/"+k8sAppNS+"/pods/"+f.podName, nil)
	pod["metadata"].(map[string]any)["labels"].(map[string]any)["app"] = app
	return pod
}

func describeFixture(f *k8sFixture) string {
	if f.driver == "" {
		return "the process outside any pod"
	}
	ns := f.ns
	if ns == "" {
		ns = k8sAppNS
	}
	return strings.Join([]string{ns, f.podName}, "/")
}

// k8sAgent is the built distribution run as the chart's agent against a
// real kube-apiserver, over busy fixture processes in kubelet-named
// cgroups.
type k8sAgent struct {
	api     *kubeAPI
	out     string // the file exporter's output
	metrics string // the agent's Prometheus endpoint
	agent   *collector
}

// startK8sAgent renders the chart with a first target selecting namespace
// shop and the extra helm arguments, creates the namespaces (shop and
// extraNS) and the fixtures' workloads (those with a driver), starts a
// busy process in each fixture's cgroup, applies the agent's RBAC, and
// runs the agent with the rendered configuration (overlay, if any,
// changes it; 1 s reports, a file exporter).
func startK8sAgent(t *testing.T, fixtures []*k8sFixture, extraNS []string, overlay func(cfg map[string]any) map[string]any, helmArgs ...string) k8sAgent {
	t.Helper()
	root := testfixture.Root(t)
	bin := needBuilt(t, "otelcol-profsym", "otelcol")
	helm := testfixture.Helm(t)
	if helm == "" {
		testfixture.SkipOrFail(t, "helm is not installed (go install helm.sh/helm/v3/cmd/helm@v3.22.0)")
	}
	tools := kubeTools(t)
	cgRoot := testCgroupV2(t)
	work := t.TempDir()
	api := startKubeAPI(t, tools, filepath.Join(work, "kube"))

	rendered := renderChart(t, helm, filepath.Join(root, "deploy", "helm", "profsym"),
		append([]string{
			"--set", "symbols.enabled=false", "--set", "agent.profiling.reportInterval=1s",
			"--set", "agent.profiling.targets[0].kubernetes.namespaces[0]=" + k8sAppNS,
		}, helmArgs...)...)
	for _, ns := range append([]string{k8sReleaseNS, k8sAppNS}, extraNS...) {
		api.create(t, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}})
	}
	_, token := applyAgentRBAC(t, api, rendered)
	for _, f := range fixtures {
		if f.driver != "" {
			createWorkload(t, api, f)
		}
	}
	spin := testfixture.Build(t, testfixture.Spec{
		Name: "k8ssel", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-fno-omit-frame-pointer", "-DE2E_ID=k8ssel"},
	})
	for _, f := range fixtures {
		startInCgroup(t, cgRoot, f, spin, "")
	}

	out := filepath.Join(work, "agent.json")
	prom := testfixture.FreePort(t)
	cfg := agentConfig(t, rendered)
	cfg = setPath(cfg, "kubeConfig", "receivers", "profiling", "kubernetes", "auth_type")
	health := fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(t))
	cfg = setPath(cfg, health, "extensions", "health_check", "endpoint")
	cfg = setPath(cfg, map[string]any{"file": map[string]any{"path": out, "format": "json"}}, "exporters")
	var tel map[string]any
	if err := yaml.Unmarshal([]byte(telemetryOverlay(prom)), &tel); err != nil {
		t.Fatal(err)
	}
	cfg = setPath(cfg, getPath(tel, "service", "telemetry", "metrics"), "service", "telemetry", "metrics")
	if overlay != nil {
		cfg = overlay(cfg)
	}
	cfgPath := filepath.Join(work, "agent.yaml")
	b, _ := yaml.Marshal(cfg)
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	agent := startCollector(t, bin, "agent", []string{
		"KUBECONFIG=" + api.kubeconfig(t, work, token), "K8S_NODE_NAME=" + k8sNode, "HOST_NAME=" + k8sNode, "MY_POD_IP=127.0.0.1",
		"PROFSYM_HEALTH_ENDPOINT=" + health,
	}, cfgPath)
	return k8sAgent{api: api, out: out, metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", prom), agent: agent}
}
