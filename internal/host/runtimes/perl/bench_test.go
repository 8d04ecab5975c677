package perl_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/runtimes"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/otlp/profbuild"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkPerlCost is what walking Perl costs the agent, beside the
// native-only walk of the same processes in the same run: two busy perl
// processes (the host's, testdata/src/e2e/perlchain.pl: main -> top -> mid
// -> leaf) keep both cores loaded while the sampler runs at 99 Hz and a
// report is built every 2 s (Perl frames named):
//
//	make bench-perl    (PROFSYM_BENCH_SECONDS: 30 there, 10 under make bench)
//
// Reported per walk: agent-cpu-% (this process's utime+stime over wall
// time, % of one core), bpf-us/sample (run time of the sampling program
// and its tail calls, kernel.bpf_stats, per sample), rss-MB, and
// perl-frames/sample of the busy processes.
func BenchmarkPerlCost(b *testing.B) {
	secs := 10.0
	if v, err := strconv.ParseFloat(os.Getenv("PROFSYM_BENCH_SECONDS"), 64); err == nil && v > 0 {
		secs = v
	}
	for _, walk := range []bool{false, true} {
		name := "5.36-host/native-only"
		if walk {
			name = "5.36-host/perl"
		}
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				measurePerl(b, walk, time.Duration(secs*float64(time.Second)))
			}
		})
	}
}

func measurePerl(b *testing.B, walk bool, dur time.Duration) {
	b.StopTimer()
	testfixture.Short(b, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(b, "%v", err)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Logf("bpf run-time stats unavailable: %v", err)
	} else {
		defer stats.Close()
	}
	src := testfixture.Src(b, "e2e/perlchain.pl")
	var pids []int
	for range 2 {
		// GOFILE "/" exists: no warm-up.
		c := exec.Command("perl", src, "chain", fmt.Sprint(dur.Seconds()+600), "/")
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, c.Process.Pid)
		defer func() { c.Process.Kill(); c.Wait() }()
	}
	s, err := sampler.New(sampler.Config{SampleRate: 99, KernelStacks: true, Runtimes: runtimes.Config{Perl: walk}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	bld := profbuild.New(profbuild.Options{SampleRate: 99, Unwinder: s.Unwinder(), Runtimes: s.Runtimes()})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range s.Events() {
			bld.HandleEvent(ev)
		}
	}()
	defer func() { s.Close(); <-done }()
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	collect := func() profbuild.Report {
		r, err := bld.Collect(s, start)
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		return r
	}
	time.Sleep(3 * time.Second) // attach, tables
	collect()
	prog0, runs0, _ := s.ProgramStats()
	cpu0, wall0 := testfixture.ProcessCPU(), time.Now()
	b.StartTimer()
	var samples, frames int64
	tick := time.NewTicker(2 * time.Second)
	for end := time.After(dur); ; {
		select {
		case <-tick.C:
			r := collect()
			for _, pid := range pids {
				for _, sv := range samplesOf(b, r, pid) {
					samples += sv.count
					frames += sv.count * int64(len(sv.perl))
				}
			}
			continue
		case <-end:
		}
		break
	}
	tick.Stop()
	b.StopTimer()
	wall := time.Since(wall0)
	cpu := testfixture.ProcessCPU() - cpu0
	prog1, runs1, _ := s.ProgramStats()
	runs := max(int64(runs1-runs0), 1)
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "agent-cpu-%")
	b.ReportMetric(float64((prog1-prog0).Nanoseconds())/float64(runs)/1000, "bpf-us/sample")
	b.ReportMetric(float64(testfixture.StatusBytes("VmRSS"))/(1<<20), "rss-MB")
	b.ReportMetric(float64(frames)/float64(max(samples, 1)), "perl-frames/sample")
	b.Logf("walk=%v: %v, %d samples of the busy processes, %d perl frames; %d program runs",
		walk, wall.Round(time.Second), samples, frames, runs)
}
