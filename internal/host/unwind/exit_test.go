//go:build linux && (amd64 || arm64)

package unwind_test

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// TestExitMarksProcess: the exit tracepoint marks the process with its
// start time rather than deleting its kernel entry, and Forget deletes both.
// From Linux 6.16 the tracepoint fires before exit_mm(), and a sample in
// between still has the user stack (in _Exit): it used to find no entry and
// end not_ready, with no copy (TestRecordFirstSamplesWhole, under load).
// The entry is rewritten after the exit here, as a table load in flight
// does: the mark stays (it was a field of the entry, and one CI run on 6.12
// found it cleared).
func TestExitMarksProcess(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, chainPIE)
	u := h.s.Unwinder()
	type mark struct {
		start uint64
		found bool
		now   int64
	}
	marks := map[int]mark{}
	h.mu.Lock()
	h.onExit = func(pid int) {
		if err := u.SetRuntime(pid, unwind.Runtime{}); err != nil {
			t.Errorf("rewriting the entry of pid %d: %v", pid, err)
		}
		v, ok := unwind.ExitStart(u, pid)
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		h.mu.Lock()
		marks[pid] = mark{v, ok, ts.Nano()}
		h.mu.Unlock()
	}
	h.mu.Unlock()
	// The process ends once the agent tracks it, not after a set time: in
	// the emulated arm64 VM a fixture of 0.5 s once ended before its first
	// snapshot was loaded, and its exit found no entry to mark.
	cmd := exec.Command(bin, "60")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	tracked := waitUntil(30*time.Second, func() bool { return u.Tracked(pid) })
	_ = cmd.Process.Signal(unix.SIGTERM)
	_ = cmd.Wait() // ended by the signal
	if !tracked {
		t.Fatalf("pid %d not tracked after 30 s", pid)
	}
	time.Sleep(50 * time.Millisecond) // let the exit event through
	if samples := h.drain(t, pid); len(samples) == 0 {
		t.Fatal("no samples")
	}
	var m mark
	waitUntil(2*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		var ok bool
		m, ok = marks[pid]
		return ok
	})
	switch {
	case !m.found:
		t.Fatalf("pid %d: no kernel entry when its exit event came", pid)
	case m.start == 0 || int64(m.start) > m.now || m.now-int64(m.start) > int64(time.Minute):
		t.Fatalf("pid %d: exit_start %d, want its start time (now %d, monotonic)", pid, m.start, m.now)
	}
	if !waitUntil(2*time.Second, func() bool { return !u.Tracked(pid) }) {
		t.Fatalf("pid %d still tracked after Forget", pid)
	}
}

// TestReusedPidDropsDeadTables: tables left under a pid by a dead process,
// marked exited with its start time, whose exit userspace never handled (a
// lost event), while a new process runs on the pid. The new process's first
// sample drops them and their mark, and it is walked whole with its own
// tables once loaded; the mark used to stay and refuse it the walk.
func TestReusedPidDropsDeadTables(t *testing.T) {
	h := newHarness(t, sampler.Config{})
	bin := testfixture.Build(t, chainPIE)
	u := h.s.Unwinder()
	cmd := exec.Command(bin, fixtureSeconds)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	if !waitUntil(30*time.Second, func() bool { return u.Tracked(pid) }) {
		t.Fatalf("pid %d not tracked after 30 s", pid)
	}
	h.drain(t, pid) // what came before
	if err := unwind.PlantDeadProcess(u, pid); err != nil {
		t.Fatal(err)
	}
	if !waitUntil(5*time.Second, func() bool { start, ok := unwind.ExitStart(u, pid); return ok && start == 0 }) {
		start, ok := unwind.ExitStart(u, pid)
		t.Fatalf("pid %d: 5 s after the plant, entry %v, exit mark %d; want its own entry, unmarked", pid, ok, start)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the exit event through
	samples := h.drain(t, pid)
	p := h.norm.Cached(pid)
	if p == nil {
		t.Fatalf("no snapshot of pid %d", pid)
	}
	checkWhole(t, "reused-pid", evaluate(p, loadSymbols(t, bin), cChain, samples))
}
