//go:build linux

package unwind_test

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkWholeChainVsPerf runs each native fixture once under profsym's
// sampler (unwind tables in BPF) and `perf record -F 99 --call-graph dwarf`
// at the same time, and reports side by side the fraction of samples that
// carry the whole chain, leaf to main, and what each cost:
//
//	go test -run '^$' -bench WholeChainVsPerf -benchtime 1x ./internal/host/unwind
//
// PROFSYM_BENCH_FIXTURE_SECONDS sets the CPU seconds per fixture (default 5).
//
//	profsym_whole_%   our samples with the whole chain (all samples, start-up included)
//	perf_whole_%      perf's, from `perf script` (its own DWARF unwinding)
//	profsym_cpu_ms    this process's CPU while the fixture ran (event handling,
//	                  /proc reads, table builds; it serves every process on the
//	                  host, not only the fixture)
//	bpf_us/sample     in-kernel time per sample of the sampling program and its
//	                  tail calls (kernel.bpf_stats_enabled run_time_ns/run_cnt)
//	perf_record_cpu_ms, perf_script_cpu_ms  perf's CPU: recording 8 KiB of stack
//	                  per sample, then unwinding it in user space
//	perf_data_KB      perf.data size
func BenchmarkWholeChainVsPerf(b *testing.B) {
	perf := testfixture.NeedTool(b, "perf")
	secs := os.Getenv("PROFSYM_BENCH_FIXTURE_SECONDS")
	if secs == "" {
		secs = "5"
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		testfixture.SkipOrFail(b, "kernel.bpf_stats: %v", err)
	}
	defer stats.Close()
	h := newHarness(b, sampler.Config{})
	cases := nativeCases
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			bin := tc.bin(b)
			for range b.N {
				compareOnce(b, h, perf, bin, append([]string{secs}, tc.args...), tc.chain)
			}
		})
	}
}

func compareOnce(b *testing.B, h *harness, perf, bin string, args []string, c chain) {
	data := filepath.Join(b.TempDir(), "perf.data")
	run0, cnt0 := progStats(h.s)
	cpu0 := selfCPU(b)

	fx := exec.Command(bin, args...)
	if err := fx.Start(); err != nil {
		b.Fatal(err)
	}
	pr := exec.Command(perf, "record", "-q", "-F", "99", "--call-graph", "dwarf", "-o", data, "-p", strconv.Itoa(fx.Process.Pid))
	pr.Stderr = os.Stderr
	if err := pr.Start(); err != nil {
		b.Fatal(err)
	}
	if err := fx.Wait(); err != nil {
		b.Fatal(err)
	}
	if err := pr.Wait(); err != nil {
		b.Fatalf("perf record: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	batch, err := h.s.Drain()
	if err != nil {
		b.Fatal(err)
	}
	cpu := selfCPU(b) - cpu0
	run1, cnt1 := progStats(h.s)

	pid := fx.Process.Pid
	var ours []sampler.Sample
	for _, s := range batch.Samples {
		if int(s.Pid) == pid {
			ours = append(ours, s)
		}
	}
	p := h.norm.Cached(pid)
	if p == nil {
		b.Fatalf("no snapshot of pid %d", pid)
	}
	r := evaluate(p, loadSymbols(b, bin), c, ours)
	whole, total := r.whole, r.samples+r.startup

	ps := exec.Command(perf, "script", "--no-demangle", "-i", data, "-F", "pid,ip,sym,dso")
	out, err := ps.Output()
	if err != nil {
		b.Fatalf("perf script: %v", err)
	}
	pWhole, pTotal := perfWhole(out, bin, c)

	recCPU := cpuOf(pr.ProcessState)
	scriptCPU := cpuOf(ps.ProcessState)
	st, _ := os.Stat(data)
	var perSample float64
	if cnt1 > cnt0 {
		perSample = float64(run1-run0) / float64(cnt1-cnt0) / 1e3
	}
	b.ReportMetric(100*float64(whole)/float64(max(total, 1)), "profsym_whole_%")
	b.ReportMetric(100*float64(pWhole)/float64(max(pTotal, 1)), "perf_whole_%")
	b.ReportMetric(float64(cpu.Milliseconds()), "profsym_cpu_ms")
	b.ReportMetric(perSample, "bpf_us/sample")
	b.ReportMetric(float64(recCPU.Milliseconds()), "perf_record_cpu_ms")
	b.ReportMetric(float64(scriptCPU.Milliseconds()), "perf_script_cpu_ms")
	b.ReportMetric(float64(st.Size())/1024, "perf_data_KB")
	b.Logf("profsym: %d/%d whole (%v); perf --call-graph dwarf: %d/%d whole; profsym process CPU %v, BPF %.1f µs/sample; perf record %v + perf script %v CPU, %d KB of data",
		whole, total, r.stops, pWhole, pTotal, cpu, perSample, recCPU, scriptCPU, st.Size()/1024)
}

// perfWhole reads `perf script -F pid,ip,sym,dso` output: samples are
// blank-line separated, a header line then one "ip sym (dso)" line per
// frame, leaf first. Frames outside bin count as unnamed, as in evaluate.
func perfWhole(out []byte, bin string, c chain) (whole, total uint64) {
	real, _ := filepath.EvalSymlinks(bin)
	var names []string
	flush := func() {
		if names != nil {
			total++
			if c.whole(names) {
				whole++
			}
		}
		names = nil
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			flush()
			names = []string{}
			continue
		}
		f := strings.Fields(line)
		name := "?"
		if len(f) >= 3 {
			dso := strings.Trim(f[len(f)-1], "()")
			if dso == real || dso == bin {
				name = f[1]
				if i := strings.IndexByte(name, '+'); i > 0 {
					name = name[:i]
				}
			}
		}
		names = append(names, name)
	}
	flush()
	return whole, total
}

func progStats(s *sampler.Sampler) (runNs, runs uint64) {
	rt, rc, err := s.ProgramStats()
	if err != nil {
		return 0, 0
	}
	return uint64(rt), rc
}

func cpuOf(ps *os.ProcessState) time.Duration {
	ru := ps.SysUsage().(*syscall.Rusage)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// selfCPU is this process's user+system time.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
