package profilingreceiver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
// Sub-benchmarks: steady (only the busy processes), and churn, which also
// starts 20 short-lived processes a second, one in four a binary never seen
// before (a fresh copy of a fixture: a new file identity, so a new table).
// PROFSYM_BENCH_UNWINDING=frame_pointers measures the receiver without unwind
// tables, for comparison. bpf_us/sample is the sampling program's in-kernel time per run, tail calls
// included (kernel.bpf_stats_enabled: run_time_ns / run_cnt).
func BenchmarkSamplerOverhead(b *testing.B) {
	needSampler(b)
	perf := testfixture.NeedTool(b, "perf")
	secs := 60
	if s, err := strconv.Atoi(os.Getenv("PROFSYM_BENCH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		testfixture.SkipOrFail(b, "kernel.bpf_stats: %v", err)
	}
	defer stats.Close()
	bin := testfixture.Build(b, testfixture.Spec{Name: "unwind-chain-pie", Lang: "c",
		Sources: []string{"unwind/chain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-fPIE", "-pie"}})
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
			for range b.N {
				benchOnce(b, perf, secs)
			}
			close(stop)
			if n := <-done; churn > 0 {
				b.ReportMetric(float64(n)/float64(secs), "churn_procs/s")
			}
		})
	}
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

func benchOnce(b *testing.B, perf string, secs int) {
	ctx := context.Background()
	f := NewFactory()
	cfg := f.CreateDefaultConfig()
	if m := os.Getenv("PROFSYM_BENCH_UNWINDING"); m != "" {
		cfg.(*Config).Unwinding.Mode = m // frame_pointers: the receiver before unwind tables
	}
	set := receivertest.NewNopSettings(f.Type())
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
	cpu0, wall0 := selfCPU(b), time.Now()
	if err := pr.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	if err := lr.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		b.Fatal(err)
	}
	// Steady state: after start-up (BPF load, kallsyms, the first snapshot
	// of every process on the host) and before the final report.
	const settle = 3 * time.Second
	time.Sleep(settle)
	steadyCPU0, steadyWall0 := selfCPU(b), time.Now()
	run0, cnt0, _ := rcv.sampler.ProgramStats()
	perfErr := pc.Wait()
	steadyCPU, steadyWall := selfCPU(b)-steadyCPU0, time.Since(steadyWall0)
	run1, cnt1, _ := rcv.sampler.ProgramStats()
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
	cpu := selfCPU(b) - cpu0
	if perfErr != nil {
		b.Fatalf("perf record: %v", perfErr)
	}
	ru := pc.ProcessState.SysUsage().(*syscall.Rusage)
	perfCPU := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	perfRSS := float64(ru.Maxrss) / 1024 // KiB
	rss, hwm := statusMB(b, "VmRSS"), statusMB(b, "VmHWM")
	cpuPct := 100 * cpu.Seconds() / wall.Seconds()
	perfPct := 100 * perfCPU.Seconds() / wall.Seconds()
	steadyPct := 100 * steadyCPU.Seconds() / steadyWall.Seconds()
	if cnt1 > cnt0 {
		b.ReportMetric(float64(run1-run0)/float64(cnt1-cnt0)/1e3, "bpf_us/sample")
		b.ReportMetric(100*(run1-run0).Seconds()/steadyWall.Seconds(), "bpf_cpu_%")
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.Logf("stops %v, tables %s; Go heap in use %.1f MB, idle %.1f MB (released %.1f MB), sys %.1f MB",
		st.Stops, unwindStats, float64(ms.HeapInuse)/1e6, float64(ms.HeapIdle)/1e6, float64(ms.HeapReleased)/1e6, float64(ms.Sys)/1e6)
	b.ReportMetric(cpuPct, "receiver_cpu_%")
	b.ReportMetric(steadyPct, "receiver_steady_cpu_%")
	b.ReportMetric(hwm, "receiver_peak_rss_MB")
	b.ReportMetric(perfPct, "perf_cpu_%")
	b.ReportMetric(perfRSS, "perf_max_rss_MB")
	if perfPct > 0 {
		b.ReportMetric(cpuPct/perfPct, "cpu_ratio")
		b.ReportMetric(steadyPct/perfPct, "steady_cpu_ratio")
	}
	if perfRSS > 0 {
		b.ReportMetric(hwm/perfRSS, "rss_ratio")
	}
	b.Logf("%v: receiver %.2f%% of a core (%v CPU; steady state %.2f%%), RSS %.1f MB (peak %.1f); perf record %.2f%% (%v), max RSS %.1f MB",
		wall.Round(time.Millisecond), cpuPct, cpu, steadyPct, rss, hwm, perfPct, perfCPU, perfRSS)
}

// selfCPU is this process's user+system time from /proc/self/stat.
func selfCPU(b *testing.B) time.Duration {
	s, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the parenthesised comm; utime and stime are 14 and 15.
	f := strings.Fields(string(s[strings.LastIndexByte(string(s), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

func statusMB(b *testing.B, key string) float64 {
	s, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}
