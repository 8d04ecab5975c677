package main

import (
	"os"
	"runtime/debug"
	"sync"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/symbolize"
)

// gcHoldLimit bounds the heap while the collector is held off: twice the
// engine's budget, the heap GOGC=100 allows at a live heap of the budget.
const gcHoldLimit = 2 * max(symbolize.DefaultCacheBytes, elfx.DefaultMaxDecompressedBytes)

// holdGC turns the collector off (up to gcHoldLimit) until release is
// called. Opening an object allocates its index once, with little garbage,
// and a collection meanwhile only takes a core from the parse: on two
// cores it cost the first answers of libc a seventh of their wall time.
// A GOGC or GOMEMLIMIT the user set is kept.
func holdGC() (release func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	limit := debug.SetMemoryLimit(gcHoldLimit)
	percent := debug.SetGCPercent(-1)
	var once sync.Once
	return func() {
		once.Do(func() {
			debug.SetGCPercent(percent)
			debug.SetMemoryLimit(limit)
		})
	}
}
