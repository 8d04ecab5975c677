package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// frameAt is a named user frame: function and file:line ("" when raw).
type frameAt struct{ fn, at string }

// leafAndCaller returns, per pid, the (leaf, caller) user-frame pairs seen
// in a profiles file with their sample counts.
func leafAndCaller(t *testing.T, path string, pids map[int64]bool) map[int64]map[[2]frameAt]int64 {
	t.Helper()
	out := map[int64]map[[2]frameAt]int64{}
	eachSample(t, path, pids, func(pid, n int64, frames []userFrame) {
		if len(frames) < 2 {
			return
		}
		var pair [2]frameAt
		for i := range pair {
			if f := frames[i]; !f.raw {
				pair[i] = frameAt{f.fn, fmt.Sprintf("%s:%d", f.file, f.line)}
			}
		}
		if out[pid] == nil {
			out[pid] = map[[2]frameAt]int64{}
		}
		out[pid][pair] += n
	})
	return out
}

// TestPrivateBinarySymbols is issue 11's end to end: no debuginfod
// anywhere; a private binary runs on the agent's host only, unstripped, and
// a second one stripped with its .debug file in a .build-id tree only the
// agent is configured with. The gateway has no local source and empty
// debug directories. Agent and gateway authenticate with a token. Within
// 60 s the gateway names both hot functions and their caller with file
// and line; the agent's own output stays raw. Run with the directory
// backend, with a real S3-compatible server, and as the Helm chart deploys
// it by default: a store-only collector (config/symbols-store.yaml) owns
// the files, the agent uploads to it and the gateway reads it over HTTP
// (config/symbols-remote.yaml).
func TestPrivateBinarySymbols(t *testing.T) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(t, "the agent's eBPF sampler needs root (CAP_BPF, CAP_PERFMON)")
	}
	root := testfixture.Root(t)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(t, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(t, "%s is not built: run make otelcol (make test does)", bin)
	}
	for _, backend := range []string{"directory", "s3", "remote"} {
		t.Run(backend, func(t *testing.T) { runPrivate(t, root, bin, backend) })
	}
}

func runPrivate(t *testing.T, root, bin, backend string) {
	// Distinct builds per backend: each run starts from an empty store.
	short := map[string]string{"directory": "dir", "s3": "s3", "remote": "rem"}[backend]
	unstrippedName, strippedName := "e2epriv"+short, "e2estrip"+short
	// -O0: gcc omits the frame setup of a leaf at -O1 whatever the flags,
	// and the sampler unwinds by frame pointer, so main (the caller to be
	// named) would be skipped.
	args := func(name string) []string {
		return []string{"-O0", "-g", "-fno-omit-frame-pointer", "-Wl,--build-id", "-DE2E_ID=" + name}
	}
	unstripped := testfixture.Build(t, testfixture.Spec{Name: unstrippedName, Lang: "c", Sources: []string{"e2e/hot.c"}, Args: args(unstrippedName)})
	full := testfixture.Build(t, testfixture.Spec{Name: strippedName, Lang: "c", Sources: []string{"e2e/hot.c"}, Args: args(strippedName)})
	stripped, debug := testfixture.SplitDebug(t, full, false)
	strippedID := testfixture.BuildID(t, full)
	agentDebug := t.TempDir()
	os.MkdirAll(filepath.Join(agentDebug, ".build-id", strippedID[:2]), 0o755)
	data, _ := os.ReadFile(debug)
	os.WriteFile(filepath.Join(agentDebug, ".build-id", strippedID[:2], strippedID[2:]+".debug"), data, 0o644)

	work := t.TempDir()
	token := "e2e-" + strings.Repeat("x", 8) + backend
	gwPort, gwHTTP, gwHealth, agHealth, symPort := testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t), testfixture.FreePort(t)
	gwOut, agOut := filepath.Join(work, "gateway.json"), filepath.Join(work, "agent.json")
	gwEnv := []string{
		fmt.Sprintf("PROFSYM_GATEWAY_LISTEN=127.0.0.1:%d", gwPort),
		fmt.Sprintf("PROFSYM_GATEWAY_HTTP_LISTEN=127.0.0.1:%d", gwHTTP),
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", gwHealth),
		fmt.Sprintf("PROFSYM_SYMBOLS_LISTEN=127.0.0.1:%d", symPort),
		"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, "symbols"),
		"PROFSYM_SYMBOLS_TOKEN=" + token,
		"PROFSYM_OUTPUT=" + gwOut,
		"PROFSYM_DEBUGINFOD_CACHE=" + filepath.Join(work, "cache"),
		"PROFSYM_LOCAL_ROOT=/nonexistent", // the gateway must not read the host's binaries
		"DEBUGINFOD_URLS=",                // and there is no debuginfod
	}
	gwOverlay := filepath.Join(work, "gateway-test.yaml")
	os.WriteFile(gwOverlay, []byte(fmt.Sprintf(`
processors:
  symbolization:
    debug_directories: [%s]
`, t.TempDir())), 0o644)
	gwConfigs := []string{filepath.Join(root, "config", "gateway.yaml"), filepath.Join(root, "config", "symbols-auth-gateway.yaml"), gwOverlay}
	if backend == "s3" {
		s3 := testfixture.StartS3(t)
		gwEnv = append(gwEnv, "PROFSYM_SYMBOLS_S3_ENDPOINT="+s3.Endpoint, "PROFSYM_SYMBOLS_S3_BUCKET=symbols",
			"PROFSYM_SYMBOLS_S3_ACCESS_KEY="+s3.Access, "PROFSYM_SYMBOLS_S3_SECRET_KEY="+s3.Secret,
			"PROFSYM_SYMBOLS_S3_INSECURE=true", "PROFSYM_SYMBOLS_S3_CREATE_BUCKET=true")
		gwConfigs = append(gwConfigs[:2], filepath.Join(root, "config", "symbols-s3.yaml"), gwOverlay)
		t.Cleanup(func() {
			if ents, _ := os.ReadDir(filepath.Join(s3.Dir, "symbols", "buildid")); len(ents) < 2 {
				t.Errorf("the bucket holds %d build ids, want the 2 uploaded", len(ents))
			}
		})
	}
	symURL := fmt.Sprintf("http://127.0.0.1:%d", symPort)
	var storeLog func() string
	if backend == "remote" {
		// The store's own process takes the symbols port; the gateway reads it.
		store := startCollector(t, bin, "symbol store", []string{
			fmt.Sprintf("PROFSYM_SYMBOLS_LISTEN=127.0.0.1:%d", symPort),
			fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", testfixture.FreePort(t)),
			"PROFSYM_SYMBOLS_DIR=" + filepath.Join(work, "store"),
			"PROFSYM_SYMBOLS_TOKEN=" + token,
		}, filepath.Join(root, "config", "symbols-store.yaml"), filepath.Join(root, "config", "symbols-auth-gateway.yaml"))
		storeLog = store.log.String
		gwEnv = append(gwEnv, "PROFSYM_SYMBOLS_ENDPOINT="+symURL)
		gwConfigs = append(gwConfigs[:2], filepath.Join(root, "config", "symbols-remote.yaml"), gwOverlay)
		t.Cleanup(func() {
			if ents, _ := os.ReadDir(filepath.Join(work, "store", "buildid")); len(ents) < 2 {
				t.Errorf("the store holds %d build ids, want the 2 uploaded", len(ents))
			}
		})
	}
	gateway := startCollector(t, bin, "gateway", gwEnv, gwConfigs...)

	agOverlay := filepath.Join(work, "agent-test.yaml")
	os.WriteFile(agOverlay, []byte(fmt.Sprintf(`
receivers:
  profiling:
    targets:
      - process_name: "^(%s|%s)$"
processors:
  symbolupload:
    debug_directories: [%s]
    query_interval: 1s
exporters:
  file/sent:
    path: %s
    append: true
service:
  pipelines:
    profiles:
      exporters: [otlp_grpc, file/sent]
`, unstrippedName, strippedName, agentDebug, agOut)), 0o644)
	agEnv := []string{
		fmt.Sprintf("PROFSYM_GATEWAY_ENDPOINT=127.0.0.1:%d", gwPort),
		"PROFSYM_SYMBOLS_ENDPOINT=" + symURL,
		fmt.Sprintf("PROFSYM_HEALTH_ENDPOINT=127.0.0.1:%d", agHealth),
		"PROFSYM_SYMBOLS_TOKEN=" + token,
		"PROFSYM_REPORT_INTERVAL=2s",
	}
	start := time.Now()
	agent := startCollector(t, bin, "agent", agEnv, filepath.Join(root, "config", "agent.yaml"),
		filepath.Join(root, "config", "symbols-auth-agent.yaml"), agOverlay)

	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	pids := map[int64]bool{}
	hot := map[string]string{}
	for _, p := range []struct{ path, name string }{{unstripped, unstrippedName}, {stripped, strippedName}} {
		cmd := exec.CommandContext(ctx, p.path, "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids[int64(cmd.Process.Pid)] = true
		hot[p.name] = "spin_" + p.name
	}

	// Within 60 s of the agent's start, the gateway names the hot function
	// of each binary and its caller, main, with files and lines.
	named := func() map[string][2]frameAt {
		got := map[string][2]frameAt{}
		for _, pairs := range leafAndCaller(t, gwOut, pids) {
			for pair := range pairs {
				for _, fn := range hot {
					if pair[0].fn == fn && strings.HasPrefix(pair[0].at, "hot.c:") &&
						pair[1].fn == "main" && strings.HasPrefix(pair[1].at, "hot.c:") {
						got[fn] = pair
					}
				}
			}
		}
		return got
	}
	var got map[string][2]frameAt
	for time.Since(start) < 60*time.Second {
		if got = named(); len(got) == len(hot) {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("after %v the gateway names %v", time.Since(start).Round(time.Second), got)
	if len(got) != len(hot) {
		agent.stop(t)
		gateway.stop(t)
		if d := os.Getenv("PROFSYM_E2E_KEEP"); d != "" {
			exec.Command("cp", "-r", work, d).Run()
		}
		t.Fatalf("within 60 s the gateway named %v, want %v with main as caller, file and line\nagent log:\n%s\ngateway log:\n%s",
			got, hot, agent.log.String(), gateway.log.String())
	}
	agent.stop(t)
	gateway.stop(t)

	// The agent's own output stays raw: it uploads symbols, it does not
	// symbolize.
	for pid, pairs := range leafAndCaller(t, agOut, pids) {
		for pair := range pairs {
			if pair[0].fn != "" {
				t.Errorf("pid %d: the agent's output names %v", pid, pair)
			}
		}
	}
	logs := agent.log.String() + gateway.log.String()
	if storeLog != nil {
		logs += storeLog()
	}
	for _, want := range []string{"symbol upload: uploaded", "symbol store: stored"} {
		if !strings.Contains(logs, want) {
			t.Errorf("no %q in the logs", want)
		}
	}
}
