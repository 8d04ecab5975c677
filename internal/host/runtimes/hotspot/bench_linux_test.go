package hotspot_test

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkHotSpotCost measures what following Java stacks costs the
// agent: the sampler at 99 Hz with unwind tables and the profile builder
// reporting every 10 s (what the profiling receiver runs, without the
// export), while a JVM (fixture.Mix, two threads, C2) holds both cores.
// Two runs over the same workload: native-only (the HotSpot walker off)
// and hotspot. Run it once:
//
//	PROFSYM_BENCH_SECONDS=60 go test -run '^$' -bench HotSpotCost -benchtime 1x -timeout 15m ./internal/host/runtimes/hotspot
//
// Figures per run (and a summary table at the end):
//
//	agent_cpu_%      this process's CPU (getrusage: sampler readers,
//	                 snapshots, naming, reports, GC) over the steady window
//	                 (after 5 s of start-up) as a share of one core
//	bpf_ns/sample    the sampling program's in-kernel time per run, tail
//	                 calls included (kernel.bpf_stats_enabled)
//	rss_MB           resident set at the end; peak_rss_MB its high-water
//	                 mark over the steady window
//	java_frames/sample  runtime frames per sample of the JVM
func BenchmarkHotSpotCost(b *testing.B) {
	testfixture.Short(b, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(b, "%v", err)
	}
	secs := 60
	if s, err := strconv.Atoi(os.Getenv("PROFSYM_BENCH_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		testfixture.SkipOrFail(b, "kernel.bpf_stats: %v", err)
	}
	defer stats.Close()
	jar, lib := javaFixtures(b)
	var rows []costResult
	for _, mode := range []string{"native-only", "hotspot"} {
		b.Run(mode, func(b *testing.B) {
			cmd := javaCmd(b, jdk{name: "jdk17"}, jar, lib, nil, "fixture.Mix", strconv.Itoa(secs+30), "2")
			cmd.Stderr = nil
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
			}()
			time.Sleep(3 * time.Second) // the JIT compilers settle
			var r costResult
			for range b.N {
				r = costOnce(b, mode == "hotspot", cmd.Process.Pid, secs)
			}
			r.name = mode
			rows = append(rows, r)
		})
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "agent at 99 Hz, %d s per run, a JVM busy on both cores (load average %s):\n", secs, loadAvg())
	fmt.Fprintf(&sum, "  %-12s %12s %14s %8s %12s %18s\n", "run", "agent CPU %", "BPF ns/sample", "RSS MB", "peak RSS MB", "Java frames/sample")
	for _, r := range rows {
		fmt.Fprintf(&sum, "  %-12s %12.3f %14.0f %8.1f %12.1f %18.1f\n", r.name, r.cpu, r.bpfNs, r.rss, r.peakRSS, r.javaFrames)
	}
	fmt.Print("\n" + sum.String() + "\n")
}

type costResult struct {
	name                     string
	cpu, bpfNs, rss, peakRSS float64
	javaFrames               float64
}

func costOnce(b *testing.B, hotspot bool, pid, secs int) costResult {
	debug.FreeOSMemory()
	testfixture.ResetPeakRSS()
	var bld *profbuild.Builder
	s, err := sampler.New(sampler.Config{KernelStacks: true, Runtimes: runtimes.Config{HotSpot: hotspot},
		OnEvent: func(ev sampler.Event) { bld.HandleEvent(ev) }})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	opt := profbuild.Options{KernelSymbols: true, Unwinder: s.Unwinder()}
	if rs := s.Runtimes(); rs != nil {
		opt.Runtimes = rs
	}
	bld = profbuild.New(opt)
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	var samples, frames uint64
	d := drainer{s: s, f: func(batch sampler.Batch) {
		for _, smp := range batch.Samples {
			if int(smp.Pid) == pid {
				samples += smp.Count
				frames += smp.Count * uint64(len(smp.Runtime))
			}
		}
	}}
	report := func(from time.Time) {
		if _, err := bld.Collect(d, from); err != nil {
			b.Fatal(err)
		}
	}
	from := time.Now()
	time.Sleep(5 * time.Second)
	report(from)
	samples, frames = 0, 0
	cpu0, wall0 := testfixture.ProcessCPU(), time.Now()
	run0, cnt0, _ := s.ProgramStats()
	testfixture.ResetPeakRSS()
	for end := wall0.Add(time.Duration(secs) * time.Second); time.Now().Before(end); {
		t0 := time.Now()
		time.Sleep(min(10*time.Second, time.Until(end)))
		report(t0)
	}
	cpu, wall := testfixture.ProcessCPU()-cpu0, time.Since(wall0)
	run1, cnt1, _ := s.ProgramStats()
	r := costResult{
		cpu:     100 * cpu.Seconds() / wall.Seconds(),
		rss:     float64(testfixture.StatusBytes("VmRSS")) / (1 << 20),
		peakRSS: float64(testfixture.StatusBytes("VmHWM")) / (1 << 20),
	}
	if cnt1 > cnt0 {
		r.bpfNs = float64(run1-run0) / float64(cnt1-cnt0)
	}
	if samples > 0 {
		r.javaFrames = float64(frames) / float64(samples)
	}
	st, _ := s.Stats()
	b.Logf("%d JVM samples; sampler stops %v", samples, st.Stops)
	if rs := s.Runtimes(); rs != nil {
		b.Logf("runtimes %+v", rs.Stats())
	}
	b.ReportMetric(r.cpu, "agent_cpu_%")
	b.ReportMetric(r.bpfNs, "bpf_ns/sample")
	b.ReportMetric(r.rss, "rss_MB")
	b.ReportMetric(r.peakRSS, "peak_rss_MB")
	b.ReportMetric(r.javaFrames, "java_frames/sample")
	return r
}

func loadAvg() string {
	s, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(s))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// drainer hands the batches a report drains to f too.
type drainer struct {
	s *sampler.Sampler
	f func(sampler.Batch)
}

func (d drainer) Drain() (sampler.Batch, error) {
	b, err := d.s.Drain()
	if err == nil {
		d.f(b)
	}
	return b, err
}
