package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// gcPercent reads the collector's GOGC setting.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestHoldGC(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	before, limit := gcPercent(), debug.SetMemoryLimit(-1)
	release := holdGC()
	if p := gcPercent(); p != -1 {
		t.Errorf("held: GOGC %d, want off", p)
	}
	if l := debug.SetMemoryLimit(-1); l != gcHoldLimit {
		t.Errorf("held: memory limit %d, want %d", l, gcHoldLimit)
	}
	release()
	release() // a second release changes nothing
	if p := gcPercent(); p != before {
		t.Errorf("released: GOGC %d, want %d", p, before)
	}
	if l := debug.SetMemoryLimit(-1); l != limit {
		t.Errorf("released: memory limit %d, want %d", l, limit)
	}
}

func TestHoldGCKeepsTheUsersSetting(t *testing.T) {
	t.Setenv("GOGC", "50")
	before := gcPercent()
	release := holdGC()
	if p := gcPercent(); p != before {
		t.Errorf("GOGC set by the user: %d, want %d kept", p, before)
	}
	release()
}

// Symbolizing libc with libc6-dbg's DWARF (about 16 MB of heap for its
// index: five collections at GOGC=100, checked by turning the hold off)
// answers its one batch without a collection, and leaves the collector as
// it found it.
func TestSymbolizeHoldsGCForTheFirstBatch(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	libc, text, _ := libcWithDebug(t)
	var in strings.Builder
	for i := range uint64(400) {
		fmt.Fprintf(&in, "0x%x\n", text.lo+i*(text.size/400))
	}
	before := gcPercent()
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	out, stderr, code := runCLI(t, in.String(), "--obj="+libc)
	runtime.ReadMemStats(&m1)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if n := strings.Count(out, "\n\n"); n != 400 {
		t.Fatalf("%d answers of 400", n)
	}
	t.Logf("%d MB allocated, %d collections", (m1.TotalAlloc-m0.TotalAlloc)>>20, m1.NumGC-m0.NumGC)
	if m1.TotalAlloc-m0.TotalAlloc < 3*m0.HeapAlloc {
		t.Fatalf("only %d bytes allocated against a %d-byte heap: not enough to show the hold", m1.TotalAlloc-m0.TotalAlloc, m0.HeapAlloc)
	}
	// Counted by the hold itself: a collection another goroutine of this
	// test process started before the hold began is not the hold's (CI saw
	// one once, 23 MB into a run that allocates 23 MB).
	if n := heldGCs.Load(); n != 0 {
		t.Errorf("%d collections during the first batch (%d in the whole run)", n, m1.NumGC-m0.NumGC)
	}
	if p := gcPercent(); p != before {
		t.Errorf("after the run: GOGC %d, want %d", p, before)
	}
}

// The hold never lets the heap take more than half of the room RLIMIT_AS
// or the memory cgroup leaves, and is not taken at all when that is small.
// It was always gcHoldLimit (1 GiB): under `ulimit -v 2097152`, where the
// runtime's reservations and thread stacks already take about 1.6 GiB, a
// held heap that grew into the rest died with "fatal error: out of memory".
func TestHoldLimit(t *testing.T) {
	const goNow = 8 << 20
	for _, c := range []struct {
		name   string
		lim    sysLimits
		want   int64
		wantOK bool
	}{
		{"unlimited", sysLimits{-1, -1}, gcHoldLimit, true},
		{"address space", sysLimits{400 << 20, -1}, goNow + 200<<20, true},
		{"cgroup", sysLimits{-1, 300 << 20}, goNow + 150<<20, true},
		{"both, the least", sysLimits{1 << 30, 200 << 20}, goNow + 100<<20, true},
		{"above the budget", sysLimits{8 << 30, 8 << 30}, gcHoldLimit, true},
		{"no room", sysLimits{100 << 20, -1}, 0, false},
		{"none at all", sysLimits{0, 0}, 0, false},
	} {
		got, ok := holdLimit(goNow, c.lim)
		if got != c.want || ok != c.wantOK {
			t.Errorf("%s: holdLimit = %d, %v; want %d, %v", c.name, got, ok, c.want, c.wantOK)
		}
	}
}
