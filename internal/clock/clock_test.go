package clock

import (
	"testing"
	"time"
)

func TestFakeFiresInOrderAtTheirInstants(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	f := NewFake(start)
	a := f.NewTimer(2 * time.Second)
	fired := make(chan time.Time, 1)
	f.AfterFunc(time.Second, func() { fired <- f.Now() })
	stopped := f.NewTimer(time.Second)
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop: want true once, then false")
	}
	if at := f.WaitTimers(2); len(at) != 2 || !at[0].Equal(start.Add(time.Second)) {
		t.Fatalf("pending %v", at)
	}
	f.Advance(1500 * time.Millisecond)
	if got := <-fired; got.After(start.Add(1500 * time.Millisecond)) {
		t.Errorf("AfterFunc ran at %v", got)
	}
	select {
	case <-a.C():
		t.Fatal("a 2 s timer fired at 1.5 s")
	default:
	}
	f.Advance(500 * time.Millisecond)
	if got := <-a.C(); !got.Equal(start.Add(2 * time.Second)) {
		t.Errorf("fired at %v, want %v", got, start.Add(2*time.Second))
	}
	if !f.Now().Equal(start.Add(2 * time.Second)) {
		t.Errorf("Now %v", f.Now())
	}
	if a.Reset(time.Second) {
		t.Error("Reset of a fired timer reported it pending")
	}
	f.WaitTimersAt(start.Add(3*time.Second), 1)
	now := f.NewTimer(0)
	select {
	case <-now.C():
	default:
		t.Error("a timer of 0 did not fire at once")
	}
}

func TestOr(t *testing.T) {
	if Or(nil) != Real {
		t.Fatal("Or(nil) is not Real")
	}
	f := NewFake(time.Time{})
	if Or(f) != Clock(f) {
		t.Fatal("Or(f) is not f")
	}
}

func TestVirtualJumpsToEachTimer(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	v := NewVirtual(start)
	for _, d := range []time.Duration{time.Second, 250 * time.Millisecond} {
		<-v.NewTimer(d).C()
	}
	if got := v.Now().Sub(start); got != 1250*time.Millisecond {
		t.Fatalf("virtual time %v after waits of 1.25 s", got)
	}
}
