//go:build linux && (amd64 || arm64)

package unwind

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/profsym/profsym/bpf"
)

// Copies that wait on one table are walked once when they arrive and once
// when it loads, not again for every copy that arrives meanwhile: a cold
// agent's first process copies every sample while its tables build, and
// walking each waiting copy again per arrival (quadratic, with several
// rows-map lookups per frame) made the reader lag under qemu until the
// stack_copies ring overflowed (23 of 347 copies lost on 6.12, issue 31).
func TestWaitingCopiesWalkedOnce(t *testing.T) {
	f := &file{path: "/bin/fixture", slot: 1, state: statePending, wanted: true, queued: true}
	pr := &proc{
		ents:   []bpf.ProfileUnwindMapping{{Start: 0x1000, End: 0x2000, Table: 1}},
		bySlot: map[uint32]*file{1: f},
	}
	m := &Manager{log: zap.NewNop(), procs: map[int]*proc{7: pr}, dead: map[int]*proc{}}
	const n = 300
	for range n {
		m.AddCopy(&StackCopy{Pid: 7, PC: 0x1100, SP: 0x7000, PCExact: true, Walked: []uint64{0x1100}, Stack: make([]byte, 64)})
	}
	if m.copyWalks != n || len(m.copies) != n {
		t.Fatalf("%d copies added: %d walks, %d waiting; want one walk each, all waiting", n, m.copyWalks, len(m.copies))
	}
	if w := m.TakeWalked(); len(w) != 0 || m.copyWalks != n {
		t.Fatalf("table still pending: %d walked, %d walks in all", len(w), m.copyWalks)
	}
	// The build failed: every copy is walked once more and ends there.
	f.state = stateNone
	m.tryCopies(-1, time.Time{})
	w := m.TakeWalked()
	if m.copyWalks != 2*n || len(w) != n || len(m.copies) != 0 {
		t.Fatalf("after the table's state changed: %d walks, %d walked, %d waiting", m.copyWalks, len(w), len(m.copies))
	}
	for _, c := range w {
		if c.Reason != stopNoTable {
			t.Fatalf("reason %d, want no_table (%d)", c.Reason, stopNoTable)
		}
	}
	// A copy waiting for its PC's mapping is walked again once the
	// process's image changes (Track), not before.
	m.AddCopy(&StackCopy{Pid: 7, PC: 0x3100, SP: 0x7000, PCExact: true, Walked: []uint64{0x3100}, Stack: make([]byte, 64)})
	m.tryCopies(7, time.Time{})
	if m.copyWalks != 2*n+1 || len(m.copies) != 1 {
		t.Fatalf("waiting for maps: %d walks, %d waiting", m.copyWalks-2*n, len(m.copies))
	}
}
