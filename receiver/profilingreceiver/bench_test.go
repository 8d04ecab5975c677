package profilingreceiver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkSamplerOverhead measures the whole receiver (sampler, snapshots,
// normalization, kallsyms names, profiles and logs built every 10 s) at
// 99 Hz while two busy processes hold both cores, next to `perf record -F 99
// -a -g` over the same seconds. Run it once:
//
//	PROFSYM_BENCH_SECONDS=60 go test -run '^$' -bench SamplerOverhead -benchtime 1x -timeout 15m ./receiver/profilingreceiver
func BenchmarkSamplerOverhead(b *testing.B) {
	needSampler(b)
	perf := testfixture.NeedTool(b, "perf")
	secs := 60
	if s, err := strconv.Atoi(os.Getenv("PROFSYM_BENCH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	bin := buildC(b)
	for i := 0; i < 2; i++ {
		busy := exec.Command(bin, strconv.Itoa(secs*3))
		if err := busy.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { busy.Process.Kill(); busy.Wait() }()
	}
	for range b.N {
		benchOnce(b, perf, secs)
	}
}

func benchOnce(b *testing.B, perf string, secs int) {
	ctx := context.Background()
	f := NewFactory()
	cfg := f.CreateDefaultConfig()
	set := receivertest.NewNopSettings(f.Type())
	pr, err := f.CreateProfiles(ctx, set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	lr, err := f.CreateLogs(ctx, set, cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
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
	perfErr := pc.Wait()
	steadyCPU, steadyWall := selfCPU(b)-steadyCPU0, time.Since(steadyWall0)
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
