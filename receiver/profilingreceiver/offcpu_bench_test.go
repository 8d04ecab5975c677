package profilingreceiver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkOffCPUStorm measures what off-CPU profiles cost under a
// context-switch storm: `perf bench sched pipe` on every CPU (two processes
// passing a token through pipes, pinned to the CPU: hundreds of thousands
// of switches a second on each) runs in rounds, in turn alone, next to the receiver with its
// defaults (CPU profiles only), and next to the receiver with off_cpu
// enabled (defaults otherwise, whole host), and next to an empty
// tp_btf/sched_switch program (the floor of any design that runs a program
// on every switch, upstream's included: what entering one costs on this
// machine), so that all four see the same machine. Run it once:
//
//	PROFSYM_BENCH_ROUNDS=6 go test -run '^$' -bench OffCPUStorm -benchtime 1x -timeout 20m ./receiver/profilingreceiver
//
// PROFSYM_BENCH_OFFCPU_TARGET=REGEX limits off_cpu to the processes it
// names (off_cpu.targets process_name; the storm's are "perf"), to tell the
// storm's cost from that of the rest of a busy machine's waits.
//
// Each round runs PROFSYM_BENCH_LOOPS (default 300,000) round trips; a
// receiver is started for each of its rounds and warmed up by a short storm
// first (its first snapshot of the host, the unwind tables of perf and its
// libraries), which is not measured. The figures, medians over the rounds:
//
//	storm_ops/s, _cpu, _offcpu  the storm's throughput alone, next to the
//	                            receiver, next to it with off_cpu
//	storm_ops/s_empty           next to the empty sched_switch program
//	throughput_loss_%           off_cpu's rounds against the storm alone
//	floor_loss_%, _cpu_loss_%   the empty program's rounds against alone
//	storm_us/op, _cpu, _offcpu  the storm's own CPU (user + system, which
//	  and _empty                includes the eBPF programs it triggers) per
//	                            round trip: on a loaded machine the figure
//	                            that moves least; cpu_loss_% likewise
//	agent_cpu_%                 the receiver's CPU with off_cpu (this
//	                            process, getrusage) over its storm rounds, in
//	                            % of one core
//	bpf_ns/switch, chosen_%     from one more round with kernel.bpf_stats
//	                            on (which adds its own clock reads to every
//	                            run, so it is kept out of the rounds above):
//	                            the sched_switch program's time per run, its
//	                            walks included, and the waits chosen
func BenchmarkOffCPUStorm(b *testing.B) {
	needSampler(b)
	perf := testfixture.NeedTool(b, "perf")
	rounds, loops := benchSetting("PROFSYM_BENCH_ROUNDS", 6), benchSetting("PROFSYM_BENCH_LOOPS", 300000)
	for range b.N {
		var alone, cpuOnly, offCPU, empty []stormRun
		var agentCPU []float64
		for range rounds {
			alone = append(alone, runStorm(b, perf, loops))
			r, _ := stormWithAgent(b, perf, loops, false, false)
			cpuOnly = append(cpuOnly, r.stormRun)
			r, _ = stormWithAgent(b, perf, loops, true, false)
			offCPU = append(offCPU, r.stormRun)
			agentCPU = append(agentCPU, r.agentCPU)
			empty = append(empty, stormWithEmptyProgram(b, perf, loops))
		}
		_, st := stormWithAgent(b, perf, loops, true, true)
		opsA, opsC, opsO := median(opsOf(alone)), median(opsOf(cpuOnly)), median(opsOf(offCPU))
		opsE, usE := median(opsOf(empty)), median(usOf(empty))
		usA, usC, usO := median(usOf(alone)), median(usOf(cpuOnly)), median(usOf(offCPU))
		b.ReportMetric(opsA, "storm_ops/s")
		b.ReportMetric(opsC, "storm_ops/s_cpu")
		b.ReportMetric(opsO, "storm_ops/s_offcpu")
		b.ReportMetric(100*(1-opsO/opsA), "throughput_loss_%")
		b.ReportMetric(opsE, "storm_ops/s_empty")
		b.ReportMetric(100*(1-opsE/opsA), "floor_loss_%")
		b.ReportMetric(usE, "storm_us/op_empty")
		b.ReportMetric(100*(usE/usA-1), "floor_cpu_loss_%")
		b.ReportMetric(usA, "storm_us/op")
		b.ReportMetric(usC, "storm_us/op_cpu")
		b.ReportMetric(usO, "storm_us/op_offcpu")
		b.ReportMetric(100*(usO/usA-1), "cpu_loss_%")
		b.ReportMetric(median(agentCPU), "agent_cpu_%")
		b.ReportMetric(st.bpfNs, "bpf_ns/switch")
		b.ReportMetric(st.chosen, "chosen_%")
		target := os.Getenv("PROFSYM_BENCH_OFFCPU_TARGET")
		if target == "" {
			target = "whole host"
		}
		fmt.Printf("\noff-CPU storm, %d rounds of %d round trips each, off_cpu on %s (load average %s):\n"+
			"  alone              %8.0f ops/s  %6.2f us CPU/op   rounds %v\n"+
			"  receiver, CPU only %8.0f ops/s  %6.2f us CPU/op   rounds %v\n"+
			"  receiver, off_cpu  %8.0f ops/s  %6.2f us CPU/op   rounds %v\n"+
			"  empty sched_switch %8.0f ops/s  %6.2f us CPU/op   rounds %v\n"+
			"  off_cpu against alone: throughput %+.2f%%, CPU per op %+.2f%% (CPU only: %+.2f%%, %+.2f%%; empty program: %+.2f%%, %+.2f%%)\n"+
			"  receiver with off_cpu: %.2f%% of a core (rounds %v); sched_switch %.0f ns/run, %.2f%% of waits chosen\n\n",
			rounds, loops, target, loadAvg(), opsA, usA, opsOf(alone), opsC, usC, opsOf(cpuOnly), opsO, usO, opsOf(offCPU), opsE, usE, opsOf(empty),
			100*(opsO/opsA-1), 100*(usO/usA-1), 100*(opsC/opsA-1), 100*(usC/usA-1), 100*(opsE/opsA-1), 100*(usE/usA-1), median(agentCPU), agentCPU, st.bpfNs, st.chosen)
	}
}

type stormRun struct {
	ops, usPerOp float64
}

var opsRE = regexp.MustCompile(`(\d+) ops/sec`)

// runStorm runs `perf bench sched pipe` for loops round trips on every
// CPU at once, each instance pinned to its CPU (so every switch is between
// its two processes, with no idle CPU in between): their summed throughput
// and their CPU per round trip.
func runStorm(b *testing.B, perf string, loops int) stormRun { return runStormT(b, perf, loops) }

func runStormT(b testing.TB, perf string, loops int) stormRun {
	taskset := testfixture.NeedTool(b, "taskset")
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for cpu := range runtime.NumCPU() {
		cmd := exec.Command(taskset, "-c", strconv.Itoa(cpu), perf, "bench", "sched", "pipe", "-l", strconv.Itoa(loops))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	var r stormRun
	var cpu time.Duration
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			b.Fatalf("perf bench sched pipe: %v: %s", err, outs[i])
		}
		m := opsRE.FindStringSubmatch(outs[i].String())
		if m == nil {
			b.Fatalf("perf bench sched pipe: no ops/sec in %q", outs[i])
		}
		ops, _ := strconv.ParseFloat(m[1], 64)
		r.ops += ops
		// perf bench waits for its children: their CPU is in its Rusage.
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		cpu += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	r.usPerOp = float64(cpu.Microseconds()) / float64(loops*len(cmds))
	return r
}

// stormWithEmptyProgram runs one storm round with a program that returns at
// once attached to sched_switch (tp_btf, as the sampler's): the cost of
// entering a program on every switch, before it does anything.
func stormWithEmptyProgram(b *testing.B, perf string, loops int) stormRun {
	_, detach := attachEmptySwitch(b)
	defer detach()
	return runStorm(b, perf, loops)
}

// attachEmptySwitch attaches a program that returns at once to
// sched_switch (tp_btf, as the sampler's): the floor of any program run on
// every switch. detach closes it.
func attachEmptySwitch(b testing.TB) (prog *ebpf.Program, detach func()) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceRawTp,
		AttachTo:     "sched_switch",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		b.Fatalf("empty sched_switch program: %v", err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		prog.Close()
		b.Fatalf("attaching the empty sched_switch program: %v", err)
	}
	return prog, func() { l.Close(); prog.Close() }
}

type agentRun struct {
	stormRun
	agentCPU      float64 // % of a core
	bpfNs, chosen float64 // with stats only
}

// stormWithAgent starts the receiver (off_cpu on or not), warms it up with
// a short storm, runs one storm round beside it and returns the round and
// the receiver's CPU over it; with stats, also the sched_switch program's
// ns per run and the waits chosen (%).
func stormWithAgent(b *testing.B, perf string, loops int, offCPU, stats bool) (agentRun, agentRun) {
	ctx := context.Background()
	f := NewFactory()
	cfg := f.CreateDefaultConfig().(*Config)
	cfg.OffCPU.Enabled = offCPU
	if re := os.Getenv("PROFSYM_BENCH_OFFCPU_TARGET"); re != "" {
		cfg.OffCPU.Targets = []TargetConfig{{ProcessName: re}}
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
	runStorm(b, perf, loops/10)
	time.Sleep(time.Second) // the tables the warm-up asked for
	var st agentRun
	if stats {
		defer bpfStats(b).Close()
	}
	st0, _ := rcv.sampler.Stats()
	run0, cnt0, _ := rcv.sampler.OffCPUProgramStats()
	cpu0, wall0 := testfixture.ProcessCPU(), time.Now()
	r := agentRun{stormRun: runStorm(b, perf, loops)}
	cpu, wall := testfixture.ProcessCPU()-cpu0, time.Since(wall0)
	r.agentCPU = 100 * cpu.Seconds() / wall.Seconds()
	if !stats {
		return r, st
	}
	run1, cnt1, _ := rcv.sampler.OffCPUProgramStats()
	st1, _ := rcv.sampler.Stats()
	if cnt1 > cnt0 {
		st.bpfNs = float64(run1-run0) / float64(cnt1-cnt0)
	}
	if seen := st1.OffCPU.Seen - st0.OffCPU.Seen; seen > 0 {
		st.chosen = 100 * float64(st1.OffCPU.Chosen-st0.OffCPU.Chosen) / float64(seen)
	}
	return r, st
}

func opsOf(rs []stormRun) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, r.ops)
	}
	return out
}

func usOf(rs []stormRun) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, r.usPerOp)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
