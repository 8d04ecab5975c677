package php

import (
	"errors"
	"fmt"
	"sort"

	"golang.org/x/arch/x86/x86asm"

	"github.com/profsym/profsym/internal/elfx"
)

// maxVMBytes bounds the VM loop decoded to find its split-off part
// (37-41 KiB in Debian's 8.2 and 8.4).
const maxVMBytes = 1 << 20

// coldPart finds the code GCC split off execute_ex (execute_ex.cold: its
// error paths), which Debian's stripped binaries do not name: execute_ex
// jumps into it, and .eh_frame_hdr's table says where the function each
// jump lands in starts; it ends where the next one starts. It returns the
// part most of the jumps out of [lo, hi) land in, as ELF addresses.
func coldPart(f *elfx.File, lo, hi uint64) (start, end uint64, err error) {
	if hi <= lo || hi-lo > maxVMBytes {
		return 0, 0, fmt.Errorf("VM loop of %d bytes", hi-lo)
	}
	code, err := f.ReadVaddr(lo, int(hi-lo))
	if err != nil {
		return 0, 0, err
	}
	fdes, err := f.FDEs()
	if err != nil {
		return 0, 0, err
	}
	starts := fdes.Starts()
	votes := map[int]int{}
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil || inst.Len == 0 {
			off++
			continue
		}
		off += inst.Len
		if inst.Op < x86asm.JA || inst.Op > x86asm.JS { // the jumps, not calls
			continue
		}
		rel, ok := inst.Args[0].(x86asm.Rel)
		if !ok {
			continue
		}
		t := lo + uint64(off) + uint64(int64(rel))
		if t >= lo && t < hi {
			continue
		}
		// The last function start at or before t.
		i := sort.Search(len(starts), func(i int) bool { return starts[i] > t }) - 1
		if i >= 0 && i+1 < len(starts) && (starts[i+1] <= lo || starts[i] >= hi) {
			votes[i]++
		}
	}
	best := -1
	for i, n := range votes {
		if best < 0 || n > votes[best] || n == votes[best] && i < best {
			best = i
		}
	}
	if best < 0 {
		return 0, 0, errors.New("no jump out of execute_ex")
	}
	return starts[best], starts[best+1], nil
}
