//go:build linux && (amd64 || arm64)

package sampler

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// In ring-buffer mode a Drain takes every sample already written to the
// ring, however far behind the reader is: here the reader is held back
// while the fixture runs, and let go 300 ms into the Drain. Before, the
// Drain took what the reader had aggregated so far (CI under -race: 139
// of a fixture's 297 samples; here, at most one).
func TestRingDrainWaitsForReader(t *testing.T) {
	bin := buildC(t)
	var hold sync.Mutex
	hold.Lock()
	var held atomic.Bool
	held.Store(true)
	beforeSampleRead = func() { hold.Lock(); hold.Unlock() } //nolint:staticcheck // an empty critical section: waits for the test
	t.Cleanup(func() {
		if held.Swap(false) {
			hold.Unlock()
		}
		beforeSampleRead = nil
	})
	s := newSampler(t, Config{SampleRate: 99, Mode: ModeRingBuffer})
	pid, cpu := runFixture(t, bin, "1")
	time.AfterFunc(300*time.Millisecond, func() {
		if held.Swap(false) {
			hold.Unlock()
		}
	})
	b, err := s.Drain()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, smp := range samplesOf(b, pid) {
		n += smp.Count
	}
	checkSampleCount(t, n, cpu, 99)
}
