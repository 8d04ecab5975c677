package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.yaml.in/yaml/v3"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/testfixture"
)

const (
	k8sRelease, k8sReleaseNS = "ps", "profiling"
	k8sNode                  = "e2e-node"
	k8sAppNS                 = "shop"
)

// k8sFixture is one busy process and, for those in a pod, the pod the API
// server knows it by.
type k8sFixture struct {
	deployment, hash, container string
	ns                          string // the workload's namespace; "" is k8sAppNS
	driver                      string // "systemd" or "cgroupfs": how the kubelet names the cgroups; "" for a host process
	// static: a static pod, whose cgroup carries its manifest's hash, not
	// the UID of its mirror pod in the API: found by container.id alone.
	static      bool
	unshare     bool // in a PID namespace of its own
	containerID string

	podName, podUID string
	pid, vpid       int
}

// TestKubernetesMetadata runs the built distribution with the chart's
// rendered agent configuration against a real kube-apiserver and etcd:
// processes in cgroups named as the kubelet names them (systemd and
// cgroupfs drivers) for pods the API server holds, under Deployments, get
// their namespace, pod, container and deployment names through
// k8s_attributes authenticated with the token of the chart's agent
// ServiceAccount and limited by the chart's ClusterRole. A process outside
// any pod is profiled with none of them, and a static pod's process (whose
// cgroup names no API UID) is found by its container id. Then the ClusterRole loses one
// verb and the same check must fail.
func TestKubernetesMetadata(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the agent's eBPF sampler and the test's cgroups need root")
	}
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	helm := testfixture.Helm(t)
	if helm == "" {
		testfixture.SkipOrFail(t, "helm is not installed (go install helm.sh/helm/v3/cmd/helm@v3.22.0)")
	}
	unshare := testfixture.NeedTool(t, "unshare")
	tools := kubeTools(t)
	cgRoot := testCgroupV2(t)

	work := t.TempDir()
	api := startKubeAPI(t, tools, filepath.Join(work, "kube"))

	// The chart as a user installs it, narrowed to the fixtures (the
	// machine runs other things) with a short report interval; symbol
	// upload is off (no store here).
	rendered := renderChart(t, helm, filepath.Join(root, "deploy", "helm", "profsym"),
		"--set", "symbols.enabled=false", "--set", "agent.profiling.reportInterval=2s",
		"--set", "agent.profiling.targets[0].process_name=^k8sspin$")
	api.create(t, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": k8sReleaseNS}})
	api.create(t, map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": k8sAppNS}})
	role, token := applyAgentRBAC(t, api, rendered)

	fixtures := []*k8sFixture{
		{deployment: "web", hash: "7c9f8d6b5", container: "app", driver: "systemd", unshare: true,
			containerID: "7e3f6b1c2d9a4e8f0b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f70"},
		{deployment: "api", hash: "58d4b9c7f6", container: "server", driver: "cgroupfs",
			containerID: "c0ffee00d15ea5e0b0a710ad5eed0fbadc0de0000000000000000000000000a1"},
		{container: "etcd", driver: "systemd", static: true,
			containerID: "5ca1ab1e0ddba11c0c0a1e5ceb0a710ad00dfeed5ca1ab1e0ddba11c0c0a1e5c"},
		{}, // on the host
	}
	for _, f := range fixtures {
		switch {
		case f.static:
			createMirrorPod(t, api, f)
		case f.driver != "":
			createWorkload(t, api, f)
		}
	}

	spin := testfixture.Build(t, testfixture.Spec{Name: "k8sspin", Lang: "c", Sources: []string{"e2e/hot.c"},
		Args: []string{"-O1", "-g", "-fno-omit-frame-pointer", "-DE2E_ID=k8sspin"}})
	for _, f := range fixtures {
		startInCgroup(t, cgRoot, f, spin, unshare)
	}

	cfg := agentConfig(t, rendered)
	kubeconfig := api.kubeconfig(t, work, token)
	run := func(t *testing.T, name string) (*collector, string) {
		out := filepath.Join(work, name+".json")
		health := testfixture.FreePort(t)
		cfgPath := filepath.Join(work, name+".yaml")
		c := setPath(cfg, fmt.Sprintf("127.0.0.1:%d", health), "extensions", "health_check", "endpoint")
		c = setPath(c, map[string]any{"file": map[string]any{"path": out, "format": "json"}}, "exporters")
		b, _ := yaml.Marshal(c)
		os.WriteFile(cfgPath, b, 0o644)
		return startCollector(t, bin, name, []string{
			"KUBECONFIG=" + kubeconfig, "K8S_NODE_NAME=" + k8sNode, "HOST_NAME=" + k8sNode, "MY_POD_IP=127.0.0.1",
			fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", health),
		}, cfgPath), out
	}

	start := time.Now()
	agent, out := run(t, "agent")
	var problems []string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if problems = checkK8sProfiles(t, out, fixtures, 1); len(problems) == 0 {
			break
		}
	}
	if len(problems) > 0 {
		t.Fatalf("profiles lack what the API server and the node know:\n%s", strings.Join(problems, "\n"))
	}
	t.Logf("every fixture named after %v", time.Since(start).Round(time.Millisecond))
	agent.stop(t)

	// The ClusterRole less some verbs on pods. The informer needs only one
	// of list and watch: client-go (v0.37, in contrib's k8s_attributes)
	// first asks for a watch that streams the initial state (WatchList;
	// watch alone suffices), and falls back to list-then-watch when that is
	// refused (list alone fills the cache; the failing watch relists). So
	// one verb less still names every pod, and both less names none, while
	// the host's own view (container.id, k8s.pod.uid) does not change.
	for _, tc := range []struct {
		name   string
		remove []string
		named  bool
	}{
		{"WithoutList", []string{"list"}, true},
		{"WithoutWatch", []string{"watch"}, true},
		{"WithoutListAndWatch", []string{"list", "watch"}, false},
	} {
		t.Run("ClusterRole"+tc.name, func(t *testing.T) {
			cut := role
			for _, v := range tc.remove {
				cut = withoutVerb(cut, "pods", v)
			}
			roleName := cut["metadata"].(map[string]any)["name"].(string)
			api.do(t, "PUT", "/apis/rbac.authorization.k8s.io/v1/clusterroles/"+roleName, cut)
			agent, out := run(t, "agent-"+strings.ToLower(tc.name))
			defer agent.stop(t)
			var problems []string
			// Enough reports that a permitted agent would have named them
			// (the first run took well under this).
			for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
				// The count first: the problems, read after it, see at
				// least its reports (read the other way round, a report
				// written between the two reads ended the wait with the
				// problems of 3: "not profiled (3 reports)", CI).
				n := countReports(t, out, fixtures)
				problems = checkK8sProfiles(t, out, fixtures, 4)
				if tc.named && len(problems) == 0 || n >= 4 {
					break
				}
			}
			unnamed := slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "k8s.pod.name") })
			switch {
			case tc.named && len(problems) > 0:
				t.Fatalf("without %v on pods:\n%s", tc.remove, strings.Join(problems, "\n"))
			case !tc.named && !unnamed:
				t.Fatalf("without %v on pods the fixtures are still named: the RBAC check proves nothing (problems: %v)", tc.remove, problems)
			}
			for pid, reports := range k8sResources(t, out, fixtures) {
				for _, f := range fixtures {
					if f.pid != pid || f.driver == "" {
						continue
					}
					for _, a := range reports {
						hostUID := any(f.podUID)
						if f.static {
							hostUID = nil
							if tc.named {
								hostUID = f.podUID // from the API
							}
						}
						if a["container.id"] != f.containerID || a["k8s.pod.uid"] != hostUID {
							t.Errorf("pod %s: %v, want the node's container.id and k8s.pod.uid whatever the API allows", f.podName, a)
						}
						if !tc.named && a["k8s.pod.name"] != nil {
							t.Errorf("pod %s named without %v on pods: %v", f.podName, tc.remove, a)
						}
					}
				}
			}
			if !tc.named {
				t.Logf("without %v on pods: %s", tc.remove, strings.Join(problems, "; "))
			}
		})
	}
	api.do(t, "PUT", "/apis/rbac.authorization.k8s.io/v1/clusterroles/"+role["metadata"].(map[string]any)["name"].(string), role)
}

// applyAgentRBAC creates the chart's agent ServiceAccount, ClusterRole and
// ClusterRoleBinding (its namespace, k8sReleaseNS, must exist) and returns
// the ClusterRole and a token of the account.
func applyAgentRBAC(t *testing.T, api *kubeAPI, rendered chartObjects) (role map[string]any, token string) {
	t.Helper()
	var saName string
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		o := rendered.one(t, kind)
		api.create(t, o)
		switch kind {
		case "ClusterRole":
			role = o
		case "ServiceAccount":
			saName = o["metadata"].(map[string]any)["name"].(string)
		}
	}
	tok := api.do(t, "POST", "/api/v1/namespaces/"+k8sReleaseNS+"/serviceaccounts/"+saName+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"expirationSeconds": 3600},
	})
	return role, tok["status"].(map[string]any)["token"].(string)
}

// testCgroupV2 returns a cgroup v2 directory for the test's cgroups, below
// this process's own (v2 alone, or the unified hierarchy of a hybrid host),
// removed at the end.
func testCgroupV2(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	own := ""
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = p
		}
	}
	mnt := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.controllers")); err != nil {
		mnt = "/sys/fs/cgroup/unified"
	}
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.procs")); err != nil || own == "" {
		testfixture.SkipOrFail(t, "no cgroup v2 hierarchy mounted (/sys/fs/cgroup or /sys/fs/cgroup/unified)")
	}
	dir := filepath.Join(mnt, own, "profsym-k8s-"+secretHex(t, 4))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testfixture.SkipOrFail(t, "cannot make a cgroup v2 directory: %v", err)
	}
	t.Cleanup(func() { removeCgroupTree(dir) })
	return dir
}

// removeCgroupTree removes a cgroup and its children, deepest first, once
// their processes are gone.
func removeCgroupTree(dir string) {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		for end := time.Now().Add(10 * time.Second); os.Remove(d) != nil && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// kubeletCgroup is the cgroup the kubelet and the runtime give a
// container of a burstable pod.
func kubeletCgroup(f *k8sFixture) string {
	switch f.driver {
	case "systemd":
		u := strings.ReplaceAll(f.podUID, "-", "_")
		if f.static {
			u = staticPodHash
		}
		return filepath.Join("kubepods.slice", "kubepods-burstable.slice", "kubepods-burstable-pod"+u+".slice", "cri-containerd-"+f.containerID+".scope")
	case "cgroupfs":
		return filepath.Join("kubepods", "burstable", "pod"+f.podUID, f.containerID)
	}
	return filepath.Join("system.slice", "k8sspin.service")
}

// startInCgroup starts the busy fixture in its cgroup (through unshare
// --pid --fork when asked) and records the pid the host sees.
func startInCgroup(t *testing.T, cgRoot string, f *k8sFixture, spin, unshare string) {
	t.Helper()
	dir := filepath.Join(cgRoot, kubeletCgroup(f))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := []string{spin, "900"}
	if f.unshare {
		argv = append([]string{unshare, "--pid", "--fork", "--kill-child"}, argv...)
	}
	// The shell moves itself into the cgroup before it becomes the fixture.
	cmd := exec.Command("/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, filepath.Join(dir, "cgroup.procs")}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f.unshare && f.pid != 0 {
			if p, err := os.FindProcess(f.pid); err == nil {
				p.Kill()
			}
		}
		cmd.Process.Kill()
		cmd.Wait()
	})
	f.pid = cmd.Process.Pid
	if !f.unshare {
		return
	}
	// unshare forks the fixture as pid 1 of the new namespace.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			f.pid, _ = strconv.Atoi(fs[0])
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.pid))
			f.vpid = normalize.ReadNSpid(string(st))
			if f.vpid != 1 {
				t.Fatalf("fixture %d in a new PID namespace has NSpid %d there, want 1", f.pid, f.vpid)
			}
			return
		}
	}
	t.Fatal("unshare --pid --fork started no child")
}

// k8sResources reads the profiles file and returns, per fixture pid, the
// resource attributes of each report that carried a profile of it.
func k8sResources(t *testing.T, path string, fixtures []*k8sFixture) map[int][]map[string]any {
	t.Helper()
	want := map[int64]bool{}
	for _, f := range fixtures {
		want[int64(f.pid)] = true
	}
	out := map[int][]map[string]any{}
	b, err := os.ReadFile(path)
	if err != nil {
		return out
	}
	var um pprofile.JSONUnmarshaler
	for _, line := range bytes.Split(b, []byte("\n")) {
		pd, err := um.UnmarshalProfiles(line)
		if err != nil {
			continue // empty, or being written
		}
		for _, rp := range pd.ResourceProfiles().All() {
			a := rp.Resource().Attributes().AsRaw()
			pid, _ := a["process.pid"].(int64)
			if want[pid] {
				out[int(pid)] = append(out[int(pid)], a)
			}
		}
	}
	return out
}

func countReports(t *testing.T, path string, fixtures []*k8sFixture) int {
	res := k8sResources(t, path, fixtures)
	n := -1
	for _, f := range fixtures {
		if c := len(res[f.pid]); n < 0 || c < n {
			n = c
		}
	}
	return n
}

// checkK8sProfiles says what is wrong with the fixtures' profiles: a pod's
// process must have been named (in at least one of its reports, from the
// minReports-th on: the agent learns pods while it samples) and never
// misnamed; the host process must be profiled and never named.
func checkK8sProfiles(t *testing.T, path string, fixtures []*k8sFixture, minReports int) []string {
	t.Helper()
	res := k8sResources(t, path, fixtures)
	var problems []string
	for _, f := range fixtures {
		reports := res[f.pid]
		label := "host process " + strconv.Itoa(f.pid)
		if f.driver != "" {
			label = fmt.Sprintf("pod %s (%s driver) process %d", f.podName, f.driver, f.pid)
		}
		if len(reports) < minReports {
			problems = append(problems, fmt.Sprintf("%s: not profiled (%d reports)", label, len(reports)))
			continue
		}
		if f.driver == "" {
			for _, a := range reports {
				for k := range a {
					if strings.HasPrefix(k, "k8s.") || strings.HasPrefix(k, "container.") {
						problems = append(problems, fmt.Sprintf("%s: carries %s=%v", label, k, a[k]))
					}
				}
			}
			continue
		}
		want := map[string]any{
			"container.id": f.containerID, "k8s.pod.uid": f.podUID,
			"k8s.namespace.name": k8sAppNS, "k8s.pod.name": f.podName, "k8s.container.name": f.container,
			"k8s.deployment.name": f.deployment, "k8s.replicaset.name": f.deployment + "-" + f.hash, "k8s.node.name": k8sNode,
		}
		if f.static {
			// The pod UID comes from the API (the cgroup has none).
			want["k8s.namespace.name"] = "kube-system"
			delete(want, "k8s.deployment.name")
			delete(want, "k8s.replicaset.name")
		}
		if f.driver == "systemd" {
			want["container.runtime.name"] = "containerd"
		}
		if f.vpid != 0 {
			want["process.vpid"] = int64(f.vpid)
		}
		var missing []string
		named := false
		for _, a := range reports {
			var miss []string
			for k, v := range want {
				got, ok := a[k]
				switch {
				case !ok:
					miss = append(miss, k)
				case got != v:
					problems = append(problems, fmt.Sprintf("%s: %s=%v, want %v", label, k, got, v))
				}
			}
			if len(miss) == 0 {
				named = true
			}
			missing = miss
		}
		if !named {
			slices.Sort(missing)
			problems = append(problems, fmt.Sprintf("%s: no report carries %s (last report: %v)", label, strings.Join(missing, ", "), reports[len(reports)-1]))
		}
	}
	return problems
}
