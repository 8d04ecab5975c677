//go:build linux && (amd64 || arm64)

package sampler

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/profsym/profsym/bpf"
)

// failingMap makes chosen operations of a real map fail.
type failingMap struct {
	mapOps
	failLookup func(key any) bool
	failBatch  bool // the first batch call fails after reading what it read
	batches    int
}

var errInjected = errors.New("injected failure")

func (f *failingMap) Lookup(key, value any) error {
	if f.failLookup != nil && f.failLookup(key) {
		return errInjected
	}
	return f.mapOps.Lookup(key, value)
}

func (f *failingMap) BatchLookupAndDelete(cur *ebpf.MapBatchCursor, keys, vals any, opts *ebpf.BatchOptions) (int, error) {
	f.batches++
	if f.failBatch {
		return 0, errInjected
	}
	return f.mapOps.BatchLookupAndDelete(cur, keys, vals, opts)
}

// keysIn counts what a map still holds.
func keysIn[K any](t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var k K
	n := 0
	it := m.Iterate()
	var v []byte
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDrainKeepsWhatItCanRead injects stack lookup failures (and a failing
// batch read) into a real drain: the other rows are delivered, the failed
// ones counted, and every map of the drained buffer ends empty.
func TestDrainKeepsWhatItCanRead(t *testing.T) {
	bin := buildC(t)
	for _, tc := range []struct {
		name      string
		failBatch bool
	}{{"batch", false}, {"key-by-key", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSampler(t, Config{SampleRate: 499, KernelStacks: true})
			if _, err := s.Drain(); err != nil { // start the interval clean
				t.Fatal(err)
			}
			pid, _ := runFixture(t, bin, fixtureSeconds)
			var failed int
			var drained *drain
			s.drainHook = func(d *drain) {
				drained = d
				d.counts = &failingMap{mapOps: d.counts.(*ebpf.Map), failBatch: tc.failBatch}
				// Fail every other kernel stack: those rows are lost, the
				// rows of the others and of kernel-less samples stay.
				seen := map[uint32]bool{}
				d.stacks = &failingMap{mapOps: d.stacks.(*ebpf.Map), failLookup: func(key any) bool {
					id, ok := key.(uint32)
					if !ok || seen[id] {
						return false
					}
					seen[id] = true
					if len(seen)%2 == 0 {
						failed++
						return true
					}
					return false
				}}
			}
			old := s.active
			b, err := s.Drain()
			if err != nil {
				t.Fatalf("Drain failed as a whole: %v", err)
			}
			s.drainHook = nil
			if failed == 0 {
				t.Fatal("no lookup failure was injected")
			}
			if f := drained.counts.(*failingMap); f.batches == 0 {
				t.Fatal("the counts were not read in batches")
			}
			var fixture uint64
			for _, smp := range samplesOf(b, pid) {
				fixture += smp.Count
			}
			st, err := s.Stats()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d rows kept (%d samples of the fixture), %d stack lookups failed: lost %d samples, %d errors",
				len(b.Samples), fixture, failed, st.LostDrain, st.DrainErrors)
			if len(b.Samples) == 0 || fixture == 0 {
				t.Error("nothing was delivered")
			}
			if st.LostDrain == 0 || st.DrainErrors < uint64(failed) {
				t.Errorf("failures not counted: %+v", st)
			}
			if st.Lost < st.LostDrain {
				t.Errorf("Lost %d does not include LostDrain %d", st.Lost, st.LostDrain)
			}
			for name, n := range map[string]int{
				"counts":  keysIn[bpf.ProfileSampleKey](t, s.objs.counts(old)),
				"stacks":  keysIn[uint32](t, s.objs.stacks(old)),
				"ustacks": keysIn[uint64](t, s.objs.ustacks(old)),
			} {
				if n != 0 {
					t.Errorf("%s of the drained buffer still holds %d entries", name, n)
				}
			}
		})
	}
}

// TestNewFailsCleanly: a failure after the objects are loaded (here
// perf_event_open refusing the rate) returns the error, without a panic
// and without leaking file descriptors.
func TestNewFailsCleanly(t *testing.T) {
	if err := CheckPrerequisites(); err != nil {
		newSampler(t, Config{}) // skips or fails with the reason
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	s, err := New(Config{SampleRate: 1 << 30})
	if err == nil {
		s.Close()
		t.Fatal("New accepted a sample rate of 2^30 Hz")
	}
	t.Logf("New: %v", err)
	if s != nil {
		t.Error("New returned a sampler with its error")
	}
	if after := fds(); after > before {
		t.Errorf("%d file descriptors leaked", after-before)
	}
}
