//go:build linux && (amd64 || arm64)

package unwind

import (
	"slices"
	"testing"

	"github.com/profsym/profsym/bpf"
)

// The copy program takes its frame-pointer callers without searching the
// process's mappings; a copy given up on ends them at the first caller in
// none of them, where the BPF walk without copies ends, once the process
// is known. Unknown, they are kept: BPF did not search either then.
func TestUnwalkedCutsAtUnmappedCaller(t *testing.T) {
	pr := &proc{ents: []bpf.ProfileUnwindMapping{{Start: 0x1000, End: 0x2000}, {Start: 0x5000, End: 0x6000}}}
	c := &StackCopy{Walked: []uint64{0x1100}, FPCallers: []uint64{0x5010, 0x1001, 0x3000, 0x5020}}
	if got := unwalked(c, pr, DefaultMaxStackWords); !slices.Equal(got.Words, []uint64{0x1100, 0x5010, 0x1001}) || got.Reason != stopNotReady {
		t.Errorf("known process: %#x, reason %d", got.Words, got.Reason)
	}
	// A return address just past a mapping's end is the call at its last
	// byte: looked up at pc-1, as the walker does.
	c.FPCallers = []uint64{0x2000, 0x1000}
	if got := unwalked(c, pr, DefaultMaxStackWords); !slices.Equal(got.Words, []uint64{0x1100, 0x2000}) {
		t.Errorf("pc-1 lookup: %#x", got.Words)
	}
	c.FPCallers = []uint64{0x5010, 0x3000, 0x5020}
	if got := unwalked(c, nil, DefaultMaxStackWords); !slices.Equal(got.Words, []uint64{0x1100, 0x5010, 0x3000, 0x5020}) {
		t.Errorf("unknown process: %#x", got.Words)
	}
}
