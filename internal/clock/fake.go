package clock

import (
	"slices"
	"sync"
	"time"
)

// Fake is a Clock for tests: its time moves only by Advance, which fires
// the timers it passes in order, each at its own instant. WaitTimers lets a
// test wait until the code under test has set its timers, so "it waits
// until exactly its deadline" is checked without sleeping.
type Fake struct {
	mu     sync.Mutex
	cond   *sync.Cond
	now    time.Time
	timers []*fakeTimer // pending
	auto   bool         // virtual time: a new timer moves the time to it
}

// NewVirtual returns a Fake whose time jumps to each new timer's deadline
// as it is set: waiting costs no real time, and the time read afterwards
// is the sum of the waits, exactly (for pacing and backoff arithmetic).
func NewVirtual(start time.Time) *Fake {
	f := NewFake(start)
	f.auto = true
	return f
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake {
	f := &Fake{now: start}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, fn: fn}
	t.Reset(d)
	return t
}

// Advance moves the time on by d, firing every timer due by then.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.advanceLocked(f.now.Add(d))
	f.mu.Unlock()
}

func (f *Fake) advanceLocked(end time.Time) {
	for {
		slices.SortStableFunc(f.timers, func(a, b *fakeTimer) int { return a.when.Compare(b.when) })
		if len(f.timers) == 0 || f.timers[0].when.After(end) {
			break
		}
		t := f.timers[0]
		f.timers = f.timers[1:]
		f.now = t.when
		t.fireLocked()
	}
	f.now = end
	f.cond.Broadcast()
}

// WaitTimers blocks until at least n timers are pending, and returns
// their deadlines, earliest first.
func (f *Fake) WaitTimers(n int) []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.timers) < n {
		f.cond.Wait()
	}
	var at []time.Time
	for _, t := range f.timers {
		at = append(at, t.when)
	}
	slices.SortFunc(at, time.Time.Compare)
	return at
}

// WaitTimersAt blocks until at least n pending timers are due at exactly
// when: the code under test is then waiting for that instant.
func (f *Fake) WaitTimersAt(when time.Time, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.countAtLocked(when) < n {
		f.cond.Wait()
	}
}

func (f *Fake) countAtLocked(when time.Time) int {
	n := 0
	for _, t := range f.timers {
		if t.when.Equal(when) {
			n++
		}
	}
	return n
}

type fakeTimer struct {
	f    *Fake
	c    chan time.Time
	fn   func()
	when time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

// Stop reports whether it stopped a pending timer.
func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.removeLocked()
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	was := t.removeLocked()
	t.when = t.f.now.Add(d)
	if d <= 0 { // due now, as time's timers are
		t.fireLocked()
		return was
	}
	t.f.timers = append(t.f.timers, t)
	t.f.cond.Broadcast()
	if t.f.auto {
		t.f.advanceLocked(t.when)
	}
	return was
}

func (t *fakeTimer) fireLocked() {
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.c <- t.when:
	default:
	}
}

func (t *fakeTimer) removeLocked() bool {
	i := slices.Index(t.f.timers, t)
	if i < 0 {
		return false
	}
	t.f.timers = slices.Delete(t.f.timers, i, i+1)
	return true
}
