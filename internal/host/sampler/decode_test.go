package sampler

import (
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
