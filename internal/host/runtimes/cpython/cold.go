package cpython

import (
	"debug/elf"
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/profsym/profsym/internal/elfx"
)

// maxEvalBytes bounds the eval loop decoded to find its split-off part
// (3.9-3.14 release builds: 1-60 KiB for the part the symbol covers).
const maxEvalBytes = 1 << 20

// coldRange finds the code GCC split off the eval loop (the
// _PyEval_EvalFrameDefault.cold part of LTO/PGO builds, which can hold
// most of the loop: 84 of 85 KiB in Debian's 3.14) when the symbol table
// that names it was stripped: the eval function jumps into it, and its own
// FDE in .eh_frame bounds it. It returns the FDE that most of the jumps
// out of [lo, hi) land in, as ELF addresses [start, end); ok is false when
// the function jumps nowhere outside itself.
func coldRange(f *elfx.File, lo, hi uint64) (start, end uint64, ok bool, err error) {
	if hi <= lo || hi-lo > maxEvalBytes {
		return 0, 0, false, fmt.Errorf("eval loop of %d bytes", hi-lo)
	}
	code, err := f.ReadVaddr(lo, int(hi-lo))
	if err != nil {
		return 0, 0, false, err
	}
	var targets []uint64
	switch f.Machine {
	case elf.EM_X86_64:
		targets = externalJumps(code, lo, hi)
	case elf.EM_AARCH64:
		targets = externalBranchesARM64(code, lo, hi)
	}
	if len(targets) == 0 {
		return 0, 0, false, nil
	}
	fdes, err := f.FDEs()
	if err != nil {
		return 0, 0, false, err
	}
	votes := map[[2]uint64]int{}
	for _, t := range targets {
		fs, fe, ok := fdes.Covering(t)
		if ok && (fe <= lo || fs >= hi) {
			votes[[2]uint64{fs, fe}]++
		}
	}
	best := 0
	for r, n := range votes {
		if n > best || n == best && r[0] < start {
			start, end, best = r[0], r[1], n
		}
	}
	return start, end, best > 0, nil
}

// externalJumps decodes code (at address lo) and returns the targets of
// its direct jumps (not calls) that leave [lo, hi). Bytes that do not
// decode are stepped over one at a time.
func externalJumps(code []byte, lo, hi uint64) []uint64 {
	var out []uint64
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil || inst.Len == 0 {
			off++
			continue
		}
		pc := lo + uint64(off) + uint64(inst.Len)
		off += inst.Len
		if inst.Op < x86asm.JA || inst.Op > x86asm.JS { // JA ... JMP ... JS: the jumps
			continue
		}
		rel, ok := inst.Args[0].(x86asm.Rel)
		if !ok {
			continue
		}
		t := pc + uint64(int64(rel))
		if t < lo || t >= hi {
			out = append(out, t)
		}
	}
	return out
}

// externalBranchesARM64 is externalJumps for arm64 code: the targets of
// B, B.cond, CBZ/CBNZ and TBZ/TBNZ (not BL) that leave [lo, hi).
// Instructions are 4 bytes, their offsets relative to their own address.
func externalBranchesARM64(code []byte, lo, hi uint64) []uint64 {
	var out []uint64
	for off := 0; off+4 <= len(code); off += 4 {
		in := binary.LittleEndian.Uint32(code[off:])
		var rel int64
		switch {
		case in&0xfc000000 == 0x14000000: // B imm26
			rel = int64(int32(in<<6)>>6) * 4
		case in&0xff000010 == 0x54000000, in&0x7e000000 == 0x34000000: // B.cond, CBZ/CBNZ: imm19
			rel = int64(int32(in<<8)>>13) * 4
		case in&0x7e000000 == 0x36000000: // TBZ/TBNZ imm14
			rel = int64(int32(in<<13)>>18) * 4
		default:
			continue
		}
		if t := lo + uint64(off) + uint64(rel); t < lo || t >= hi {
			out = append(out, t)
		}
	}
	return out
}
