package ruby

import (
	"encoding/binary"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
)

// Finding vm_exec_core in a build that exports neither it nor rb_vm_exec
// (Debian's 3.3 hides every internal symbol): Ruby's VM is direct-threaded
// (GCC's labels as values), and vm_exec_core keeps the address of every
// instruction's code in a static table, insns_address_table. In a shared
// library that table is R_X86_64_RELATIVE relocations, one an instruction
// (over 200 of them), whose targets all lie in one function: the FDE that
// holds far more relocated addresses than any other is vm_exec_core.

const (
	rX8664RELATIVE = 8
	minInsns       = 150     // YARV has 200+ instructions (trace_ ones included) in every 3.x
	maxVMLoop      = 4 << 20 // bytes vm_exec_core is believed to span at most
)

// vmLoopFromTable finds vm_exec_core's [start, end) from relocs (.rela.dyn)
// and the FDEs of f.
func vmLoopFromTable(f *elfx.File, relocs []byte) (start, end uint64, err error) {
	type rel struct{ off, target uint64 }
	var rs []rel
	for i := 0; i+24 <= len(relocs); i += 24 {
		if uint32(binary.LittleEndian.Uint64(relocs[i+8:])) != rX8664RELATIVE {
			continue
		}
		rs = append(rs, rel{binary.LittleEndian.Uint64(relocs[i:]), binary.LittleEndian.Uint64(relocs[i+16:])})
	}
	fdes, err := f.FDEs()
	if err != nil {
		return 0, 0, err
	}
	votes := map[[2]uint64]int{}
	for _, r := range rs {
		if fs, fe, ok := fdes.Covering(r.target); ok && fe-fs <= maxVMLoop {
			votes[[2]uint64{fs, fe}]++
		}
	}
	best, second := 0, 0
	for r, n := range votes {
		switch {
		case n > best:
			second = best
			start, end, best = r[0], r[1], n
		case n > second:
			second = n
		}
	}
	// Every instruction's code is in the one function; no other has
	// nearly as many addresses taken (Onigmo's match_at, also threaded,
	// has under a hundred).
	if best < minInsns || second*2 > best {
		return 0, 0, fmt.Errorf("no instruction address table (%d and %d addresses in one function): %w", best, second, errUnsupported)
	}
	return start, end, nil
}
