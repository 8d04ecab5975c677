//go:build linux

package unwind_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/sampler"
	"github.com/profsym/profsym/internal/host/unwind"
	"github.com/profsym/profsym/internal/testfixture"
)

// newManager makes a Manager over maps of its own, sized by cfg, that no
// program reads (so the grace period is nothing to wait for).
func newManager(t testing.TB, cfg unwind.Config) *unwind.Manager {
	t.Helper()
	m, _ := newManagerMaps(t, cfg)
	return m
}

// newManagerMaps is newManager, also returning the maps.
func newManagerMaps(t testing.TB, cfg unwind.Config) (*unwind.Manager, unwind.Maps) {
	t.Helper()
	testfixture.Short(t, "eBPF")
	if err := sampler.CheckPrerequisites(); err != nil {
		testfixture.SkipOrFail(t, "%v", err)
	}
	cfg.SetDefaults()
	mk := func(typ ebpf.MapType, key, val uint32, n uint32, flags uint32) *ebpf.Map {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: key, ValueSize: val, MaxEntries: n, Flags: flags})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	maps := unwind.Maps{
		Procs:    mk(ebpf.Hash, 4, uint32(unsafe.Sizeof(bpf.ProfileUnwindProc{})), uint32(cfg.MaxProcesses), 0),
		Mappings: mk(ebpf.Array, 4, unwind.MappingBytes, uint32(cfg.MaxMappings), 0),
		Tables:   mk(ebpf.Array, 4, uint32(unsafe.Sizeof(bpf.ProfileUnwindTable{})), uint32(cfg.MaxTables), 0),
		Rows:     mk(ebpf.Array, 4, unwind.RowBytes, cfg.Rows(), 1<<10 /* BPF_F_MMAPABLE */),
		Sync:     func() error { return nil },
	}
	m, err := unwind.New(cfg, maps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m, maps
}

// track starts bin (a copy of sleep), loads its mappings and returns it.
func track(t *testing.T, m *unwind.Manager, norm *normalize.Normalizer, bin string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Past exec and the dynamic loader: libc is mapped.
	waitUntil(5*time.Second, func() bool {
		p, err := norm.Refresh(cmd.Process.Pid)
		return err == nil && len(p.Mappings) >= 3
	})
	p, err := norm.Refresh(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Track(p); err != nil {
		t.Fatal(err)
	}
	return cmd
}

func settled(m *unwind.Manager) bool {
	st := m.Stats()
	return st.TablesPending == 0
}

// TestTableLimits fills tiny maps: libc's table (23k rows) does not fit in
// 64 KiB of rows and stays on frame pointers, counted; 15 table slots
// force the eviction of tables no process maps any more. Nothing fails.
func TestTableLimits(t *testing.T) {
	sleep := testfixture.NeedTool(t, "sleep")
	m := newManager(t, unwind.Config{MaxTableBytes: 64 << 10, MaxTables: 16})
	norm := normalize.New(normalize.Options{})
	dir := t.TempDir()
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		// A copy is a file never seen before: a table of its own.
		bin := filepath.Join(dir, "sleep"+string(rune('a'+i)))
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := track(t, m, norm, bin)
		if !waitUntil(10*time.Second, func() bool { return settled(m) }) {
			t.Fatalf("tables still pending: %+v", m.Stats())
		}
		if !m.Tracked(cmd.Process.Pid) {
			t.Fatalf("pid %d not tracked: %+v", cmd.Process.Pid, m.Stats())
		}
		m.Forget(cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
	}
	st := m.Stats()
	t.Logf("%+v", st)
	if st.NoRoom == 0 {
		t.Error("libc's table fit in 64 KiB of rows?")
	}
	if st.Evictions == 0 {
		t.Error("20 files through 15 table slots evicted nothing")
	}
	if st.RowBytes > 64<<10 || st.Tables+st.TablesPending+st.TablesLazy+st.TablesNone > 15 {
		t.Errorf("over the bounds: %+v", st)
	}
	if st.Processes != 0 || st.Mappings != 0 {
		t.Errorf("forgotten processes still hold mappings: %+v", st)
	}
}

// TestNoBuildsForExitedProcesses: the table of a new binary whose process
// is gone before its speculative build is never built, whether the exit is
// handled first (Forget) or arrives later (the BPF side dropped the process
// at exit); a process that lives on gets its table.
func TestNoBuildsForExitedProcesses(t *testing.T) {
	sleep := testfixture.NeedTool(t, "sleep")
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyOf := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	m, maps := newManagerMaps(t, unwind.Config{})
	norm := normalize.New(normalize.Options{})
	// libc, ld.so and sleep's own file get their tables first.
	warm := track(t, m, norm, sleep)
	waitUntil(5*time.Second, func() bool { return settled(m) })
	st0 := m.Stats()

	forgotten := track(t, m, norm, copyOf("a"))
	forgotten.Process.Kill()
	forgotten.Wait()
	m.Forget(forgotten.Process.Pid)

	late := track(t, m, norm, copyOf("b"))
	late.Process.Kill()
	late.Wait()
	// What the BPF side does at exit (these maps have no program).
	if err := maps.Procs.Delete(uint32(late.Process.Pid)); err != nil {
		t.Fatal(err)
	}

	living := track(t, m, norm, copyOf("c"))
	if !waitUntil(5*time.Second, func() bool { return settled(m) && m.Stats().Builds > st0.Builds }) {
		t.Fatalf("the living process's table was not built: %+v", m.Stats())
	}
	time.Sleep(200 * time.Millisecond)
	st := m.Stats()
	// The skips are what says the exited processes cost no build. A lazy
	// table of the warm-up may still be built meanwhile on a loaded
	// machine (one CI run counted 2 builds, 3 skips), so builds are not
	// counted exactly.
	if st.Builds-st0.Builds < 1 || st.BuildsSkipped-st0.BuildsSkipped < 2 {
		t.Errorf("builds %d, skipped %d; want at least 1 and at least 2 (%+v)", st.Builds-st0.Builds, st.BuildsSkipped-st0.BuildsSkipped, st)
	}
	m.Forget(late.Process.Pid)
	_, _ = warm, living
}

// TestPendingOverReadyRepaired: a sample that read "lazy" just before the
// table was published writes "pending" over "ready" (a plain store in
// bpf/unwind.h) and sends an event; when that event is lost (ring full) the
// file must not stay on frame pointers: Poll publishes the table again.
func TestPendingOverReadyRepaired(t *testing.T) {
	sleep := testfixture.NeedTool(t, "sleep")
	m, maps := newManagerMaps(t, unwind.Config{})
	norm := normalize.New(normalize.Options{})
	cmd := track(t, m, norm, sleep)
	// No sample asks for a table here: ask for each as one would.
	var slots []uint32
	var tab bpf.ProfileUnwindTable
	for slot := uint32(0); slot < uint32(maps.Tables.MaxEntries()); slot++ {
		if maps.Tables.Lookup(slot, &tab) == nil && tab.State == uint32(bpf.ProfileTableStateTABLE_LAZY) {
			slots = append(slots, slot)
			m.Request(slot)
		}
	}
	if len(slots) == 0 {
		t.Fatalf("no lazy table for pid %d: %+v", cmd.Process.Pid, m.Stats())
	}
	if !waitUntil(20*time.Second, func() bool { return settled(m) }) {
		t.Fatalf("tables still pending: %+v", m.Stats())
	}
	var ready []uint32
	for _, slot := range slots {
		if maps.Tables.Lookup(slot, &tab) == nil && tab.State == uint32(bpf.ProfileTableStateTABLE_READY) {
			ready = append(ready, slot)
		}
	}
	if len(ready) == 0 {
		t.Fatalf("no table built: %+v", m.Stats())
	}
	for _, slot := range ready {
		if err := maps.Tables.Put(slot, bpf.ProfileUnwindTable{State: uint32(bpf.ProfileTableStateTABLE_PENDING)}); err != nil {
			t.Fatal(err)
		}
	}
	m.Poll()
	for _, slot := range ready {
		if err := maps.Tables.Lookup(slot, &tab); err != nil || tab.State != uint32(bpf.ProfileTableStateTABLE_READY) || tab.Count == 0 {
			t.Errorf("slot %d after Poll: %+v, %v; want its ready table again", slot, tab, err)
		}
	}
	if st := m.Stats(); st.Republished != uint64(len(ready)) {
		t.Errorf("republished %d, want %d", st.Republished, len(ready))
	}
}
