package helmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
