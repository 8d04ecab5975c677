package addrmap

import "github.com/profsym/profsym/internal/elfx"

// FileOffsetToVaddr maps an offset in an ELF file to the virtual address the
// file's own tables use, through the PT_LOAD segment whose file bytes
// [Off, Off+Filesz) hold it: vaddr = off - seg.Off + seg.Vaddr.
//
// Each segment has its own bias (Vaddr - Off), so this is right for every
// layout seen in practice: non-zero first-segment addresses (non-PIE
// executables at 0x400000, prelinked libraries), GNU ld's -z separate-code
// and lld's layouts where the executable segment's Vaddr and Off differ by
// more than the page-aligned base, and ET_DYN at any load base (the base is
// already removed by going through the file offset). Offsets in no segment
// (section headers, debug sections, page-rounding slack) report false.
func FileOffsetToVaddr(segs []elfx.Segment, off uint64) (uint64, bool) {
	for _, s := range segs {
		if off >= s.Off && off-s.Off < s.Filesz {
			return off - s.Off + s.Vaddr, true
		}
	}
	return 0, false
}

// ProcessToVaddr maps a process address inside mapping m of an ELF file to
// the file's virtual address: the mapping fixes the file offset
// (addr - m.Start + m.Offset), and the segment table does the rest.
func ProcessToVaddr(m Mapping, segs []elfx.Segment, addr uint64) (uint64, bool) {
	if addr < m.Start || addr >= m.End {
		return 0, false
	}
	off := addr - m.Start + m.Offset
	if off < m.Offset { // wrapped: a forged mapping
		return 0, false
	}
	return FileOffsetToVaddr(segs, off)
}

// ReturnAddressAdjust turns the return address of a non-leaf frame into an
// address inside the call instruction, which is what should be symbolized:
// the return address itself may already belong to the next line, or to the
// next function when the call was the last instruction (noreturn callees).
// Leaf frames (the sampled PC, or a frame interrupted by a signal) must not
// be adjusted. llvm-symbolizer's callers and pprof subtract 1 the same way.
func ReturnAddressAdjust(pc uint64) uint64 {
	if pc == 0 {
		return 0
	}
	return pc - 1
}
