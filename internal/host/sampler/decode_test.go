package sampler

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/profsym/profsym/bpf"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// TestDecodeWalked: the words of a walked stack, as bpf/walk.h writes them
// (native PCs, exact PCs, two-word runtime frames), come out in call order.
func TestDecodeWalked(t *testing.T) {
	rt := func(kind uint8, ptr uint64) uint64 {
		return rtFrame | uint64(kind)<<bpf.ProfileStackWordBitsRT_KIND_SHIFT | ptr
	}
	var u bpf.ProfileUserStack
	words := []uint64{
		0x401000, // leaf
		rt(runtimes.FrameHotSpotFirst, 0x7f00_0000_1000), 1 << 63, // aux may use any bit
		0x402000 | pcExact, // after a signal frame
		rt(runtimes.FrameCPythonFirst+2, 0x7f00_0000_2000), 7,
		0x403000,
	}
	copy(u.Pcs[:], words)
	u.Len = uint32(len(words))
	u.Reason = uint32(StopRuntime)
	w := decodeWalked(&u)
	wantPCs := []uint64{0x401000, RuntimeMark | 0, 0x402000, RuntimeMark | 1, 0x403000}
	if !slices.Equal(w.pcs, wantPCs) {
		t.Errorf("pcs %#x, want %#x", w.pcs, wantPCs)
	}
	if !slices.Equal(w.exact, []uint8{2}) {
		t.Errorf("exact %v, want [2]", w.exact)
	}
	wantRT := []runtimes.Frame{
		{Kind: runtimes.FrameHotSpotFirst, Ptr: 0x7f00_0000_1000, Aux: 1 << 63},
		{Kind: runtimes.FrameCPythonFirst + 2, Ptr: 0x7f00_0000_2000, Aux: 7},
	}
	if !slices.Equal(w.runtime, wantRT) {
		t.Errorf("runtime %+v, want %+v", w.runtime, wantRT)
	}
	if w.stop != StopRuntime || w.stop.String() != "runtime" {
		t.Errorf("stop %v", w.stop)
	}
	// A runtime word with no second word (a cut stack) is not read past.
	u.Len = 2
	if w := decodeWalked(&u); len(w.runtime) != 0 || len(w.pcs) != 1 {
		t.Errorf("cut stack: %+v", w)
	}
}

// TestReadUserStack: a value of the ustacks maps is struct user_stack cut
// after the configured words (unwinding.max_stack_words); it reads back
// as the stack the walker wrote, and the words it cannot hold are zero.
// A stack of 256 words, the most the walker holds, keeps its exact marks
// (indexed by a byte).
func TestReadUserStack(t *testing.T) {
	for _, words := range []int{16, 128, 256} {
		b := make([]byte, 8+8*words)
		binary.NativeEndian.PutUint32(b, uint32(words))
		binary.NativeEndian.PutUint32(b[4:], uint32(StopDepth))
		for i := range words {
			w := uint64(0x400000 + i)
			if i == words-1 {
				w |= pcExact
			}
			binary.NativeEndian.PutUint64(b[8+8*i:], w)
		}
		u := bpf.ProfileUserStack{Len: 99}
		u.Pcs[len(u.Pcs)-1] = 1 // left from an earlier, longer value
		readUserStack(b, &u)
		if int(u.Len) != words || StopReason(u.Reason) != StopDepth {
			t.Errorf("%d words: len %d, reason %d", words, u.Len, u.Reason)
		}
		if words < len(u.Pcs) && u.Pcs[len(u.Pcs)-1] != 0 {
			t.Errorf("%d words: a word past the value kept %#x", words, u.Pcs[len(u.Pcs)-1])
		}
		w := decodeWalked(&u)
		if len(w.pcs) != words || w.pcs[words-1] != uint64(0x400000+words-1) || !slices.Equal(w.exact, []uint8{uint8(words - 1)}) {
			t.Errorf("%d words: %d pcs, last %#x, exact %v", words, len(w.pcs), w.pcs[len(w.pcs)-1], w.exact)
		}
	}
}
