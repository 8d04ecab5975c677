package runtimes

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/unwind"
)

// Each runtime owns its block of frame kinds, HotSpot's 1-15,
// CPython's 16-31, then V8, PHP, Perl and Ruby 8 each (bpf/runtime.h).
func TestFrameType(t *testing.T) {
	for kind, want := range map[uint8]string{
		0: frame.TypeNative, 1: frame.TypeJVM, 15: frame.TypeJVM,
		16: frame.TypeCPython, 31: frame.TypeCPython, 32: frame.TypeV8JS, 39: frame.TypeV8JS,
		40: frame.TypePHP, 47: frame.TypePHP, 48: frame.TypePerl, 55: frame.TypePerl,
		56: frame.TypeRuby, 63: frame.TypeRuby, 64: frame.TypeNative, 255: frame.TypeNative,
	} {
		if got := FrameType(kind); got != want {
			t.Errorf("kind %d: %s, want %s", kind, got, want)
		}
	}
	for k, want := range map[Kind][2]uint8{
		KindHotSpot: {1, 16}, KindCPython: {16, 32}, KindV8: {32, 40},
		KindPHP: {40, 48}, KindPerl: {48, 56}, KindRuby: {56, 64}, KindNone: {0, 0},
	} {
		if first, end := Block(k); first != want[0] || end != want[1] {
			t.Errorf("%v: block [%d, %d), want %v", k, first, end, want)
		}
	}
}

// fakeRuntime names every frame it is given after itself.
type fakeRuntime struct{ kind Kind }

func (f fakeRuntime) Kind() Kind                                           { return f.kind }
func (f fakeRuntime) Attach(*normalize.Process) ([][2]uint64, bool, error) { return nil, false, nil }
func (f fakeRuntime) Forget(int)                                           {}
func (f fakeRuntime) Name(int, Frame) (Symbol, error) {
	return Symbol{Frames: []frame.Frame{{Name: f.kind.String()}}}, nil
}

// Issue 26: with HotSpot and CPython both on, as the binaries run them,
// CPython's first frame kind went to HotSpot, which did not know the
// process (runtime_not_attached). A Set routes each block to its runtime,
// whatever the order the runtimes come in.
func TestSetRoutesKindsToTheirRuntime(t *testing.T) {
	hs, py := fakeRuntime{KindHotSpot}, fakeRuntime{KindCPython}
	for _, order := range [][]Runtime{{hs, py}, {py, hs}} {
		s := NewSet(zap.NewNop(), nil, order...)
		for kind, want := range map[uint8]string{1: "hotspot", 15: "hotspot", 16: "cpython", 31: "cpython", 0: "", 32: "", 63: "", 64: ""} {
			sym, err := s.Name(1, Frame{Kind: kind})
			got := ""
			if err == nil {
				got = sym.Frames[0].Name
			}
			if got != want || (want == "") != errors.Is(err, ErrNotAttached) {
				t.Errorf("order %v, kind %d: named by %q (%v), want %q", order, kind, got, err, want)
			}
		}
	}
}

// attachRuntime answers every Attach with err, as a runtime found in p.
type attachRuntime struct {
	fakeRuntime
	err error
}

func (a attachRuntime) Attach(*normalize.Process) ([][2]uint64, bool, error) { return nil, true, a.err }

type nopUnwinder struct{}

func (nopUnwinder) SetRuntime(int, unwind.Runtime) error { return nil }

// A process that exits while its runtime is read (a JVM that only runs
// java -version) is not a refusal: CI's TestJavaVersions once counted
// JDK 8's java -version as one. A runtime that cannot be walked is.
func TestProcessGoneIsNotRefused(t *testing.T) {
	gone := NewSet(zap.NewNop(), nopUnwinder{}, attachRuntime{fakeRuntime{KindHotSpot}, fmt.Errorf("pid 7: %w", ErrProcessGone)})
	gone.Attach(&normalize.Process{PID: 7})
	if n := gone.Stats().Failed["hotspot"]; n != 0 {
		t.Errorf("an exited process counted as %d refusals", n)
	}
	broken := NewSet(zap.NewNop(), nopUnwinder{}, attachRuntime{fakeRuntime{KindHotSpot}, errors.New("layout refused")})
	broken.Attach(&normalize.Process{PID: 8})
	if n := broken.Stats().Failed["hotspot"]; n != 1 {
		t.Errorf("a refused layout counted %d times, want once", n)
	}
}

// pathRuntime is found in a process that maps path, and records what
// the Set asked of it.
type pathRuntime struct {
	fakeRuntime
	path              string
	attached, forgots *int
}

func (r pathRuntime) Attach(p *normalize.Process) ([][2]uint64, bool, error) {
	for _, m := range p.Mappings {
		if m.Path == r.path {
			*r.attached++
			return [][2]uint64{{m.Start, m.End}}, true, nil
		}
	}
	return nil, false, nil
}

func (r pathRuntime) Forget(int) { *r.forgots++ }

// A snapshot read before another one that was attached arrives late (two
// goroutines take them: the arm64 VM's TestHostileProcess/endless once
// had a vfork child's snapshot, read before its exec, attached after the
// JVM's, which started its count of failed attaches again). It changes
// nothing; a newer one is attached, and Forget clears the order.
func TestOlderSnapshotIsSkipped(t *testing.T) {
	var attached, forgots int
	s := NewSet(zap.NewNop(), nopUnwinder{}, pathRuntime{fakeRuntime{KindHotSpot}, "/jvm/libjvm.so", &attached, &forgots})
	t0 := time.Now()
	before := &normalize.Process{PID: 9, ReadAt: t0}
	jvm := &normalize.Process{PID: 9, ReadAt: t0.Add(time.Millisecond), Mappings: []normalize.Mapping{{Start: 0x1000, End: 0x2000, Path: "/jvm/libjvm.so"}}}
	s.Attach(jvm)
	s.Attach(before)
	if attached != 1 || forgots != 0 {
		t.Fatalf("after an older snapshot: %d attaches, %d forgets, want 1 and 0", attached, forgots)
	}
	if s.Stats().Attached != 1 {
		t.Errorf("attached %d processes, want 1", s.Stats().Attached)
	}
	s.Attach(jvm) // the same snapshot again: not older
	if attached != 2 {
		t.Errorf("the same snapshot again: %d attaches, want 2", attached)
	}
	s.Forget(9)
	s.Attach(before) // a new process on the pid: its first snapshot counts
	if forgots != 1 {
		t.Errorf("%d forgets, want 1 (Forget's)", forgots)
	}
	s.Attach(jvm)
	if attached != 3 {
		t.Errorf("after Forget: %d attaches, want 3", attached)
	}
}
