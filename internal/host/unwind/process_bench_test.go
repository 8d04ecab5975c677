//go:build linux

package unwind_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// BenchmarkNewProcess measures what the agent pays per new process, as the
// receiver handles its events (profbuild.Builder.HandleEvent: a snapshot of
// /proc/PID, Track, the eager table builds it queues; Forget at exit), in
// process CPU and heap allocated per process, which do not depend on the
// machine's load:
//
//	go test -run '^$' -bench NewProcess -benchtime 200x ./internal/host/unwind
//
// known: every file the process maps has been seen (the common case: a
// shell running `sleep`); new-binary: its executable is a file never seen
// before (a fresh copy), so it is identified and gets a table; exited: the
// same, but the process exits right after its first sample, before the
// builders reach its table (most short-lived processes).
//
//	cpu_us/proc, alloc_KB/proc   the handler's cost (spawning the process is not counted)
//	builds/proc                  tables built per process
func BenchmarkNewProcess(b *testing.B) {
	sleep := testfixture.NeedTool(b, "sleep")
	data, err := os.ReadFile(sleep)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		newBinary  bool
		exitAtOnce bool
	}{
		{"known", false, false},
		{"new-binary", true, false},
		{"exited", true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			m := newManager(b, unwind.Config{})
			norm := normalize.New(normalize.Options{})
			dir := b.TempDir()
			// Warm up: libc, ld.so and sleep itself are known.
			warm := start(b, sleep)
			handle(b, m, norm, warm, false)
			settle(m)
			builds0 := m.Stats().Builds
			var total testfixture.Cost
			for i := range b.N {
				bin := sleep
				if c.newBinary {
					bin = filepath.Join(dir, "sleep"+strconv.Itoa(i))
					if err := os.WriteFile(bin, data, 0o755); err != nil {
						b.Fatal(err)
					}
				}
				cmd := start(b, bin)
				total = total.Add(testfixture.Measure(func() {
					handle(b, m, norm, cmd, c.exitAtOnce)
					settle(m)
				}))
				if !c.exitAtOnce {
					cmd.Process.Kill()
					cmd.Wait()
					m.Forget(cmd.Process.Pid)
					norm.Forget(cmd.Process.Pid)
				}
				if c.newBinary {
					os.Remove(bin)
				}
			}
			n := float64(b.N)
			b.ReportMetric(total.CPU.Seconds()*1e6/n, "cpu_us/proc")
			b.ReportMetric(float64(total.Alloc)/n/1e3, "alloc_KB/proc")
			b.ReportMetric(float64(m.Stats().Builds-builds0)/n, "builds/proc")
		})
	}
}

// start runs bin (a copy of sleep) until it has mapped libc.
func start(b *testing.B, bin string) *exec.Cmd {
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	maps := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "maps")
	if !waitUntil(5*time.Second, func() bool {
		m, err := os.ReadFile(maps)
		return err == nil && bytes.Contains(m, []byte("libc.so"))
	}) {
		b.Fatalf("%s never mapped libc", bin)
	}
	return cmd
}

// handle does what the receiver does on ProcessNew; with exit, the process
// then exits at once and the exit event follows.
func handle(b *testing.B, m *unwind.Manager, norm *normalize.Normalizer, cmd *exec.Cmd, exit bool) {
	pid := cmd.Process.Pid
	p, err := norm.Refresh(pid)
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Track(p); err != nil {
		b.Fatal(err)
	}
	if exit {
		cmd.Process.Kill()
		cmd.Wait()
		m.Forget(pid)
		norm.Forget(pid)
	}
}

// settle waits until no table is queued or being built. Speculative builds
// wait 100 ms; each wake of this process costs tens of µs of CPU (more on
// an idle VM), so it sleeps past that once rather than polling.
func settle(m *unwind.Manager) {
	if m.Stats().TablesPending == 0 {
		return
	}
	time.Sleep(120 * time.Millisecond)
	for end := time.Now().Add(10 * time.Second); m.Stats().TablesPending > 0 && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
}
