// Package clock is the time that time-dependent code takes instead of
// calling package time: Real in production, a Fake in tests, which moves
// only when the test says so. Tests then assert what code does at an
// instant (a wait ends exactly at its deadline, an entry expires exactly at
// its TTL) instead of bounding wall-clock durations that a loaded machine
// stretches.
package clock

import "time"

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	// NewTimer is time.NewTimer.
	NewTimer(d time.Duration) Timer
	// AfterFunc is time.AfterFunc: f runs in its own goroutine.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a time.Timer of a Clock. C is nil for AfterFunc timers.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the system clock.
var Real Clock = system{}

// Or returns c, or Real when c is nil (a zero Config field).
func Or(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

type system struct{}

func (system) Now() time.Time { return time.Now() }

func (system) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

func (system) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time        { return t.t.C }
func (t realTimer) Stop() bool                 { return t.t.Stop() }
func (t realTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
