package helmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/testfixture"
)

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
// configurations with each container's arguments and exactly the
// environment its pod gets (literal values, the downward API's pod IP and
// node name, Secrets' keys), and checks that every ${env:NAME} a
// configuration reads without a default is in that environment: a pod
// would otherwise start with an empty value. PROFSYM_VALUES=FILE adds a
// case rendered with your own values file (docs/deployment.md).
func TestCollectorValidate(t *testing.T) {
	helm(t)
	bin := collectorBinary(t)
	testfixture.Short(t, "the built binaries (make test builds them)")
	if bin == "" {
		// make test builds it first, so under CI this is a failure.
		testfixture.SkipOrFail(t, "the otelcol-profsym distribution is not built (make otelcol)")
	}
	cases := map[string][]string{
		"defaults": nil,
		"backend-events-pprof": {"--set", "gateway.backend.endpoint=backend.example:4317", "--set", "gateway.backend.headers.authorization=Bearer ${env:TOKEN}",
			"--set", "gateway.extraEnv[0].name=TOKEN", "--set", "gateway.extraEnv[0].valueFrom.secretKeyRef.name=backend", "--set", "gateway.extraEnv[0].valueFrom.secretKeyRef.key=token",
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
		"tls-jfr-monitors": {"--set", "tls.enabled=true", "--set", "tls.existingSecret=t", "--set", "gateway.jfr.enabled=true",
			"--set", "telemetry.serviceMonitor.enabled=true", "--set", "priorityClass.create=true"},
		"tls-s3-cert-manager": {"--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true",
			"--set", "symbols.store.s3.bucket=symbols", "--set", "symbols.store.s3.endpoint=minio.storage:9000", "--set", "symbols.store.s3.existingSecret=s3-creds"},
		"intake-auth-off": {"--set", "gateway.auth.enabled=false", "--set", "gateway.jfr.enabled=true"},
	}
	if f := os.Getenv("PROFSYM_VALUES"); f != "" {
		cases["own-values"] = []string{"-f", f}
	}
	for name, args := range cases {
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

// podEnv is the environment a rendered workload's container gets: its
// literal values, stand-ins for the downward API (pod IP, node name), and
// its Secrets' keys (the rendered Secret's value, or a stand-in for one
// the user creates).
func podEnv(t *testing.T, d docs, c map[string]any) map[string]string {
	t.Helper()
	sec := renderedSecrets(d)
	out := map[string]string{}
	for n, e := range env(c) {
		if v, ok := e["value"].(string); ok {
			out[n] = v
			continue
		}
		switch ref := mapping(e, "valueFrom"); {
		case str(ref, "fieldRef", "fieldPath") == "status.podIP":
			out[n] = "127.0.0.1"
		case str(ref, "fieldRef", "fieldPath") == "spec.nodeName":
			out[n] = "node-1"
		case ref["secretKeyRef"] != nil:
			name, key := str(ref, "secretKeyRef", "name"), str(ref, "secretKeyRef", "key")
			v, ok := sec[name][key]
			if !ok {
				v = []byte("from-secret-" + name) // a Secret the user makes
			}
			out[n] = string(v)
		default:
			t.Fatalf("env %s: %v", n, e["valueFrom"])
		}
	}
	return out
}

// envRefs are the ${env:NAME} a configuration reads with no default.
var envRefs = regexp.MustCompile(`\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}`)

func validate(t *testing.T, bin string, d docs, kind, name string) error {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	text := str(d.must(t, "ConfigMap", name), "data", "config.yaml")
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
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
	pe := podEnv(t, d, c)
	for _, m := range envRefs.FindAllStringSubmatch(text, -1) {
		if _, ok := pe[m[1]]; !ok {
			return fmt.Errorf("%s's configuration reads ${env:%s}, which its pod does not set", name, m[1])
		}
	}
	environ := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	for n, v := range pe {
		if n == "PROFSYM_OUTPUT" {
			v = filepath.Join(dir, "out", "profiles.jsonl")
		}
		environ = append(environ, n+"="+v)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = environ
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s\nconfig:\n%s", bin, strings.Join(args, " "), err, out, text)
	}
	return nil
}

// docs/deployment.md lists, per workload, the variables its configuration
// reads: everything a hand validation needs. Every ${env:...} of the
// configurations rendered here is in its workload's row.
func TestDocsListConfigEnvironment(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testfixture.Root(t), "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| (agent|gateway|symbols) \\| (.*)\\|$").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = m[2]
	}
	if len(rows) != 3 {
		t.Fatalf("docs/deployment.md: want an agent, gateway and symbols row of configuration variables, have %v", rows)
	}
	for _, args := range [][]string{nil, {"--set", "gateway.jfr.enabled=true", "--set", "gateway.backend.endpoint=b:4317"},
		{"--set", "symbols.store.s3.bucket=b", "--set", "symbols.store.s3.endpoint=s3:9000", "--set", "symbols.store.s3.existingSecret=c"}} {
		d := mustTemplate(t, args...)
		for w, cm := range map[string]string{"agent": agentName, "gateway": gatewayName, "symbols": symbolsName} {
			o := d.find("ConfigMap", cm)
			if o == nil {
				continue
			}
			for _, m := range envRefs.FindAllStringSubmatch(str(o, "data", "config.yaml"), -1) {
				if !strings.Contains(rows[w], "`"+m[1]+"`") {
					t.Errorf("docs/deployment.md's %s row lacks %s (%v)", w, m[1], args)
				}
			}
		}
	}
}
