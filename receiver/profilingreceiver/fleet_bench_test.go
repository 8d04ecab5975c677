package profilingreceiver

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkFleetMix measures the agent in the mix of issue 32, as a fleet
// node looks: two busy processes without frame pointers (chain.c, -O2
// -fomit-frame-pointer), a JVM (e2e.JChain, busy) and a Python process
// (chain.py, busy), 20 new short-lived processes a second (spawnChurn), at
// 99 Hz with the receiver's defaults (HotSpot and CPython walkers on). The
// workload is started once; receivers of each variant run in turn over it,
// in interleaved rounds, so that all variants see the same machine:
//
//	cpu-only        off_cpu off, and an empty tp_btf/sched_switch program
//	                attached (its row: the floor of any program run on every
//	                switch, under the same load)
//	offcpu-before   off_cpu on, preempted_probability 1: every preemption
//	                of a busy thread is chosen as its other waits are (the
//	                behaviour before issue 32)
//	offcpu          off_cpu on, defaults
//	cpu-late-names  as cpu-only, interpreters.name_interval 0: one drain
//	                per report (10 s), where cpu-only drains every second
//	                while the JVM and Python are walked (their frames named
//	                before the runtimes free what they point at)
//
// PROFSYM_BENCH_VARIANTS=cpu-only,offcpu runs those alone;
// PROFSYM_BENCH_CPUPROFILE=DIR keeps each run's CPU profile there. Run it
// once (make bench-fleet):
//
//	PROFSYM_BENCH_SECONDS=30 PROFSYM_BENCH_ROUNDS=3 go test -run '^$' -bench FleetMix -benchtime 1x -timeout 30m ./receiver/profilingreceiver
//
// Off-CPU profiles record the mix's processes only (off_cpu.targets: the
// long-lived ones' pids, fleetChurn): on a shared machine the other users' processes (builds,
// JVMs, VMs) would otherwise make most of the waits, and change from run to
// run. PROFSYM_BENCH_OFFCPU_TARGET=REGEX records those it names instead,
// "all" the whole host (the default setting). CPU profiles are of the whole
// host.
//
// kernel.bpf_stats is on throughout (it adds its clock reads to every run
// of every variant). Figures per variant, medians over the rounds, each
// over PROFSYM_BENCH_SECONDS after 5 s of start-up:
//
//	agent CPU %      this process (getrusage: every goroutine, GC included),
//	                 % of one core
//	profile_agg      the sampling program's runs a second, ns a run, % of a
//	                 core (tail calls included)
//	offcpu_switch    the sched_switch program's likewise (its walks
//	                 included)
//	total %          agent CPU plus both programs: what the agent costs the
//	                 host
//	chosen %, /s     waits whose stacks were taken, of those seen, and a
//	                 second
//	us/chosen        offcpu_switch's time over the waits it chose (the
//	                 cheap runs of every other switch included)
//
// Then the agent's CPU split by part, from a CPU profile of this process
// over the same windows (all rounds of a variant together; see fleetPart),
// in % of a core: each part's share of the profile's samples times the
// agent's CPU (the profile has about half of it: see fleetOnce).
func BenchmarkFleetMix(b *testing.B) {
	needSampler(b)
	secs, rounds := benchSetting("PROFSYM_BENCH_SECONDS", 30), benchSetting("PROFSYM_BENCH_ROUNDS", 3)
	defer bpfStats(b).Close()
	pids, stop := startFleetMix(b)
	churn := make(chan int)
	go func() { churn <- spawnChurn(b, testfixtureChain(b), 20, stop) }()
	start := time.Now()
	defer func() {
		close(stop)
		<-churn
	}()
	variants := []string{"cpu-only", "offcpu-before", "offcpu", "cpu-late-names"}
	if only := os.Getenv("PROFSYM_BENCH_VARIANTS"); only != "" {
		variants = strings.Split(only, ",")
	}
	res := map[string][]fleetRun{}
	for range b.N {
		for range rounds {
			for _, v := range variants {
				res[v] = append(res[v], fleetOnce(b, v, secs, pids))
			}
		}
	}
	var sum strings.Builder
	target := os.Getenv("PROFSYM_BENCH_OFFCPU_TARGET")
	if target == "" {
		target = "the mix"
	}
	fmt.Fprintf(&sum, "fleet mix (2 busy FP-less C, a JVM, a Python, 20 new processes/s), 99 Hz, off_cpu on %s, %d rounds of %d s, bpf_stats on (load average %s, %.0f s in all):\n",
		target, rounds, secs, loadAvg(), time.Since(start).Seconds())
	fmt.Fprintf(&sum, "  %-14s %8s %24s %24s %8s %9s %9s %13s %6s\n", "variant", "agent %", "profile_agg runs/s ns %", "offcpu_switch runs/s ns %", "total %", "chosen %", "chosen/s", "us/chosen (a)", "RSS MB")
	for _, v := range variants {
		rs := res[v]
		pick := func(f func(fleetRun) float64) float64 {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, f(r))
			}
			return median(xs)
		}
		agent := pick(func(r fleetRun) float64 { return r.agentCPU })
		aRuns, aNs, aPct := pick(func(r fleetRun) float64 { return r.aggRuns }), pick(func(r fleetRun) float64 { return r.aggNs }), pick(func(r fleetRun) float64 { return r.aggPct })
		sRuns, sNs, sPct := pick(func(r fleetRun) float64 { return r.swRuns }), pick(func(r fleetRun) float64 { return r.swNs }), pick(func(r fleetRun) float64 { return r.swPct })
		total := pick(func(r fleetRun) float64 { return r.agentCPU + r.aggPct + r.swPct })
		chosen, rss := pick(func(r fleetRun) float64 { return r.chosen }), pick(func(r fleetRun) float64 { return r.rss })
		cps, usc := pick(func(r fleetRun) float64 { return r.chosenPerSec }), pick(func(r fleetRun) float64 { return r.usPerChosen })
		fmt.Fprintf(&sum, "  %-14s %8.2f %8.0f %7.0f %7.3f %8.0f %7.0f %7.3f %8.2f %9.2f %9.0f %13.1f %6.1f\n", v, agent, aRuns, aNs, aPct, sRuns, sNs, sPct, total, chosen, cps, usc, rss)
		if v == "cpu-only" {
			eRuns, eNs, ePct := pick(func(r fleetRun) float64 { return r.emptyRuns }), pick(func(r fleetRun) float64 { return r.emptyNs }), pick(func(r fleetRun) float64 { return r.emptyPct })
			fmt.Fprintf(&sum, "  %-14s %8s %24s %8.0f %7.0f %7.3f\n", "empty switch", "", "", eRuns, eNs, ePct)
			b.ReportMetric(eNs, "empty_switch_ns/run")
		}
		b.ReportMetric(total, v+"_total_%")
		b.ReportMetric(sNs, v+"_switch_ns/run")
	}
	fmt.Fprintf(&sum, "  (a) offcpu_switch's time over the waits it chose: every switch's share included\n")
	fmt.Fprintf(&sum, "agent CPU by part, %% of a core (the agent's CPU by the shares of its CPU profile, all rounds):\n  %-14s", "variant")
	for _, p := range fleetParts {
		fmt.Fprintf(&sum, " %9s", p)
	}
	fmt.Fprintf(&sum, "\n")
	for _, v := range variants {
		var parts map[string]float64
		var wall float64
		for _, r := range res[v] {
			wall += r.wall
			for p, d := range r.parts {
				if parts == nil {
					parts = map[string]float64{}
				}
				parts[p] += d
			}
		}
		fmt.Fprintf(&sum, "  %-14s", v)
		for _, p := range fleetParts {
			fmt.Fprintf(&sum, " %9.3f", 100*parts[p]/wall)
		}
		fmt.Fprintf(&sum, "\n")
	}
	fmt.Print("\n" + sum.String() + "\n")
}

// fleetChurn names the churn's processes: its fixtures (copies named cN)
// and the commands its shell starts. The long-lived ones go by pid: other
// users' JVMs are named java too.
const fleetChurn = `^(unwind-chain-pie?|c[0-9]+|sleep|cp|rm)$`

type fleetRun struct {
	wall                         float64            // s measured
	parts                        map[string]float64 // CPU s by fleetPart
	agentCPU, rss                float64
	aggRuns, aggNs, aggPct       float64
	swRuns, swNs, swPct, chosen  float64
	chosenPerSec, usPerChosen    float64
	emptyRuns, emptyNs, emptyPct float64
}

func testfixtureChain(b *testing.B) string {
	return testfixture.Build(b, testfixture.Spec{
		Name: "unwind-chain-pie", Lang: "c",
		Sources: []string{"unwind/chain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-fPIE", "-pie"},
	})
}

// startFleetMix starts the mix's long-lived processes and returns their
// pids; closing the channel returned stops the churn, the test's cleanup
// kills the rest.
func startFleetMix(b *testing.B) ([]int, chan struct{}) {
	bin := testfixtureChain(b)
	dir := b.TempDir()
	gofile := filepath.Join(dir, "go") // exists: the fixtures skip their warm-up wait
	if err := os.WriteFile(gofile, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	javac, err := exec.LookPath("javac")
	if err != nil {
		testfixture.SkipOrFail(b, "javac: %v", err)
	}
	if out, err := exec.Command(javac, "--release", "8", "-d", dir, testfixture.Src(b, "e2e/JChain.java")).CombinedOutput(); err != nil {
		b.Fatalf("javac: %v: %s", err, out)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		testfixture.SkipOrFail(b, "python3: %v", err)
	}
	cmds := []*exec.Cmd{
		exec.Command(bin, "100000"),
		exec.Command(bin, "100000"),
		exec.Command("java", "-cp", dir, "e2e.JChain", "100000", gofile),
		exec.Command(python, testfixture.Src(b, "runtimes/python/chain.py"), "chain", "100000", gofile),
	}
	var pids []int
	for _, c := range cmds {
		if err := c.Start(); err != nil {
			b.Fatalf("%v: %v", c.Args, err)
		}
		b.Cleanup(func() { c.Process.Kill(); c.Wait() })
		pids = append(pids, c.Process.Pid)
	}
	time.Sleep(5 * time.Second) // the JIT and the interpreter settle
	return pids, make(chan struct{})
}

// fleetOnce runs one receiver of variant v over the mix for secs seconds
// after 5 s of start-up.
func fleetOnce(b *testing.B, v string, secs int, pids []int) fleetRun {
	ctx := context.Background()
	f := NewFactory()
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.OffCPU.Enabled = v != "cpu-only" && v != "cpu-late-names"
	if v == "cpu-late-names" {
		cfg.Interpreters.NameInterval = 0
	}
	switch re := os.Getenv("PROFSYM_BENCH_OFFCPU_TARGET"); re {
	case "all":
	case "":
		cfg.OffCPU.Targets = []TargetConfig{{PIDs: pids}, {ProcessName: fleetChurn}}
	default:
		cfg.OffCPU.Targets = []TargetConfig{{ProcessName: re}}
	}
	if v == "offcpu-before" {
		cfg.OffCPU.PreemptedProbability = 1
	}
	pr, err := f.CreateProfiles(ctx, receivertest.NewNopSettings(f.Type()), cfg, consumertest.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	if err := pr.Start(ctx, componenttest.NewNopHost()); err != nil {
		b.Fatal(err)
	}
	defer pr.Shutdown(ctx)
	rcv := pr.(*handle).e.r
	var empty *ebpf.Program
	if v == "cpu-only" {
		var detach func()
		empty, detach = attachEmptySwitch(b)
		defer detach()
	}
	time.Sleep(5 * time.Second)
	var e0 *ebpf.ProgramStats
	if empty != nil {
		e0, _ = empty.Stats()
	}
	st0, _ := rcv.sampler.Stats()
	aRun0, aCnt0, _ := rcv.sampler.ProgramStats()
	sRun0, sCnt0, _ := rcv.sampler.OffCPUProgramStats()
	var prof bytes.Buffer
	if err := pprof.StartCPUProfile(&prof); err != nil {
		b.Fatal(err)
	}
	cpu0, wall0 := testfixture.ProcessCPU(), time.Now()
	time.Sleep(time.Duration(secs) * time.Second)
	cpu, wall := testfixture.ProcessCPU()-cpu0, time.Since(wall0).Seconds()
	pprof.StopCPUProfile()
	if dir := os.Getenv("PROFSYM_BENCH_CPUPROFILE"); dir != "" {
		f := filepath.Join(dir, fmt.Sprintf("fleet-%s-%d.pprof", v, time.Now().Unix()))
		if err := os.WriteFile(f, prof.Bytes(), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	aRun1, aCnt1, _ := rcv.sampler.ProgramStats()
	sRun1, sCnt1, _ := rcv.sampler.OffCPUProgramStats()
	st1, _ := rcv.sampler.Stats()
	r := fleetRun{agentCPU: 100 * cpu.Seconds() / wall, rss: float64(testfixture.StatusBytes("VmRSS")) / (1 << 20), wall: wall, parts: fleetSplit(b, &prof)}
	// The profile's shares, of the CPU getrusage counted: its samples come
	// from per-thread CPU timers, checked at the kernel's ticks, which a
	// thread running in short bursts often misses (half the agent's CPU
	// in this mix).
	var profiled float64
	for _, d := range r.parts {
		profiled += d
	}
	for p, d := range r.parts {
		if profiled > 0 {
			r.parts[p] = d / profiled * cpu.Seconds()
		}
	}
	if empty != nil && e0 != nil {
		if e1, err := empty.Stats(); err == nil && e1.RunCount > e0.RunCount {
			n := e1.RunCount - e0.RunCount
			r.emptyRuns, r.emptyNs, r.emptyPct = float64(n)/wall, float64(e1.Runtime-e0.Runtime)/float64(n), 100*(e1.Runtime-e0.Runtime).Seconds()/wall
		}
	}
	if n := aCnt1 - aCnt0; n > 0 {
		r.aggRuns, r.aggNs, r.aggPct = float64(n)/wall, float64(aRun1-aRun0)/float64(n), 100*(aRun1-aRun0).Seconds()/wall
	}
	if n := sCnt1 - sCnt0; n > 0 {
		r.swRuns, r.swNs, r.swPct = float64(n)/wall, float64(sRun1-sRun0)/float64(n), 100*(sRun1-sRun0).Seconds()/wall
	}
	chosen := st1.OffCPU.Chosen - st0.OffCPU.Chosen
	if seen := st1.OffCPU.Seen - st0.OffCPU.Seen; seen > 0 {
		r.chosen = 100 * float64(chosen) / float64(seen)
	}
	if chosen > 0 {
		r.chosenPerSec, r.usPerChosen = float64(chosen)/wall, (sRun1-sRun0).Seconds()*1e6/float64(chosen)
	}
	b.Logf("%s: agent %.2f%%, profile_agg %.0f/s %.0f ns, offcpu_switch %.0f/s %.0f ns, chosen %.2f%% (load %s)",
		v, r.agentCPU, r.aggRuns, r.aggNs, r.swRuns, r.swNs, r.chosen, loadAvg())
	return r
}

// fleetParts are the parts of the agent's CPU BenchmarkFleetMix reports, in
// the order printed.
var fleetParts = []string{"drain", "snapshots", "unwind", "runtimes", "offcpu", "report", "kernel", "gc", "other"}

// fleetPart names the part of the agent a CPU profile sample was spent in:
// the first frame from the leaf whose package (or, within profbuild, file)
// is one of them, so that an allocation or a syscall counts for who made
// it; GC workers, and assists, count as gc.
//
//	drain      the sampler: ring and map reads, stack copies (host/sampler)
//	snapshots  process snapshots and ELF reads (host/normalize, elfx)
//	unwind     unwind tables: building and loading (host/unwind/...)
//	runtimes   runtime frames named, walkers attached (host/runtimes/...)
//	offcpu     off-CPU weighting (host/offcpu, profbuild/offcpu.go)
//	report     the profiles built, pdata (otlp/..., collector/pdata)
//	kernel     kallsyms (symbolize/kernel)
//	gc         the Go GC's workers and assists
//	other      the rest: the scheduler, timers, the collector
func fleetPart(s *profile.Sample) string {
	for _, loc := range s.Location {
		for _, ln := range loc.Line { // the innermost first
			if ln.Function == nil {
				continue
			}
			fn, file := ln.Function.Name, ln.Function.Filename
			switch {
			case strings.HasPrefix(fn, "runtime.gcBgMarkWorker"), strings.HasPrefix(fn, "runtime.gcAssist"),
				strings.HasPrefix(fn, "runtime.bgsweep"), strings.HasPrefix(fn, "runtime.bgscavenge"):
				return "gc"
			case strings.Contains(file, "/profbuild/offcpu.go"), strings.Contains(fn, "/internal/host/offcpu."):
				return "offcpu"
			case strings.Contains(fn, "/internal/host/sampler."):
				return "drain"
			case strings.Contains(fn, "/internal/host/normalize."), strings.Contains(fn, "/internal/elfx"):
				return "snapshots"
			case strings.Contains(fn, "/internal/host/unwind"):
				return "unwind"
			case strings.Contains(fn, "/internal/host/runtimes"):
				return "runtimes"
			case strings.Contains(fn, "/internal/symbolize/kernel."):
				return "kernel"
			case strings.Contains(fn, "/internal/otlp/"), strings.Contains(fn, "collector/pdata/"):
				return "report"
			}
		}
	}
	return "other"
}

// fleetSplit sums a CPU profile's samples by fleetPart, in CPU seconds.
func fleetSplit(b *testing.B, buf *bytes.Buffer) map[string]float64 {
	p, err := profile.Parse(buf)
	if err != nil {
		b.Fatalf("the agent's CPU profile: %v", err)
	}
	i := slices.IndexFunc(p.SampleType, func(t *profile.ValueType) bool { return t.Type == "cpu" })
	if i < 0 {
		b.Fatalf("the agent's CPU profile has no cpu values: %v", p.SampleType)
	}
	out := map[string]float64{}
	for _, s := range p.Sample {
		out[fleetPart(s)] += time.Duration(s.Value[i]).Seconds()
	}
	return out
}
