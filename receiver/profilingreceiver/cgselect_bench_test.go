package profilingreceiver

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/receiver/receivertest"

	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkCgroupSelection measures what a busy cgroup that no target
// selects costs the agent when targets are selected in the kernel: one
// receiver (99 Hz, off_cpu on, targets: one cgroup) runs while a busy
// process (main -> a -> ... -> leaf, no frame pointers) holds a core in
// the selected cgroup, and windows with the same busy process in another
// cgroup alternate with windows without it (PROFSYM_BENCH_ROUNDS pairs,
// default 3, of PROFSYM_BENCH_SECONDS each, default 10):
//
//	PROFSYM_BENCH_SECONDS=10 go test -run '^$' -bench CgroupSelection -benchtime 1x ./receiver/profilingreceiver
//
// The cost of a window is the receiver's CPU (getrusage of this process)
// plus the BPF programs' run time (kernel.bpf_stats_enabled: run_time_ns
// of the CPU sample program and the sched_switch one, tail calls
// included), per second. cost_ratio is other-busy over other-stopped,
// summed over the rounds (target: at most 1.15). Today's filter after
// sampling would walk every sample of the other process; the verdicts
// printed show it is dropped before.
func BenchmarkCgroupSelection(b *testing.B) {
	needSampler(b)
	secs, rounds := benchSetting("PROFSYM_BENCH_SECONDS", 10), benchSetting("PROFSYM_BENCH_ROUNDS", 3)
	defer bpfStats(b).Close()
	bin := testfixture.Build(b, testfixture.Spec{
		Name: "unwind-chain-pie", Lang: "c",
		Sources: []string{"unwind/chain.c"}, Args: []string{"-O2", "-fomit-frame-pointer", "-Wall", "-fPIE", "-pie"},
	})
	sel, other := testfixture.NewCgroup(b), testfixture.NewCgroup(b)
	busy := func(cg *testfixture.Cgroup, d time.Duration) *exec.Cmd {
		argv := cg.Wrap(bin, strconv.Itoa(int(d.Seconds())+1))
		c := exec.Command(argv[0], argv[1:]...)
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		return c
	}
	window := time.Duration(secs) * time.Second
	for range b.N {
		ctx := context.Background()
		f := NewFactory()
		cfg := f.CreateDefaultConfig().(*Config)
		cfg.Targets = []TargetConfig{{Cgroup: sel.Path}}
		cfg.OffCPU.Enabled = true
		pr, err := f.CreateProfiles(ctx, receivertest.NewNopSettings(f.Type()), cfg, consumertest.NewNop())
		if err != nil {
			b.Fatal(err)
		}
		if err := pr.Start(ctx, componenttest.NewNopHost()); err != nil {
			b.Fatal(err)
		}
		rcv := pr.(*handle).e.r
		selected := busy(sel, time.Duration(2*rounds+1)*window+3*time.Second)
		time.Sleep(3 * time.Second) // start-up: BPF load, the first snapshots
		cost := func() time.Duration {
			run, _, _ := rcv.sampler.ProgramStats()
			off, _, _ := rcv.sampler.OffCPUProgramStats()
			return testfixture.ProcessCPU() + run + off
		}
		var sum [2]time.Duration // other stopped, other busy
		var wall [2]time.Duration
		st0, _ := rcv.sampler.Stats()
		for r := 0; r < rounds; r++ {
			for v := 0; v < 2; v++ {
				var o *exec.Cmd
				if v == 1 {
					o = busy(other, window)
				}
				c0, w0 := cost(), time.Now()
				time.Sleep(window)
				sum[v] += cost() - c0
				wall[v] += time.Since(w0)
				if o != nil {
					o.Process.Kill()
					o.Wait()
				}
			}
		}
		st1, _ := rcv.sampler.Stats()
		selected.Process.Kill()
		selected.Wait()
		if err := pr.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		stopped := 100 * sum[0].Seconds() / wall[0].Seconds()
		busyPct := 100 * sum[1].Seconds() / wall[1].Seconds()
		b.ReportMetric(stopped, "cost_other_stopped_%")
		b.ReportMetric(busyPct, "cost_other_busy_%")
		b.ReportMetric(busyPct/stopped, "cost_ratio")
		fmt.Printf("\ncgroup selection in the kernel, %d rounds of %d s per variant (load average %s):\n"+
			"  agent CPU + BPF time: other cgroup stopped %.2f%% of a core, busy %.2f%%: ratio %.3f (target <= 1.15)\n"+
			"  CPU samples selected %d, not selected %d; off-CPU switches selected %d, not selected %d\n\n",
			rounds, secs, loadAvg(), stopped, busyPct, busyPct/stopped,
			st1.Selection.Selected-st0.Selection.Selected, st1.Selection.NotSelected-st0.Selection.NotSelected,
			st1.OffCPU.Selection.Selected-st0.OffCPU.Selection.Selected, st1.OffCPU.Selection.NotSelected-st0.OffCPU.Selection.NotSelected)
	}
}
