package profilingreceiver

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkSamplerOverhead measures the whole receiver (sampler with unwind
// tables, snapshots, normalization, kallsyms names, profiles and logs built
// every 10 s) at 99 Hz while two busy processes without frame pointers
// (main -> a -> b -> c -> d -> leaf, -O2 -fomit-frame-pointer) hold both
// cores, next to `perf record -F 99 -a -g` over the same seconds. Run it once:
//
//	PROFSYM_BENCH_SECONDS=60 go test -run '^$' -bench SamplerOverhead -benchtime 1x -timeout 15m ./receiver/profilingreceiver
//
// Sub-benchmarks: steady (only the busy processes), and churn20, which also
// starts 20 short-lived processes a second, one in four a binary never seen
// before (a fresh copy of a fixture: a new file identity, so a new table).
// PROFSYM_BENCH_UNWINDING=frame_pointers measures the receiver without unwind
// tables, for comparison; PROFSYM_BENCH_DEBUG=1 logs what the receiver does
// (every table built) at debug level.
//
// The figures (also printed as one summary table at the end):
//
//	receiver_steady_cpu_%  the receiver's CPU (getrusage of this process: every
//	                       goroutine, GC included) over the steady window: after
//	                       3 s of start-up, up to the end of the run
//	receiver_cpu_%         the same from start to shutdown
//	bpf_ns/sample          the sampling program's in-kernel time per run, tail
//	                       calls included (kernel.bpf_stats_enabled: run_time_ns
//	                       / run_cnt), over the steady window
//	receiver_rss_MB        resident set at the end of the run
//	receiver_peak_rss_MB   high-water of the resident set over the steady window
//	start_peak_rss_MB      high-water of the resident set during start-up
//	                       (loading BTF and the BPF objects)
//	perf_cpu_%, perf_max_rss_MB  perf record's, over the same seconds
//
// RSS counts the file pages a table build touches while the file is mapped
// (the kernel's VmRSS/VmHWM), not only the Go heap.
func BenchmarkSamplerOverhead(b *testing.B) {
	needSampler(b)
	perf := testfixture.NeedTool(b, "perf")
	secs := benchSetting("PROFSYM_BENCH_SECONDS", 60)
	defer bpfStats(b).Close()
	bin := testfixture.Build(b, testfixture.Spec{
		Name: "unwind-chain-pie", Lang: "c",
		Sources: []string{"unwind/chain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-fPIE", "-pie"},
	})
	var results []benchResult
	for _, churn := range []int{0, 20} {
		name := "steady"
		if churn > 0 {
			name = fmt.Sprintf("churn%d", churn)
		}
		b.Run(name, func(b *testing.B) {
			var busy []*exec.Cmd
			for i := 0; i < 2; i++ {
				c := exec.Command(bin, strconv.Itoa(secs*3))
				if err := c.Start(); err != nil {
					b.Fatal(err)
				}
				busy = append(busy, c)
			}
			defer func() {
				for _, c := range busy {
					c.Process.Kill()
					c.Wait()
				}
			}()
			stop := make(chan struct{})
			done := make(chan int)
			go func() { done <- spawnChurn(b, bin, churn, stop) }()
			var r benchResult
			for range b.N {
				r = benchOnce(b, perf, secs)
			}
			close(stop)
			r.name = name
			if n := <-done; churn > 0 {
				r.churn = float64(n) / float64(secs)
				b.ReportMetric(r.churn, "churn_procs/s")
			}
			results = append(results, r)
		})
	}
	mode := os.Getenv("PROFSYM_BENCH_UNWINDING")
	if mode == "" {
		mode = "auto"
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "receiver at 99 Hz, unwinding %s, %d s per run, both cores busy (load average %s):\n", mode, secs, loadAvg())
	fmt.Fprintf(&sum, "  %-15s %14s %12s %14s %10s %12s %15s %10s %13s\n",
		"run", "steady CPU %", "whole run %", "BPF ns/sample", "RSS MB", "peak RSS MB", "start peak MB", "perf CPU %", "perf RSS MB")
	for _, r := range results {
		name := r.name
		if r.churn > 0 {
			name = fmt.Sprintf("%s (%.0f/s)", r.name, r.churn)
		}
		fmt.Fprintf(&sum, "  %-15s %14.2f %12.2f %14.0f %10.1f %12.1f %15.1f %10.2f %13.1f\n",
			name, r.steadyCPU, r.cpu, r.bpfNs, r.rss, r.peakRSS, r.startPeakRSS, r.perfCPU, r.perfRSS)
	}
	// Printed, not logged: a parent benchmark's log is not shown.
	fmt.Print("\n" + sum.String() + "\n")
}

type benchResult struct {
	name                       string
	churn                      float64
	steadyCPU, cpu, bpfNs      float64
	rss, peakRSS, startPeakRSS float64
	perfCPU, perfRSS           float64
}

func loadAvg() string {
	s, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(s))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// spawnChurn keeps a shell starting about perSec short-lived processes a
// second until stop: every 0.1 s the fixture (10 ms of CPU; every other time
// a fresh copy of it, i.e. a binary never seen before, made by cp) and a
// sleep. The shell is a process of its own, so its fork and exec cost is not
// counted as the receiver's. It returns the processes started.
func spawnChurn(b *testing.B, bin string, perSec int, stop chan struct{}) int {
	if perSec == 0 {
		return 0
	}
	dir := b.TempDir()
	period := 2.0 / float64(perSec) // two processes per round, plus cp every other round
	script := fmt.Sprintf(`i=0
while [ ! -e %[1]s/stop ]; do
  if [ $((i %% 2)) = 0 ]; then cp %[2]s %[1]s/c$i; (%[1]s/c$i 0.01; rm -f %[1]s/c$i) & else %[2]s 0.01 & fi
  i=$((i+1)); echo $i > %[1]s/count
  sleep %[3]g
done`, dir, bin, period)
	sh := exec.Command("sh", "-c", script)
	if err := sh.Start(); err != nil {
		b.Fatal(err)
	}
	<-stop
	os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
	sh.Wait()
	n, _ := os.ReadFile(filepath.Join(dir, "count"))
	rounds, _ := strconv.Atoi(strings.TrimSpace(string(n)))
	return rounds*2 + rounds/2 // fixture + sleep each round, cp every other
}

func benchOnce(b *testing.B, perf string, secs int) benchResult {
	ctx := context.Background()
	f := NewFactory()
	cfg := f.CreateDefaultConfig()
	if m := os.Getenv("PROFSYM_BENCH_UNWINDING"); m != "" {
		cfg.(*Config).Unwinding.Mode = m // frame_pointers: the receiver before unwind tables
	}
	set := receivertest.NewNopSettings(f.Type())
	if os.Getenv("PROFSYM_BENCH_DEBUG") != "" {
		set.Logger = zaptest.NewLogger(b, zaptest.Level(zap.DebugLevel))
	}
	// A fresh agent: no garbage or high-water mark of an earlier run.
	debug.FreeOSMemory()
	testfixture.ResetPeakRSS()
	pr, err := f.CreateProfiles(ctx, set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	lr, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	rcv := pr.(*handle).e.r
	data := filepath.Join(b.TempDir(), "perf.data")
	pc := exec.Command(perf, "record", "-q", "-F", "99", "-a", "-g", "-o", data, "--", "sleep", strconv.Itoa(secs))
	cpu0, wall0 := testfixture.ProcessCPU(), time.Now()
	if err := pr.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	if err := lr.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		b.Fatal(err)
	}
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	perfPeak := watchPeakRSS(pc.Process.Pid, time.Now().Add(time.Duration(secs)*time.Second-time.Second), stopWatch)
	// Steady state: after start-up (BPF load, kallsyms, the first snapshot
	// of every process on the host) and before the final report.
	const settle = 3 * time.Second
	time.Sleep(settle)
	startPeak := float64(testfixture.StatusBytes("VmHWM")) / (1 << 20)
	testfixture.ResetPeakRSS()
	steadyCPU0, steadyWall0 := testfixture.ProcessCPU(), time.Now()
	run0, cnt0, _ := rcv.sampler.ProgramStats()
	perfErr := pc.Wait()
	steadyCPU, steadyWall := testfixture.ProcessCPU()-steadyCPU0, time.Since(steadyWall0)
	run1, cnt1, _ := rcv.sampler.ProgramStats()
	rss, hwm := float64(testfixture.StatusBytes("VmRSS"))/(1<<20), float64(testfixture.StatusBytes("VmHWM"))/(1<<20)
	var unwindStats string
	if u := rcv.sampler.Unwinder(); u != nil {
		unwindStats = fmt.Sprintf("%+v", u.Stats())
	}
	st, _ := rcv.sampler.Stats()
	if err := pr.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
	if err := lr.Shutdown(ctx); err != nil {
		b.Fatal(err)
	}
	wall := time.Since(wall0)
	cpu := testfixture.ProcessCPU() - cpu0
	if perfErr != nil {
		b.Fatalf("perf record: %v", perfErr)
	}
	ru := pc.ProcessState.SysUsage().(*syscall.Rusage)
	perfCPU := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	// Not ru.Maxrss: a child's counts the parent's resident set at fork.
	perfRSS := float64(perfPeak()) / (1 << 20)
	r := benchResult{
		cpu:          100 * cpu.Seconds() / wall.Seconds(),
		steadyCPU:    100 * steadyCPU.Seconds() / steadyWall.Seconds(),
		rss:          rss,
		peakRSS:      hwm,
		startPeakRSS: startPeak,
		perfCPU:      100 * perfCPU.Seconds() / wall.Seconds(),
		perfRSS:      perfRSS,
	}
	if cnt1 > cnt0 {
		r.bpfNs = float64(run1-run0) / float64(cnt1-cnt0)
		b.ReportMetric(r.bpfNs, "bpf_ns/sample")
		b.ReportMetric(100*(run1-run0).Seconds()/steadyWall.Seconds(), "bpf_cpu_%")
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.Logf("stops %v, tables %s; Go heap in use %.1f MB, idle %.1f MB (released %.1f MB), sys %.1f MB; resident anon %.1f MB, file %.1f MB, shmem %.1f MB",
		st.Stops, unwindStats, float64(ms.HeapInuse)/1e6, float64(ms.HeapIdle)/1e6, float64(ms.HeapReleased)/1e6, float64(ms.Sys)/1e6,
		float64(testfixture.StatusBytes("RssAnon"))/1e6, float64(testfixture.StatusBytes("RssFile"))/1e6, float64(testfixture.StatusBytes("RssShmem"))/1e6)
	b.ReportMetric(r.cpu, "receiver_cpu_%")
	b.ReportMetric(r.steadyCPU, "receiver_steady_cpu_%")
	b.ReportMetric(r.rss, "receiver_rss_MB")
	b.ReportMetric(r.peakRSS, "receiver_peak_rss_MB")
	b.ReportMetric(r.startPeakRSS, "start_peak_rss_MB")
	b.ReportMetric(r.perfCPU, "perf_cpu_%")
	b.ReportMetric(r.perfRSS, "perf_max_rss_MB")
	if r.perfCPU > 0 {
		b.ReportMetric(r.cpu/r.perfCPU, "cpu_ratio")
		b.ReportMetric(r.steadyCPU/r.perfCPU, "steady_cpu_ratio")
	}
	if perfRSS > 0 {
		b.ReportMetric(r.peakRSS/perfRSS, "rss_ratio")
	}
	b.Logf("%v: receiver %.2f%% of a core (%v CPU; steady state %.2f%%), RSS %.1f MB (peak %.1f, start-up peak %.1f); perf record %.2f%% (%v), max RSS %.1f MB",
		wall.Round(time.Millisecond), r.cpu, cpu.Round(time.Millisecond), r.steadyCPU, rss, hwm, startPeak, r.perfCPU, perfCPU.Round(time.Millisecond), perfRSS)
	return r
}

// watchPeakRSS follows the VmHWM of process pid until it exits or stop is
// closed; the function returned gives the last value read, in bytes. Each
// read costs this process CPU, so it reads every 2 s until busyAt (when perf
// stops recording and starts writing its file, where its RSS peaks), then
// every 100 ms.
func watchPeakRSS(pid int, busyAt time.Time, stop <-chan struct{}) func() uint64 {
	var peak atomic.Uint64
	path := filepath.Join("/proc", strconv.Itoa(pid), "status")
	go func() {
		for {
			s, err := os.ReadFile(path)
			if err != nil {
				return
			}
			for _, line := range strings.Split(string(s), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
					peak.Store(max(peak.Load(), kb<<10))
				}
			}
			d := 100 * time.Millisecond
			if time.Until(busyAt) > 2*time.Second {
				d = 2 * time.Second
			}
			select {
			case <-stop:
				return
			case <-time.After(d):
			}
		}
	}()
	return peak.Load
}

// benchSetting is the positive integer in the environment variable name,
// or def.
func benchSetting(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// bpfStats turns on the kernel's run-time statistics of BPF programs
// (kernel.bpf_stats_enabled) until it is closed: what a cost figure adds
// to the agent's own CPU.
func bpfStats(tb testing.TB) io.Closer {
	tb.Helper()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		testfixture.SkipOrFail(tb, "kernel.bpf_stats: %v", err)
	}
	return stats
}
