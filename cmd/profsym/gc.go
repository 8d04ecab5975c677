package main

import (
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/symbolize"
)

// gcHoldLimit bounds the heap while the collector is held off: twice the
// engine's budget, the heap GOGC=100 allows at a live heap of the budget.
const gcHoldLimit = 2 * max(symbolize.DefaultCacheBytes, elfx.DefaultMaxDecompressedBytes)

// minHoldGrowth is the least heap growth worth holding the collector for:
// with less room than that, collecting as usual costs little and keeps the
// process inside its limits.
const minHoldGrowth = 64 << 20

// holdGC turns the collector off (up to holdLimit) until release is
// called. Opening an object allocates its index once, with little garbage,
// and a collection meanwhile only takes a core from the parse: on two
// cores it cost the first answers of libc a seventh of their wall time.
// A GOGC or GOMEMLIMIT the user set is kept, and so is the collector when
// the process's limits leave no room to hold it.
func holdGC() (release func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	hold, ok := holdLimit(goMemory(), readSysLimits())
	if !ok {
		return func() {}
	}
	limit := debug.SetMemoryLimit(hold)
	percent := debug.SetGCPercent(-1)
	start := numGC()
	var once sync.Once
	return func() {
		once.Do(func() {
			heldGCs.Store(numGC() - start)
			debug.SetGCPercent(percent)
			debug.SetMemoryLimit(limit)
		})
	}
}

// heldGCs is how many collections the last hold saw end: what the hold is
// for, counted from when it began (a test process's other goroutines may
// start one before).
var heldGCs atomic.Uint32

func numGC() uint32 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.NumGC
}

// sysLimits is what the process may still take beyond what it has, as the
// kernel counts it; -1 where nothing bounds it (or it cannot be read).
type sysLimits struct {
	// addressSpace is RLIMIT_AS less the address space mapped now. The
	// runtime's reservations, thread stacks and the files elfx maps all
	// count, and a heap that cannot grow there ends the process with
	// "fatal error: out of memory", whatever GOGC says.
	addressSpace int64
	// cgroup is the memory cgroup's limit less its usage, the least over
	// the process's cgroup and its ancestors; past it the kernel kills.
	cgroup int64
}

// holdLimit is the memory limit for the hold: gcHoldLimit, or less when the
// limits leave less room. The heap may take half of the room left (the rest
// is for file mappings, decompressed sections and thread stacks, which the
// runtime's limit does not see). ok is false when that is too little to
// hold the collector for.
func holdLimit(goNow int64, lim sysLimits) (limit int64, ok bool) {
	growth := int64(gcHoldLimit) - goNow
	for _, room := range []int64{lim.addressSpace, lim.cgroup} {
		if room >= 0 {
			growth = min(growth, room/2)
		}
	}
	if growth < minHoldGrowth {
		return 0, false
	}
	return goNow + growth, true
}

// goMemory is the memory the runtime holds now, as its memory limit counts it.
func goMemory() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.Sys - m.HeapReleased)
}
