//go:build linux

package unwind_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/unwind"
)

// TestHelperSleep is the long-lived process of TestTablesBuiltFromLivingProcesses
// (a Go binary: over 1 MiB of .gopclntab, so its table waits for a sample).
func TestHelperSleep(t *testing.T) {
	if os.Getenv("PROFSYM_HELPER_SLEEP") == "" {
		t.Skip("the helper process of TestTablesBuiltFromLivingProcesses")
	}
	time.Sleep(time.Minute)
}

// TestTablesBuiltFromLivingProcesses: a file's table is built through a
// process that maps it now, whichever processes saw it first. A chrooted
// JVM's libc was at times first seen in the shell that exec'd java (and in
// the mount(8) it ran): the table was built through their /proc paths, dead
// by then, and the JVM stayed without it for its whole life, every sample
// marked no_table. Both ways there are driven here, on copies of the test
// binary: (1) the first processes are gone when the build runs; (2) the
// build ran while only a dead process (its exit not handled yet) mapped the
// file, and a living one maps it afterwards.
func TestTablesBuiltFromLivingProcesses(t *testing.T) {
	m, maps := newManagerMaps(t, unwind.Config{})
	norm := normalize.New(normalize.Options{})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyOf := func(t *testing.T, name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o755); err != nil { //nolint:gosec // in the test's temporary directory
			t.Fatal(err)
		}
		return p
	}
	start := func(t *testing.T, bin string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^TestHelperSleep$")
		cmd.Env = append(os.Environ(), "PROFSYM_HELPER_SLEEP=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// snapshot loads the process's mappings, as a process event does, and
	// returns the table slot of bin's code.
	snapshot := func(t *testing.T, cmd *exec.Cmd, bin string) uint32 {
		t.Helper()
		var p *normalize.Process
		var err error
		i := -1
		waitUntil(10*time.Second, func() bool {
			p, err = norm.Refresh(cmd.Process.Pid)
			if err != nil {
				return false
			}
			for j, mp := range p.Mappings {
				if mp.Path == bin && mp.File != nil && mp.File.Err == nil {
					i = j
					return true
				}
			}
			return false
		})
		if i < 0 {
			t.Fatalf("pid %d: %s not mapped (%v)", cmd.Process.Pid, bin, err)
		}
		if err := m.Track(p); err != nil {
			t.Fatal(err)
		}
		var pv bpf.ProfileUnwindProc
		var mv bpf.ProfileUnwindMapping
		if err := maps.Procs.Lookup(uint32(cmd.Process.Pid), &pv); err != nil {
			t.Fatal(err)
		}
		if err := maps.Mappings.Lookup(pv.First+uint32(i), &mv); err != nil {
			t.Fatal(err)
		}
		return mv.Table
	}
	kill := func(cmd *exec.Cmd) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // killed: its error says so
	}
	state := func(t *testing.T, slot uint32) uint32 {
		var tab bpf.ProfileUnwindTable
		if err := maps.Tables.Lookup(slot, &tab); err != nil {
			t.Fatal(err)
		}
		return tab.State
	}
	// build asks for the table as a sample does, and waits for the builders.
	build := func(t *testing.T, slot uint32) uint32 {
		t.Helper()
		if s := state(t, slot); s != uint32(bpf.ProfileTableStateTABLE_LAZY) {
			t.Fatalf("slot %d: state %d before a sample asks, want lazy", slot, s)
		}
		m.Request(slot)
		if !waitUntil(30*time.Second, func() bool { return settled(m) }) {
			t.Fatalf("tables still pending: %+v", m.Stats())
		}
		return state(t, slot)
	}
	ready := uint32(bpf.ProfileTableStateTABLE_READY)

	t.Run("first processes gone", func(t *testing.T) {
		bin := copyOf(t, "a")
		first := start(t, bin)
		snapshot(t, first, bin)
		snapshot(t, first, bin) // its maps changed: a second snapshot
		living := start(t, bin)
		slot := snapshot(t, living, bin)
		kill(first)
		m.Forget(first.Process.Pid)
		if s := build(t, slot); s != ready {
			t.Errorf("table of a file a living process maps: state %d, want ready (%+v)", s, m.Stats())
		}
	})
	t.Run("mapped again after a failed build", func(t *testing.T) {
		bin := copyOf(t, "b")
		dead := start(t, bin)
		slot := snapshot(t, dead, bin)
		kill(dead) // its exit event not handled yet
		if s := build(t, slot); s == ready {
			t.Fatalf("table built through a process that is gone")
		}
		// A sample that read "lazy" before the failure was published
		// stores "pending" over it and asks (a plain store in
		// bpf/unwind.h): the slot must say "none" again.
		if err := maps.Tables.Put(slot, bpf.ProfileUnwindTable{State: uint32(bpf.ProfileTableStateTABLE_PENDING)}); err != nil {
			t.Fatal(err)
		}
		m.Request(slot)
		if s := state(t, slot); s != uint32(bpf.ProfileTableStateTABLE_NONE) {
			t.Errorf("slot %d after a late request: state %d, want none", slot, s)
		}
		living := start(t, bin)
		if got := snapshot(t, living, bin); got != slot {
			t.Fatalf("slot %d for the same file, want %d", got, slot)
		}
		m.Forget(dead.Process.Pid)
		if s := build(t, slot); s != ready {
			t.Errorf("table of a file a living process maps: state %d, want ready (%+v)", s, m.Stats())
		}
	})
}
