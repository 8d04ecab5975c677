package php

import (
	"encoding/binary"
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
	hdr, err := f.SectionData(".eh_frame_hdr")
	if err != nil {
		return 0, 0, fmt.Errorf(".eh_frame_hdr: %w", err)
	}
	starts, err := fdeStarts(hdr, f.Section(".eh_frame_hdr").Addr)
	if err != nil {
		return 0, 0, err
	}
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

// fdeStarts reads the sorted function starts of .eh_frame_hdr's search
// table at address addr (datarel sdata4 entries, what linkers write).
func fdeStarts(b []byte, addr uint64) ([]uint64, error) {
	const (
		udata4        = 0x03
		pcrelSdata4   = 0x1b
		datarelSdata4 = 0x3b
	)
	if len(b) < 12 || b[0] != 1 || b[1] != pcrelSdata4 || b[2] != udata4 || b[3] != datarelSdata4 {
		return nil, errors.New(".eh_frame_hdr without the usual search table")
	}
	count := uint64(binary.LittleEndian.Uint32(b[8:]))
	r := b[12:]
	if count > uint64(len(r)/8) {
		return nil, fmt.Errorf(".eh_frame_hdr: %d entries in %d bytes", count, len(r))
	}
	out := make([]uint64, count)
	for i := range out {
		out[i] = addr + uint64(int64(int32(binary.LittleEndian.Uint32(r[8*i:]))))
	}
	if !sort.SliceIsSorted(out, func(i, j int) bool { return out[i] < out[j] }) {
		return nil, errors.New(".eh_frame_hdr table not sorted")
	}
	return out, nil
}
