package main

import (
	"runtime/debug"
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
