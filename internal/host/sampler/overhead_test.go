package sampler

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkOverhead measures the sampler's own cost at 99 Hz while two busy
// processes keep both cores loaded, once per mode:
//
//	go test -run '^$' -bench Overhead -benchtime 1x ./internal/sampler
//
// PROFSYM_SAMPLER_BENCH_SECONDS sets the duration (default 10, use 60 for
// figures worth writing down); PROFSYM_SAMPLER_BENCH_DRAIN the Drain period
// (default 2s). Reported per mode:
//
//	user-cpu-%    this process's utime+stime from /proc/self/stat over wall
//	              time, % of one core (loader, readers, Drain, Go runtime)
//	bpf-cpu-%     run time of the sampling program (kernel.bpf_stats), % of
//	              one core; charged to whichever task was interrupted
//	bpf-ns/run    the same per sample
//	rss-MB        VmRSS of this process at the end
//	bpf-map-MB    kernel memory of the loaded maps (memlock accounting)
func BenchmarkOverhead(b *testing.B) {
	secs := envFloat("PROFSYM_SAMPLER_BENCH_SECONDS", 10)
	drain := time.Duration(envFloat("PROFSYM_SAMPLER_BENCH_DRAIN", 2) * float64(time.Second))
	bin := buildC(b)
	for _, m := range []Mode{ModeKernelAggregation, ModeRingBuffer} {
		b.Run(m.String(), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				measureOverhead(b, m, bin, time.Duration(secs*float64(time.Second)), drain)
			}
		})
	}
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v > 0 {
		return v
	}
	return def
}

func measureOverhead(b *testing.B, m Mode, bin string, dur, drainEvery time.Duration) {
	b.StopTimer()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Logf("bpf run-time stats unavailable: %v", err)
	} else {
		defer stats.Close()
	}
	var busy []*exec.Cmd
	for i := 0; i < 2; i++ {
		c := exec.Command(bin, fmt.Sprint(dur.Seconds()+5))
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

	s := newSampler(b, Config{SampleRate: 99, KernelStacks: true, Mode: m})
	go func() {
		for range s.Events() {
		}
	}()
	time.Sleep(500 * time.Millisecond) // let start-up settle
	if _, err := s.Drain(); err != nil {
		b.Fatal(err)
	}
	prog := s.objs.profile()
	ps0, _ := prog.Stats()
	cpu0, wall0 := selfCPUTicks(b), time.Now()
	b.StartTimer()

	rows := 0
	tick := time.NewTicker(drainEvery)
	for end := time.After(dur); ; {
		done := false
		select {
		case <-tick.C:
			bt, err := s.Drain()
			if err != nil {
				b.Fatal(err)
			}
			rows += len(bt.Samples)
		case <-end:
			done = true
		}
		if done {
			break
		}
	}
	tick.Stop()
	bt, err := s.Drain()
	if err != nil {
		b.Fatal(err)
	}
	rows += len(bt.Samples)

	b.StopTimer()
	wall := time.Since(wall0)
	cpu := selfCPUTicks(b) - cpu0
	ps1, _ := prog.Stats()
	st, _ := s.Stats()

	userPct := 100 * float64(cpu) / float64(clkTck) / wall.Seconds()
	b.ReportMetric(userPct, "user-cpu-%")
	if ps0 != nil && ps1 != nil && ps1.RunCount > ps0.RunCount {
		rt := ps1.Runtime - ps0.Runtime
		runs := ps1.RunCount - ps0.RunCount
		b.ReportMetric(100*rt.Seconds()/wall.Seconds(), "bpf-cpu-%")
		b.ReportMetric(float64(rt.Nanoseconds())/float64(runs), "bpf-ns/run")
		b.ReportMetric(float64(runs)/wall.Seconds(), "runs/s")
	}
	b.ReportMetric(float64(rssKB(b))/1024, "rss-MB")
	b.ReportMetric(float64(mapBytes(s))/(1<<20), "bpf-map-MB")
	b.Logf("%v for %v: %d rows, stats %+v", m, wall.Round(time.Millisecond), rows, st)
}

// clkTck is USER_HZ, the unit of /proc/PID/stat times; 100 on every
// architecture Linux supports today.
const clkTck = 100

// selfCPUTicks returns utime+stime of this process from /proc/self/stat.
func selfCPUTicks(b testing.TB) uint64 {
	raw, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		b.Fatal(err)
	}
	// comm may contain spaces; fields resume after the last ')'.
	fields := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, _ := strconv.ParseUint(fields[11], 10, 64) // field 14 overall
	stime, _ := strconv.ParseUint(fields[12], 10, 64) // field 15
	return utime + stime
}

func rssKB(b testing.TB) uint64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

func mapBytes(s *Sampler) uint64 {
	o := &s.objs
	var total uint64
	for _, m := range []*ebpf.Map{o.StatsMap, o.Events, o.Seen, o.Counts0, o.Counts1,
		o.Stacks0, o.Stacks1, o.Barrier, o.BarrierInner, o.Samples, o.Scratch} {
		if m == nil {
			continue
		}
		if info, err := m.Info(); err == nil {
			if n, ok := info.Memlock(); ok {
				total += n
			}
		}
	}
	return total
}
