package sampler

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const (
	fixtureSeconds = "3"
	kernelBase     = 0xffff800000000000
)

// checkHotLeaf asserts that at least 90% of pid's samples have their leaf PC
// in hot and that the chain of those reaches caller. With mainOnly, only
// the samples whose stack reaches caller count (a Go program's runtime
// threads and start-up, which in an emulated VM take a third of its CPU),
// and those must be at least half of all.
func checkHotLeaf(t *testing.T, w *procWatcher, b Batch, pid uint32, cpu time.Duration, bin, hot, caller string, mainOnly bool) {
	t.Helper()
	bin = realPath(t, bin)
	hotLo, hotHi := funcRange(t, bin, hot)
	mainLo, mainHi := funcRange(t, bin, caller)
	// The watcher reads the maps on ProcessNew, in its own goroutine,
	// which an emulated VM may run late.
	waitFor(2*time.Second, func() bool { return w.mapsOf(pid) != nil })
	maps := w.mapsOf(pid)
	if maps == nil {
		w.logEvents(t, pid)
		t.Fatalf("no ProcessNew event (and so no maps) for pid %d", pid)
	}
	var total, inHot, reaches, all uint64
	var misses []string
	for _, s := range samplesOf(b, pid) {
		all += s.Count
		if mainOnly && !reachesFunc(maps, bin, s.UserPCs, mainLo, mainHi) {
			continue
		}
		total += s.Count
		if len(s.UserPCs) == 0 {
			continue
		}
		off, ok := fileOffset(maps, bin, s.UserPCs[0])
		if !ok || off < hotLo || off >= hotHi {
			if len(misses) < 5 {
				misses = append(misses, fmt.Sprintf("%#x (tid %d %q)", s.UserPCs[0], s.Tid, s.Comm))
			}
			continue
		}
		inHot += s.Count
		for _, pc := range s.UserPCs[1:] {
			// Return addresses point after the call; step back into it.
			if off, ok := fileOffset(maps, bin, pc-1); ok && off >= mainLo && off < mainHi {
				reaches += s.Count
				break
			}
		}
	}
	t.Logf("pid %d: %d samples, %d with leaf in %s, %d of those reach %s; other leaves: %v",
		pid, total, inHot, hot, reaches, caller, misses)
	checkSampleCount(t, all, cpu, 99)
	if mainOnly {
		t.Logf("%d of %d samples reach %s", total, all, caller)
		if total*2 < all {
			t.Errorf("only %d of %d samples reach %s", total, all, caller)
		}
	}
	if float64(inHot) < 0.9*float64(total) {
		t.Errorf("%d/%d samples in %s, want >= 90%%", inHot, total, hot)
	}
	if float64(reaches) < 0.9*float64(inHot) {
		t.Errorf("%d/%d hot samples have %s in their chain, want >= 90%%", reaches, inHot, caller)
	}
}

func forModes(t *testing.T, f func(t *testing.T, m Mode)) {
	for _, m := range []Mode{ModeKernelAggregation, ModeRingBuffer} {
		t.Run(m.String(), func(t *testing.T) { f(t, m) })
	}
}

func TestCFixture(t *testing.T) {
	bin := buildC(t)
	forModes(t, func(t *testing.T, m Mode) {
		s := newSampler(t, Config{SampleRate: 99, Mode: m})
		w := watch(s)
		pid, cpu := runFixture(t, bin, fixtureSeconds)
		// The process is gone; its samples and maps must not be.
		if !waitFor(2*time.Second, func() bool { _, ok := w.exitOf(pid); return ok }) {
			t.Errorf("no ProcessExit event for pid %d", pid)
		} else {
			ev, _ := w.exitOf(pid)
			t.Logf("exit event: %+v", ev)
		}
		b, err := s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		checkHotLeaf(t, w, b, pid, cpu, bin, "hot", "main", false)
		st, err := s.Stats()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("stats: %+v", st)
	})
}

func TestGoFixture(t *testing.T) {
	bin := buildGo(t)
	s := newSampler(t, Config{SampleRate: 99})
	w := watch(s)
	// Without async preemption: main.hot never yields, so the runtime
	// signals it every 10 ms, which in an emulated VM (test/kernels) costs
	// a third of the fixture's CPU in the signal path.
	pid, cpu := runFixtureEnv(t, []string{"GODEBUG=asyncpreemptoff=1"}, bin, fixtureSeconds)
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	checkHotLeaf(t, w, b, pid, cpu, bin, "main.hot", "main.main", true)
}

func TestKernelStacks(t *testing.T) {
	bin := buildC(t)
	syms := kallsyms(t)
	forModes(t, func(t *testing.T, m Mode) {
		s := newSampler(t, Config{SampleRate: 99, KernelStacks: true, Mode: m})
		w := watch(s)
		pid, cpu := runFixture(t, bin, fixtureSeconds, "syscall")
		b, err := s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		realBin := realPath(t, bin)
		mainLo, mainHi := funcRange(t, realBin, "main")
		maps := w.mapsOf(pid)
		var total, withK, readPath, userMain uint64
		top := map[string]uint64{}
		userLeaves := map[string]uint64{} // samples in user mode: where
		for _, smp := range samplesOf(b, pid) {
			total += smp.Count
			if len(smp.KernelPCs) == 0 {
				leaf := "none"
				if len(smp.UserPCs) > 0 {
					leaf = "other"
					for _, mp := range maps {
						if pc := smp.UserPCs[0]; pc >= mp.start && pc < mp.end {
							leaf = fmt.Sprintf("%s+%#x", filepath.Base(mp.path), pc-mp.start+mp.off)
							break
						}
					}
				}
				userLeaves[leaf] += smp.Count
				continue
			}
			withK += smp.Count
			var names []string
			for _, pc := range smp.KernelPCs {
				if pc < kernelBase {
					t.Fatalf("kernel PC %#x below %#x", pc, uint64(kernelBase))
				}
				names = append(names, ksymName(syms, pc))
			}
			top[names[0]] += smp.Count
			chain := strings.Join(names, ";")
			if strings.Contains(chain, "vfs_read") || strings.Contains(chain, "ksys_read") {
				readPath += smp.Count
			}
			for _, pc := range smp.UserPCs[min(1, len(smp.UserPCs)):] {
				if off, ok := fileOffset(maps, realBin, pc-1); ok && off >= mainLo && off < mainHi {
					userMain += smp.Count
					break
				}
			}
		}
		t.Logf("pid %d: %d samples, %d with kernel stack, %d through vfs_read/ksys_read, %d reach main in user; kernel leaves: %v; user-mode leaves: %v",
			pid, total, withK, readPath, userMain, top, userLeaves)
		checkSampleCount(t, total, cpu, 99)
		// The fixture's share of time in read(2): 94% on the host, at
		// least 95.7% in the x86-64 VMs (kernel matrix with -count=3,
		// 2026-11-29). arm64 under qemu's TCG takes the timer interrupt
		// of many samples on the return to EL0, at the instruction after
		// `svc` in libc's read (libc.so.6+0xd9e28, 43 of 46 user-mode
		// samples in one run): 82.3% to 89.7% in kernel mode there, 78.8%
		// once before. That, and only that, is asked less of.
		inKernel := 0.8
		if emulated() && runtime.GOARCH == "arm64" {
			inKernel = 0.7
		}
		if float64(withK) < inKernel*float64(total) {
			t.Errorf("%d/%d samples have a kernel stack, want >= %.0f%%", withK, total, 100*inKernel)
		}
		if float64(readPath) < 0.8*float64(withK) {
			t.Errorf("%d/%d kernel stacks go through vfs_read/ksys_read, want >= 80%%", readPath, withK)
		}
		if float64(userMain) < 0.8*float64(withK) {
			t.Errorf("%d/%d samples in the kernel have main in their user chain, want >= 80%%", userMain, withK)
			logSnapshot(t, w, pid, b)
		}
	})
}

// A process is announced before its exit event, never after: the kernel
// samples it in do_exit's tail (here closing up to 128k descriptors) after the
// event, and announcing it then made the watcher (as the receiver) read a
// zombie's maps, empty, in place of those its samples needed (the VM
// matrix's "no maps" flake).
func TestNoAnnounceAfterExit(t *testing.T) {
	bin := buildC(t)
	s := newSampler(t, Config{SampleRate: 499, KernelStacks: true})
	w := watch(s)
	var pids []uint32
	for range 15 {
		pid, _ := runFixture(t, bin, "0.1", "files")
		pids = append(pids, pid)
	}
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	// Without the fix, 2-7 of the 15 were announced again on the host's
	// 6.18 (four runs).
	waitFor(2*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.exits) >= len(pids)
	})
	time.Sleep(200 * time.Millisecond) // events after the last exit
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Logf("%d processes, %d sample rows in the batch, %d exit events", len(pids), len(b.Samples), len(w.exits))
	for _, pid := range pids {
		if n := w.newAfterExit[pid]; n > 0 {
			t.Errorf("pid %d announced %d time(s) after its exit event", pid, n)
		}
	}
}

// Without KernelStacks no kernel PC may appear.
func TestNoKernelStacks(t *testing.T) {
	bin := buildC(t)
	s := newSampler(t, Config{SampleRate: 99})
	pid, _ := runFixture(t, bin, "1", "syscall")
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, smp := range samplesOf(b, pid) {
		n++
		if len(smp.KernelPCs) != 0 {
			t.Fatalf("kernel PCs without KernelStacks: %+v", smp)
		}
	}
	if n == 0 {
		t.Fatal("no samples")
	}
}

// A sampled process that execs is announced again, so its maps are re-read
// and PCs of the new image map to the new binary.
func TestExecEvent(t *testing.T) {
	bin := buildC(t)
	s := newSampler(t, Config{SampleRate: 99})
	w := watch(s)
	// The shell spins long enough to be sampled, then becomes the fixture.
	// The exec'd image runs fixtureSeconds: the watcher reads its maps
	// when the exec event comes, which an emulated VM may deliver late.
	script := `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exec "$0" ` + fixtureSeconds
	pid, cpu := runFixture(t, "/bin/sh", "-c", script, bin)
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	execs := w.execs[pid]
	w.mu.Unlock()
	if execs == 0 {
		t.Fatalf("no ProcessExec event for pid %d", pid)
	}
	realBin := realPath(t, bin)
	lo, hi := funcRange(t, realBin, "hot")
	maps := w.mapsOf(pid)
	var total, inHot uint64
	for _, smp := range samplesOf(b, pid) {
		total += smp.Count
		if len(smp.UserPCs) > 0 {
			if off, ok := fileOffset(maps, realBin, smp.UserPCs[0]); ok && off >= lo && off < hi {
				inHot += smp.Count
			}
		}
	}
	t.Logf("pid %d: %d samples over %v of CPU, %d in hot after exec", pid, total, cpu, inHot)
	if inHot == 0 {
		t.Error("no sample of the exec'd image maps into hot")
	}
}

// reachesFunc reports whether a return address of pcs lies in [lo, hi) of
// bin's file offsets.
func reachesFunc(maps []mapping, bin string, pcs []uint64, lo, hi uint64) bool {
	for _, pc := range pcs[min(1, len(pcs)):] {
		if off, ok := fileOffset(maps, bin, pc-1); ok && off >= lo && off < hi {
			return true
		}
	}
	return false
}
