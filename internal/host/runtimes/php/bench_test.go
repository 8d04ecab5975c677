package php_test

import (
	"fmt"
	"os"
	"path/filepath"
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

// BenchmarkPHPCost is what walking PHP costs the agent, beside the
// native-only walk of the same processes in the same run: two busy PHP
// processes (testdata/src/e2e/phpchain.php, {main} -> top -> Chain::mid ->
// leaf, opcache off) keep both cores loaded while the sampler runs at
// 99 Hz and a report is built every 2 s (PHP frames named), per Debian
// PHP:
//
//	make bench-php    (PROFSYM_BENCH_SECONDS: 30 there)
//
// Reported per PHP and walk: agent-cpu-% (this process's CPU over wall
// time, % of one core), bpf-us/sample (the sampling program and its tail
// calls, kernel.bpf_stats, per sample), rss-MB, php-frames/sample.
func BenchmarkPHPCost(b *testing.B) {
	secs := 10.0
	if v, err := strconv.ParseFloat(os.Getenv("PROFSYM_BENCH_SECONDS"), 64); err == nil && v > 0 {
		secs = v
	}
	for _, v := range []struct{ name, suite, bin string }{
		{"8.2-bookworm", "bookworm", "php8.2"},
		{"8.4-trixie", "trixie", "php8.4"},
	} {
		for _, walk := range []bool{false, true} {
			name := v.name + "/native-only"
			if walk {
				name = v.name + "/php"
			}
			b.Run(name, func(b *testing.B) {
				testfixture.Short(b, "eBPF")
				root := testfixture.InterpreterChroot(b, "php", v.suite)
				for i := 0; i < b.N; i++ {
					measurePHP(b, root, v.bin, walk, time.Duration(secs*float64(time.Second)))
				}
			})
		}
	}
}

func measurePHP(b *testing.B, root, bin string, walk bool, dur time.Duration) {
	b.StopTimer()
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(b, "%v", err)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Logf("bpf run-time stats unavailable: %v", err)
	} else {
		defer stats.Close()
	}
	script := testfixture.ChrootCopy(b, root, testfixture.Src(b, "e2e/phpchain.php"))[0]
	// The go file exists: no warm-up, busy from the start.
	if err := os.WriteFile(filepath.Join(root, "tmp", "profsym-fixtures", "go"), nil, 0o644); err != nil {
		b.Fatal(err)
	}
	var pids []int
	for range 2 {
		c := testfixture.ChrootCommand(root, bin, "-n", "-d", "opcache.enable_cli=0", script,
			fmt.Sprint(dur.Seconds()+600), "/tmp/profsym-fixtures/go")
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, c.Process.Pid)
		defer func() { c.Process.Kill(); c.Wait() }()
	}
	s, err := sampler.New(sampler.Config{SampleRate: 99, KernelStacks: true, Runtimes: runtimes.Config{PHP: walk}})
	if err != nil {
		b.Fatal(err)
	}
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
	var samples, phpFrames int64
	tick := time.NewTicker(2 * time.Second)
	for end := time.After(dur); ; {
		select {
		case <-tick.C:
			r := collect()
			for _, pid := range pids {
				for _, sv := range samplesOf(b, r, pid) {
					samples += sv.count
					phpFrames += sv.count * int64(len(sv.php))
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
	b.ReportMetric(float64(phpFrames)/float64(max(samples, 1)), "php-frames/sample")
	b.Logf("%s walk=%v: %v, %d samples of the busy processes, %d php frames; %d program runs",
		bin, walk, wall.Round(time.Second), samples, phpFrames, runs)
}
