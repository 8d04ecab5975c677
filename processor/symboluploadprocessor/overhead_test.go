package symboluploadprocessor

import (
	"bytes"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkAgentUploadOverhead runs the real agent (the distribution's
// otelcol-profsym with config/agent.yaml: eBPF sampler at 99 Hz, the
// symbolupload processor) next to two busy processes that hold both cores,
// side by side in one run:
//
//   - none: the busy processes alone (their throughput is the baseline);
//   - agent: the agent samples them, uploads off;
//   - upload: the same, with uploads on to a symbol store (a store-only
//     collector, config/symbols-store.yaml, at nice 19 so it stands in for
//     a store on another host); one busy process is a binary carrying 100 MB
//     of compressible debug info, so its extraction (zstd) and throttled
//     upload (max_bandwidth 4 MiB/s, the default) fall inside the window.
//
// Reported per variant: the busy processes' units/s and their loss against
// none (the sampled host's overhead), the agent's CPU over the window and
// its busiest second (where an extraction burst shows), and for upload the
// MB stored and when. Needs root and `make otelcol`. The machine must be
// quiet; run it alone:
//
//	PROFSYM_BENCH_SECONDS=90 go test -run '^$' -bench AgentUploadOverhead -benchtime 1x -timeout 20m ./processor/symboluploadprocessor/
func BenchmarkAgentUploadOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		testfixture.SkipOrFail(b, "the agent's eBPF sampler needs root (CAP_BPF, CAP_PERFMON)")
	}
	root := testfixture.Root(b)
	bin := filepath.Join(root, "_build", "otelcol-profsym")
	testfixture.Short(b, "the built binaries (make test builds them)")
	if _, err := os.Stat(bin); err != nil {
		testfixture.SkipOrFail(b, "%s is not built: run make otelcol", bin)
	}
	// The extraction runs at nice 19 next to two busy processes: it gets
	// little CPU, which is the point, and the window must outlast it.
	secs := 90
	if s, err := strconv.Atoi(os.Getenv("PROFSYM_BENCH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	small := testfixture.Build(b, testfixture.Spec{Name: "benchwork", Lang: "c", Sources: []string{"e2e/work.c"},
		Args: []string{"-O2", "-g", "-fno-omit-frame-pointer", "-Wl,--build-id", "-DE2E_ID=benchwork"}})
	// Its own build id: objcopy keeps the note of the binary it copies.
	big := fatDebug(b, testfixture.Build(b, testfixture.Spec{Name: "benchworkbig", Lang: "c", Sources: []string{"e2e/work.c"},
		Args: []string{"-O2", "-g", "-fno-omit-frame-pointer", "-Wl,--build-id", "-DE2E_ID=benchworkbig"}}), 100<<20)

	results := map[string]overhead{}
	for _, variant := range []string{"none", "agent", "upload"} {
		b.Run(variant, func(b *testing.B) {
			for range b.N {
				r := runOverhead(b, root, bin, variant, small, big, secs)
				results[variant] = r
				b.ReportMetric(r.units, "units/s")
				if base := results["none"].units; variant != "none" && base > 0 {
					b.ReportMetric(100*(1-r.units/base), "workload_loss_%")
				}
				if variant != "none" {
					b.ReportMetric(r.agentCPU, "agent_cpu_%")
					b.ReportMetric(r.agentPeak, "agent_peak_1s_cpu_%")
				}
				if variant == "upload" {
					b.ReportMetric(r.uploadMB, "MB_stored")
					b.ReportMetric(r.storedAt.Seconds(), "stored_after_s")
				}
			}
		})
	}
	if a, u := results["agent"], results["upload"]; a.units > 0 && u.units > 0 {
		b.Logf("with uploads / without: workload units %.4f, agent CPU %.2f%% vs %.2f%%, busiest second %.1f%% vs %.1f%%",
			u.units/a.units, u.agentCPU, a.agentCPU, u.agentPeak, a.agentPeak)
	}
}

// overhead is one variant's figures.
type overhead struct {
	units               float64 // workload units per second, both processes
	agentCPU, agentPeak float64 // % of one core: over the window, busiest second
	uploadMB            float64
	storedAt            time.Duration // from the window's start; 0: not stored
}

// fatDebug copies bin with size bytes more debug info: text-like bytes
// (words of a small vocabulary), which compress about as real DWARF does,
// so the extraction's zstd pass costs what it would.
func fatDebug(b *testing.B, bin string, size int) string {
	objcopy := testfixture.NeedTool(b, "objcopy")
	r := rand.New(rand.NewSource(1))
	words := make([][]byte, 4096)
	for i := range words {
		w := make([]byte, 3+r.Intn(12))
		for j := range w {
			w[j] = byte('a' + r.Intn(26))
		}
		words[i] = w
	}
	var buf bytes.Buffer
	for buf.Len() < size {
		buf.Write(words[r.Intn(len(words))])
		buf.WriteByte(byte(" _./\x00"[r.Intn(5)]))
		if r.Intn(8) == 0 {
			var n [4]byte
			r.Read(n[:])
			buf.Write(n[:])
		}
	}
	dir := b.TempDir()
	blob := filepath.Join(dir, "blob")
	os.WriteFile(blob, buf.Bytes()[:size], 0o644)
	out := filepath.Join(dir, "benchworkbig")
	testfixture.Run(b, objcopy, "--add-section", ".debug_blob="+blob, bin, out)
	return out
}

func runOverhead(b *testing.B, root, bin, variant, small, big string, secs int) overhead {
	var r overhead
	work := b.TempDir()
	var agent *exec.Cmd
	if variant != "none" {
		storeDir := filepath.Join(work, "store")
		symURL := "http://127.0.0.1:1" // uploads off: never asked
		if variant == "upload" {
			port := testfixture.FreePort(b)
			symURL = fmt.Sprintf("http://127.0.0.1:%d", port)
			store := startProcess(b, bin, fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(b)), []string{
				"PROFSYM_SYMBOLS_LISTEN=127.0.0.1:" + strconv.Itoa(port), "PROFSYM_SYMBOLS_DIR=" + storeDir,
			}, filepath.Join(root, "config", "symbols-store.yaml"))
			syscall.Setpriority(syscall.PRIO_PROCESS, store.Process.Pid, 19)
		}
		overlay := filepath.Join(work, "agent.yaml")
		os.WriteFile(overlay, []byte(`
receivers:
  profiling:
    targets:
      - process_name: "^benchwork"
exporters:
  nop:
service:
  pipelines:
    profiles:
      exporters: [nop]
`), 0o644)
		var agentLog *lockedBuffer
		agent, agentLog = startProcessLog(b, bin, fmt.Sprintf("127.0.0.1:%d", testfixture.FreePort(b)), []string{
			"PROFSYM_SYMBOLS_ENDPOINT=" + symURL,
			"PROFSYM_SYMBOLS_UPLOAD=" + strconv.FormatBool(variant == "upload"),
			"PROFSYM_REPORT_INTERVAL=5s",
		}, filepath.Join(root, "config", "agent.yaml"), overlay)
		time.Sleep(3 * time.Second) // start-up: BPF load, the first snapshot of every process
		defer func() {
			if b.Failed() {
				b.Logf("agent log:\n%s", agentLog.String())
			}
		}()
	}

	// Both cores busy for secs; the agent's CPU sampled meanwhile.
	var outs [2]bytes.Buffer
	var cmds [2]*exec.Cmd
	for i, w := range []string{big, small} {
		cmds[i] = exec.Command(w, strconv.Itoa(secs))
		cmds[i].Stdout = &outs[i]
		if err := cmds[i].Start(); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	type tick struct {
		at  time.Duration
		cpu time.Duration
	}
	var ticks []tick
	var mu sync.Mutex
	done := make(chan struct{})
	storedID := ""
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			mu.Lock()
			if agent != nil {
				ticks = append(ticks, tick{time.Since(start), procCPU(agent.Process.Pid)})
			}
			if variant == "upload" && r.storedAt == 0 {
				if ents, _ := os.ReadDir(filepath.Join(work, "store", "buildid")); len(ents) > 0 {
					for _, e := range ents {
						if st, err := os.Stat(filepath.Join(work, "store", "buildid", e.Name(), "debuginfo")); err == nil && st.Size() > 10<<20 {
							r.storedAt, storedID = time.Since(start), e.Name()
						}
					}
				}
			}
			mu.Unlock()
		}
	}()
	var units float64
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.ParseFloat(strings.Fields(outs[i].String() + " 0")[0], 64)
		units += n
	}
	elapsed := time.Since(start)
	close(done)
	mu.Lock()
	defer mu.Unlock()
	r.units = units / elapsed.Seconds()
	filepath.Walk(filepath.Join(work, "store"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && strings.Contains(p, "/buildid/") {
			r.uploadMB += float64(fi.Size()) / (1 << 20)
		}
		return nil
	})
	if n := len(ticks); n > 1 {
		r.agentCPU = 100 * (ticks[n-1].cpu - ticks[0].cpu).Seconds() / (ticks[n-1].at - ticks[0].at).Seconds()
		for i := range ticks {
			for j := i + 1; j < n; j++ {
				if d := ticks[j].at - ticks[i].at; d >= time.Second {
					r.agentPeak = max(r.agentPeak, 100*(ticks[j].cpu-ticks[i].cpu).Seconds()/d.Seconds())
					break
				}
			}
		}
	}
	b.Logf("%s: %.0f units/s; agent %.2f%% of a core, busiest second %.1f%%; stored %s after %v",
		variant, r.units, r.agentCPU, r.agentPeak, storedID, r.storedAt.Round(100*time.Millisecond))
	if variant == "upload" && r.storedAt == 0 {
		b.Errorf("the large debug file was not stored within %d s: lengthen PROFSYM_BENCH_SECONDS", secs)
	}
	return r
}

// startProcess starts a collector with a health check on health (host:port)
// and waits until it answers; it is killed when the benchmark ends.
func startProcess(b *testing.B, bin, health string, env []string, configs ...string) *exec.Cmd {
	cmd, _ := startProcessLog(b, bin, health, env, configs...)
	return cmd
}

// lockedBuffer is a process's log, read while it writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startProcessLog(b *testing.B, bin, health string, env []string, configs ...string) (*exec.Cmd, *lockedBuffer) {
	args := []string{"--feature-gates=service.profilesSupport"}
	for _, c := range configs {
		args = append(args, "--config", c)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), append(env, "PROFSYM_HEALTH_ENDPOINT="+health)...)
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get("http://" + health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cmd, log
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s did not become healthy:\n%s", bin, log.String())
		}
	}
}

// procCPU is a process's user+system time from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(s[bytes.LastIndexByte(s, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}
