package hotspot

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/filever"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// lockedMem serializes a fakeMem, whose read counters are not atomic: the
// memory of a real process (pread) takes concurrent reads.
type lockedMem struct {
	mu sync.Mutex
	m  *fakeMem
}

func (l *lockedMem) Read(addr uint64, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.Read(addr, p)
}

func (l *lockedMem) U64(addr uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.U64(addr)
}

func (l *lockedMem) U32(addr uint64) (uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.U32(addr)
}

func (l *lockedMem) U16(addr uint64) (uint16, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.U16(addr)
}

func (l *lockedMem) CString(addr uint64, max int) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m.CString(addr, max)
}

func (l *lockedMem) Close() error { return nil }

// startingJVM is a JVM process whose libjvm's statics are zero, as in a
// JVM that has not made its code cache yet: Attach reads its layout (from
// the runtime's cache) and finds it not ready.
func startingJVM(t *testing.T, j *fakeJVM) (*Runtime, *normalize.Process) {
	t.Helper()
	statics := j.alloc(4096)
	file := &normalize.FileInfo{ID: filever.Version{Dev: 1, Ino: 2}, GNUBuildID: "0011",
		Loads: []elfx.Segment{{Off: 0, Vaddr: 0, Filesz: 1 << 20}}}
	p := &normalize.Process{PID: 1, Mappings: []normalize.Mapping{
		{Start: statics, End: statics + 4096, Path: "/usr/lib/jvm/lib/server/libjvm.so", File: file},
	}}
	r := New(runtimes.Config{}, nopMap{}, nil, nil)
	mem := &lockedMem{m: j.m}
	r.openMem = func(int) (memory, error) { return mem, nil }
	r.loaded = func(int, *normalize.Mapping) error { return nil }
	r.layouts[layoutKeyOf(&p.Mappings[0])] = layoutEntry{l: j.l}
	return r, p
}

// A name cached for a JVM that was since replaced (exec'd, or its pid
// reused) and whose successor is not attached yet cannot be checked: it
// is dropped, not checked against a layout the new process does not have
// (a nil dereference before).
func TestCachedNameOfReplacedProcess(t *testing.T) {
	j := newFakeJVM()
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17})
	r, p := startingJVM(t, j)
	f := interp(j, hot, 0)
	r.names.Add(nameKey{pid: 1, f: f}, runtimes.Symbol{Frames: []frame.Frame{{Name: "fixture.Chain.hot"}}, Type: frame.TypeJVM})

	// Made but not attached: no layout at all.
	r.procs[1] = &proc{pid: 1, mem: j.m}
	if _, err := r.Name(1, f); !errors.Is(err, runtimes.ErrNotAttached) {
		t.Fatalf("cached name, process not attached: %v, want %v", err, runtimes.ErrNotAttached)
	}
	// Its layout read, its code cache not made yet.
	r.names.Add(nameKey{pid: 1, f: f}, runtimes.Symbol{Frames: []frame.Frame{{Name: "fixture.Chain.hot"}}, Type: frame.TypeJVM})
	delete(r.procs, 1)
	if _, _, err := r.Attach(p); err != nil {
		t.Fatal(err)
	}
	if pr := r.procs[1]; pr == nil || pr.l == nil || pr.ready.Load() {
		t.Fatalf("attach of a starting JVM: %+v", pr)
	}
	if _, err := r.Name(1, f); !errors.Is(err, runtimes.ErrNotAttached) {
		t.Fatalf("cached name, layout read but not attached: %v, want %v", err, runtimes.ErrNotAttached)
	}
}

// The sampler attaches and forgets processes on its event goroutine while
// its report goroutine names their frames and forgets those that exited.
// Run under -race (make test-race): before attach state was published
// through ready, this raced on a proc's layout and could dereference nil.
func TestAttachWhileNaming(t *testing.T) {
	j := newFakeJVM()
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17})
	r, p := startingJVM(t, j)
	f := interp(j, hot, 0)
	sym := runtimes.Symbol{Frames: []frame.Frame{{Name: "fixture.Chain.hot"}}, Type: frame.TypeJVM}
	const rounds = 2000
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // events: snapshots of a JVM that keeps being replaced
		defer wg.Done()
		for range rounds {
			if _, _, err := r.Attach(p); err != nil {
				t.Errorf("attach: %v", err)
				return
			}
			r.Forget(1)
		}
	}()
	go func() { // reports: names, some cached from the process before
		defer wg.Done()
		for range rounds {
			r.names.Add(nameKey{pid: 1, f: f}, sym)
			if _, err := r.Name(1, f); err != nil && !errors.Is(err, runtimes.ErrNotAttached) {
				t.Errorf("name: %v", err)
				return
			}
		}
	}()
	go func() { // reports: exited processes forgotten after their drain
		defer wg.Done()
		for range rounds {
			r.Forget(1)
		}
	}()
	wg.Wait()
}

// Attach failures within attachRetryGap of the last one counted count
// once: a burst of snapshots at a JVM's start leaves it to be retried;
// spaced ones refuse it at the attachTries-th.
func TestAttachFailuresSpaced(t *testing.T) {
	r, p := startingJVM(t, newFakeJVM())
	r.layouts[layoutKeyOf(&p.Mappings[0])] = layoutEntry{err: layoutErr("forged")}
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	for i := range 2 * attachTries {
		if _, _, err := r.Attach(p); err != nil {
			t.Fatalf("attach %d of a burst: %v, want a retry", i, err)
		}
	}
	for i := 1; i < attachTries-1; i++ {
		now = now.Add(attachRetryGap)
		if _, _, err := r.Attach(p); err != nil {
			t.Fatalf("spaced attach %d: %v, want a retry", i, err)
		}
	}
	now = now.Add(attachRetryGap - time.Millisecond)
	if _, _, err := r.Attach(p); err != nil {
		t.Fatalf("an attach within the gap: %v, want a retry", err)
	}
	now = now.Add(time.Millisecond)
	if _, _, err := r.Attach(p); !errors.Is(err, errLayout) {
		t.Fatalf("attach %d, spaced: %v, want the layout refused", attachTries, err)
	}
}
