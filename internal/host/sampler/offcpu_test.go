//go:build linux && (amd64 || arm64)

package sampler

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/offcpu"
	"github.com/profsym/profsym/internal/testfixture"
)

// waitFixture copies the off-CPU fixture under a name of its own (its comm,
// which the tests select it by: other tests run the same fixture).
func waitFixture(t *testing.T) (bin, comm string) {
	t.Helper()
	built := testfixture.Build(t, waitC)
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	comm = fmt.Sprintf("oc%08x", rand.Uint32())
	bin = filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, comm
}

// byComm selects the processes named comm.
func byComm(comm string) func(int) bool {
	return func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		return err == nil && strings.TrimSpace(string(b)) == comm
	}
}

// truthsOf parses the fixture's "truth CALL TID NS CALLS" lines: ns by tid.
func truthsOf(out []byte) map[uint32]int64 {
	m := map[uint32]int64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 5 && f[0] == "truth" {
			tid, _ := strconv.Atoi(f[2])
			ns, _ := strconv.ParseInt(f[3], 10, 64)
			m[uint32(tid)] += ns
		}
	}
	return m
}

func offCPUOf(b Batch, pid uint32) map[uint32]uint64 {
	m := map[uint32]uint64{}
	for _, s := range samplesOf(b, pid) {
		if s.Origin == OriginOffCPU {
			m[s.Tid] += s.OffCPUNs
		}
	}
	return m
}

// blockedOf is offCPUOf less the waits for a CPU (preemptions): the
// fixture's truth measures its time in blocking calls, and a preemption
// between two calls is in none of them (the emulated VMs preempt for tens
// of milliseconds: 25 ms over 0.5 s once on arm64).
func blockedOf(b Batch, pid uint32) map[uint32]uint64 {
	m := map[uint32]uint64{}
	for _, s := range samplesOf(b, pid) {
		if s.Origin == OriginOffCPU && !s.Runnable {
			m[s.Tid] += s.OffCPUNs
		}
	}
	return m
}

func waitsLeft(t *testing.T, s *Sampler, pid uint32) int {
	t.Helper()
	tids, _, err := listMap[uint32, bpf.ProfileOffcpuWait](s.objs.OffcpuWaits)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tid := range tids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d/task/%d", pid, tid)); err == nil || tid == pid {
			n++
		}
	}
	return n
}

// Limits: 64 threads waiting at once with room for 16 waits in progress
// and 16 rows. What does not fit is counted, what is reported is right
// (no thread's time above what it measured itself), and once the process
// is killed with its threads asleep nothing of it is left in the kernel.
func TestOffCPULimits(t *testing.T) {
	bin, comm := waitFixture(t)
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true, CountMapEntries: 16,
		OffCPU: offcpu.Config{Enabled: true, MaxWaits: 16, MaxStacks: 16, Select: byComm(comm)},
	})
	cmd := exec.Command(bin, "threads", "1.5", "64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.Stats()
	truth := truthsOf(out)
	got := blockedOf(b, pid)
	t.Logf("64 threads, 16 waits and 16 rows of room: %d threads reported; stats %+v", len(got), st.OffCPU)
	if st.OffCPU.WaitsFull == 0 || st.OffCPU.MapFull == 0 {
		t.Errorf("waits_full %d, map_full %d: both limits should have been hit", st.OffCPU.WaitsFull, st.OffCPU.MapFull)
	}
	if len(got) == 0 {
		t.Fatal("no off-CPU time reported at all")
	}
	for tid, ns := range got {
		want, ok := truth[tid]
		if !ok {
			want = int64(2 * time.Second) // the main thread, in pthread_join the whole run
		}
		if float64(ns) > 1.05*float64(want) {
			t.Errorf("tid %d: %v reported, the thread measured %v", tid, time.Duration(ns), time.Duration(want))
		}
	}

	// Threads asleep when their process is killed run once more, to exit:
	// their waits end, and none is left behind.
	kill := exec.Command(bin, "threads", "30", "8")
	if err := kill.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	kpid := uint32(kill.Process.Pid)
	kill.Process.Kill()
	kill.Wait()
	s.Drain()
	if n := waitsLeft(t, s, kpid); n != 0 {
		t.Errorf("%d waits of the killed process left in the kernel", n)
	}
}

// A wait whose thread is gone (here one made up, as if it had never run
// again) is deleted by the drain once old, and counted; the tid a reused
// one: the wait of the thread before is not the new thread's, and is
// counted stale instead of reported; and the process filter's answer for a
// pid ends with its process.
func TestOffCPUGoneAndReused(t *testing.T) {
	bin, comm := waitFixture(t)
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true,
		OffCPU: offcpu.Config{Enabled: true, Select: byComm(comm)},
	})
	gen := uint64(0)
	if err := s.objs.OffcpuGen.Get(&gen); err != nil {
		t.Fatal(err)
	}
	// A tid no thread has.
	ghost := uint32(0)
	for tid := uint32(4194000); tid < 4194300; tid++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", tid)); err != nil {
			ghost = tid
			break
		}
	}
	old := bpf.ProfileOffcpuWait{Ts: uint64(bootNow()) - uint64(2*time.Minute), Tgid: ghost, K: uint32(offcpu.One), Gen: gen}
	if err := s.objs.OffcpuWaits.Put(ghost, &old); err != nil {
		t.Fatal(err)
	}

	// The fixture stops itself; while it is off CPU its tid gets the wait
	// of another thread that had it before (another start time), chosen.
	cmd := exec.Command(bin, "sleep", "0.5")
	cmd.Env = append(os.Environ(), "WAIT_STOPPED=1")
	var out bytes.Buffer
	cmd.Stdout = &out
	born := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	if !waitFor(10*time.Second, func() bool { return procStateOf(pid) == "T" }) {
		cmd.Process.Kill()
		t.Fatalf("fixture %d did not stop", pid)
	}
	// "T" shows as soon as the task's state is set, before it has left
	// the CPU; its switch out, if it came after what is planted below,
	// would write its own slot and wait over them (stale 0 in one of four
	// runs on 6.12 under qemu, where that window is wide). Reading
	// /proc/PID/syscall waits until the task is off its CPU
	// (wait_task_inactive), after sched_switch has run.
	if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid)); err != nil {
		cmd.Process.Kill()
		t.Fatalf("waiting for fixture %d to leave its CPU: %v", pid, err)
	}
	jiffies := uint64(0) // the slot's off time; only its tid and flags matter here
	slot := uint64(pid)<<42 | 1<<41 | 1<<40 | jiffies
	if err := s.objs.OffcpuSlots.Put(pid*2654435769>>16, slot); err != nil { // offcpu_slot()
		t.Fatal(err)
	}
	prev := bpf.ProfileOffcpuWait{Ts: uint64(bootNow()) - uint64(time.Hour), TaskStart: 12345, Tgid: pid, K: uint32(offcpu.One), Gen: gen}
	if err := s.objs.OffcpuWaits.Put(pid, &prev); err != nil {
		t.Fatal(err)
	}
	cmd.Process.Signal(syscall.SIGCONT)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	lived := time.Since(born)
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.Stats()
	got := blockedOf(b, pid)
	truth := truthsOf(out.Bytes())
	t.Logf("stats %+v; pid %d reported %v blocked and %v preempted, measured %v", st.OffCPU, pid, time.Duration(got[pid]),
		time.Duration(offCPUOf(b, pid)[pid]-got[pid]), time.Duration(truth[pid]))
	if st.OffCPU.NeverReturned != 1 {
		t.Errorf("never_returned %d, want the made-up wait", st.OffCPU.NeverReturned)
	}
	var ghostWait bpf.ProfileOffcpuWait
	if err := s.objs.OffcpuWaits.Lookup(ghost, &ghostWait); err == nil {
		t.Errorf("the wait of gone thread %d is still there", ghost)
	}
	if st.OffCPU.Stale == 0 {
		t.Errorf("stale 0: the other thread's wait was not caught")
	}
	// The process's filter answer went with it: a process reusing its pid
	// is asked about again.
	if w := binary.NativeEndian.Uint64(s.offcpu.procs[pid/32*8:]); w>>(pid%32*2)&3 != 0 {
		t.Errorf("filter bits of exited pid %d still set: %b", pid, w>>(pid%32*2)&3)
	}
	// Its blocked waits are its nanosleeps; with its preemptions it was
	// off CPU for no longer than it lived.
	if float64(got[pid]) > 1.05*float64(truth[pid]) {
		t.Errorf("pid %d: %v reported blocked, more than the %v it measured: the hour-long wait of the thread before was counted", pid,
			time.Duration(got[pid]), time.Duration(truth[pid]))
	}
	if all := time.Duration(offCPUOf(b, pid)[pid]); all > lived {
		t.Errorf("pid %d: %v off CPU reported, more than the %v it lived: the hour-long wait of the thread before was counted", pid, all, lived)
	}
}

// Issue 31: the filter's answer for a process read before it execs but
// written after the exec cleared its bits stood for the new image, so a
// fixture its parent exec'd was left out of off-CPU profiles for good (one
// CI run of TestCollectorOffCPU). Here the race is forced: a process waits
// in read, its wait asks about it, and Select, having read its name, lets
// it exec the selected fixture and waits for the exec before it answers.
// The fixture's waits are recorded all the same.
func TestOffCPUAnswerRacesExec(t *testing.T) {
	bin, comm := waitFixture(t)
	// Another copy, of another name, that execs the first when told.
	execer, execerComm := waitFixture(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	var once sync.Once
	raced := make(chan bool, 1)
	var forgets [2]uint64 // the pid's forget count before and after the exec, sent with raced
	selects, isExecer := byComm(comm), byComm(execerComm)
	var sp atomic.Pointer[Sampler] // set before the process starts
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true,
		OffCPU: offcpu.Config{Enabled: true, Select: func(pid int) bool {
			ok := selects(pid)
			if isExecer(pid) {
				// Its first answer: it execs before the answer lands.
				once.Do(func() {
					o := sp.Load().offcpu
					forgets[0] = o.forgetCount(uint32(pid))
					io.WriteString(w, "go\n")
					// The new name shows before the exec's
					// tracepoint runs (begin_new_exec sets comm,
					// handle_exec comes after the binary is
					// loaded): wait for both, or a slow machine
					// reads the count in between.
					execd := waitFor(10*time.Second, func() bool {
						forgets[1] = o.forgetCount(uint32(pid))
						return selects(pid) && forgets[1] > forgets[0]
					})
					raced <- execd
				})
			}
			return ok
		}},
	})
	sp.Store(s)
	cmd := exec.Command(execer, "exec", bin, "sleep", "1")
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout = r, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	select {
	case ok := <-raced:
		// The exec's clearing is counted where the host reads it
		// (offcpu_forgets' layout: a word a slot), which is what makes
		// the answer read again.
		if !ok {
			t.Fatalf("in 10 s, the process did not exec the fixture (selected %v) or the forget count of its slot did not move (%d before the exec, %d after: the kernel's count is not where the host reads)",
				selects(cmd.Process.Pid), forgets[0], forgets[1])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("its wait in read did not ask about it in 10 s")
	}
	checkAsleep(t, s, cmd, &out, 1.1)
}

// checkAsleep waits for the wait fixture cmd to end and holds the time it
// was reported blocked to what it measured in its calls (its output, out):
// from 90% to over times it (the waits left out until an answer lands are
// the 10%).
func checkAsleep(t *testing.T, s *Sampler, cmd *exec.Cmd, out *bytes.Buffer, over float64) {
	t.Helper()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	got, truth := blockedOf(b, pid)[pid], truthsOf(out.Bytes())[pid]
	t.Logf("fixture asleep %v by its clock, %v reported blocked (%v preempted)", time.Duration(truth), time.Duration(got),
		time.Duration(offCPUOf(b, pid)[pid]-got))
	if truth < int64(time.Second/2) {
		t.Fatalf("the fixture slept %v: %q", time.Duration(truth), out.String())
	}
	if float64(got) < 0.9*float64(truth) || float64(got) > over*float64(truth) {
		t.Errorf("%v off CPU reported; the fixture slept %v", time.Duration(got), time.Duration(truth))
	}
}

// Issue 30: a process off_cpu.targets left out is asked about again once a
// target's pods change (RetakeOffCPUAnswers). The fixture stops itself,
// unselected: its answer is no. Once Select would say yes and the answers
// are retaken, the waits after its SIGCONT are recorded.
func TestOffCPURetake(t *testing.T) {
	bin, comm := waitFixture(t)
	var selected atomic.Bool
	named := byComm(comm)
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true,
		OffCPU: offcpu.Config{Enabled: true, Select: func(pid int) bool { return selected.Load() && named(pid) }},
	})
	cmd := exec.Command(bin, "sleep", "1")
	cmd.Env = append(os.Environ(), "WAIT_STOPPED=1")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := uint32(cmd.Process.Pid)
	bits := func() uint64 { return binary.NativeEndian.Uint64(s.offcpu.procs[pid/32*8:]) >> (pid % 32 * 2) & 3 }
	if !waitFor(10*time.Second, func() bool { return procStateOf(pid) == "T" && bits() == 1 }) {
		t.Fatalf("fixture %d: state %q, filter bits %b; want stopped and answered no", pid, procStateOf(pid), bits())
	}
	selected.Store(true)
	if n := s.RetakeOffCPUAnswers(); n < 1 || bits() != 2 {
		t.Fatalf("retaken %d answers; the fixture's bits %b, want 10 (undecided)", n, bits())
	}
	cmd.Process.Signal(syscall.SIGCONT)
	// Its next switch asks again (undecided, 10).
	checkAsleep(t, s, cmd, &out, 1.05)
}

// RetakeOffCPUAnswers turns each no (01) into undecided (10) and leaves
// yes (11), undecided and unasked pids as they are, in every position of
// a word.
func TestRetakeOffCPUAnswersBits(t *testing.T) {
	// Words, as the map's memory is: 64-bit atomics need 8-byte
	// alignment on arm64 (a []byte of its own faulted there).
	words := make([]uint64, 2)
	o := &offcpuState{procs: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 16)} //nolint:gosec // the words' own bytes
	s := &Sampler{offcpu: o}
	want := map[uint32]uint64{}
	for pid := uint32(0); pid < 64; pid++ {
		v := uint64(pid % 4)
		o.setProcBits(pid, v)
		want[pid] = v
		if v == 1 {
			want[pid] = 2
		}
	}
	if n := s.RetakeOffCPUAnswers(); n != 16 {
		t.Errorf("retaken %d, want 16", n)
	}
	for pid, w := range want {
		if got := binary.NativeEndian.Uint64(o.procs[pid/32*8:]) >> (pid % 32 * 2) & 3; got != w {
			t.Errorf("pid %d: bits %b, want %b", pid, got, w)
		}
	}
	if n := s.RetakeOffCPUAnswers(); n != 0 {
		t.Errorf("retaken %d the second time, want 0", n)
	}
}

func procStateOf(pid uint32) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+3 > len(b) {
		return ""
	}
	return string(b[i+2 : i+3])
}

// Issue 32: a busy thread on a shared CPU is preempted again and again and
// never blocks, so its level stayed where it started and every preemption
// was walked. Two busy processes pinned to one CPU: their preemptions in a
// row now decay to Config.Preempted, most are not chosen, and the estimate
// of their runnable time still matches what the kernel measured
// (schedstat's run_delay: time on the run queue). Preempted is 0.25, not
// the default 0.05: the emulated VMs see about 120 preemptions a process
// in the window, and at 0.05 (six recorded) one run's estimate is too
// noisy to check; the decay is the same.
func TestOffCPUPreemptedDecay(t *testing.T) {
	taskset := testfixture.NeedTool(t, "taskset")
	built := buildC(t)
	data, err := os.ReadFile(built)
	if err != nil {
		t.Fatal(err)
	}
	comm := fmt.Sprintf("pr%08x", rand.Uint32())
	bin := filepath.Join(t.TempDir(), comm)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	s := newSampler(t, Config{
		SampleRate: 99, KernelStacks: true,
		OffCPU: offcpu.Config{Enabled: true, Preempted: 0.25, Select: byComm(comm)},
	})
	var pids []uint32
	for range 2 {
		cmd := exec.Command(taskset, "-c", "0", bin, "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		pids = append(pids, uint32(cmd.Process.Pid))
	}
	runDelay := func(pid uint32) int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		f := strings.Fields(string(b))
		if err != nil || len(f) < 2 {
			t.Fatalf("schedstat of %d: %v %q", pid, err, b)
		}
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		return ns
	}
	// Past start-up, and past the filter's answer for both processes: the
	// waits before it are not recorded (undecided), and a loaded machine
	// can keep the answer a while. The last drain starts the window.
	ready := map[uint32]bool{}
	if !waitFor(30*time.Second, func() bool {
		time.Sleep(200 * time.Millisecond)
		b, err := s.Drain()
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if len(offCPUOf(b, pid)) > 0 {
				ready[pid] = true
			}
		}
		return len(ready) == len(pids)
	}) {
		t.Fatalf("waits of %d of the 2 busy processes seen in 30 s", len(ready))
	}
	st0, _ := s.Stats()
	var d0 []int64
	for _, pid := range pids {
		d0 = append(d0, runDelay(pid))
	}
	time.Sleep(4 * time.Second)
	var truth []int64
	for i, pid := range pids {
		truth = append(truth, runDelay(pid)-d0[i])
	}
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	st1, _ := s.Stats()
	seen, chosen := st1.OffCPU.Seen-st0.OffCPU.Seen, st1.OffCPU.Chosen-st0.OffCPU.Chosen
	t.Logf("two busy processes on CPU 0: %d waits, %d chosen; stats %+v", seen, chosen, st1.OffCPU)
	if seen < 50 {
		t.Fatalf("only %d waits in 4 s: the processes were not preempted", seen)
	}
	if float64(chosen) > 0.5*float64(seen) {
		t.Errorf("%d of %d preemptions chosen: they should decay to 0.25", chosen, seen)
	}
	var est, v, want float64
	for i, pid := range pids {
		var e, pv float64
		for _, smp := range samplesOf(b, pid) {
			if smp.Origin == OriginOffCPU && smp.Runnable {
				e += float64(smp.OffCPUNs)
				pv += smp.OffCPUVar
			}
		}
		t.Logf("pid %d: run_delay %v, estimated %v (sd %v)", pid, time.Duration(truth[i]), time.Duration(e), time.Duration(math.Sqrt(pv)))
		est, v, want = est+e, v+pv, want+float64(truth[i])
	}
	// Both processes together, and loose on purpose: on a loaded CPU a
	// preemption now and then lasts hundreds of ms and counts 4 times when
	// recorded, while one not recorded leaves the estimated sd too small.
	// It catches a lost or doubled weight, not noise.
	if tol := 4*math.Sqrt(v) + 0.5*want; math.Abs(est-want) > tol {
		t.Errorf("estimated %v runnable, the kernel measured %v (tolerance %v)", time.Duration(est), time.Duration(want), time.Duration(tol))
	}
}

// answer reads the process once when nothing clears its bits meanwhile,
// and again each time the kernel's forget count of its slot moves between
// the read and the write (an exec or exit, or another pid of the slot),
// the last answer standing; three moves in a row leave it undecided.
func TestAnswerReadsAgainOnlyAfterAForget(t *testing.T) {
	pid := uint32(os.Getpid())
	for _, tc := range []struct {
		name    string
		forgets int // the first calls of Select that see a forget
		yesFrom int // Select says yes from this call on (1-based)
		calls   int // Select's calls
		want    uint64
	}{
		{"quiet", 0, 1, 1, 3},
		{"quiet, not targeted", 0, 9, 1, 1},
		{"exec during the first read", 1, 2, 2, 3},
		{"exec to a process left out", 1, 9, 2, 1},
		{"forgotten at every read", 3, 1, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			words := make([]uint64, procWords)
			counts := make([]uint64, bpf.ProfileOffcpuLimitsOFFCPU_FORGET_SLOTS)
			calls := 0
			o := &offcpuState{
				procs:   unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), len(words)*8),   //nolint:gosec // the words' own bytes
				forgets: unsafe.Slice((*byte)(unsafe.Pointer(&counts[0])), len(counts)*8), //nolint:gosec // likewise
				cfg: offcpu.Config{Select: func(p int) bool {
					calls++
					if calls <= tc.forgets {
						// What offcpu_forget does at an exec: count, then clear.
						counts[p%len(counts)]++
						words[p/32] &^= 3 << (p % 32 * 2)
					}
					return calls >= tc.yesFrom
				}},
			}
			got := o.answer(pid)
			bits := words[pid/32] >> (pid % 32 * 2) & 3
			if got != tc.want || bits != tc.want || calls != tc.calls {
				t.Errorf("answered %b, bits %b, %d reads; want %b after %d", got, bits, calls, tc.want, tc.calls)
			}
		})
	}
}
