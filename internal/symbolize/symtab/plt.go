package symtab

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
)

// maxRelocs bounds the relocations read for PLT naming.
const maxRelocs = 4_000_000

// addPLT names PLT stubs "sym@plt", as objdump and llvm-objdump label them.
// Rather than assuming a layout (lazy .plt after a header; IBT's .plt.sec
// with the lazy half in .plt; .plt.got for functions whose address is also
// taken), each stub's indirect jump is decoded to the GOT slot it loads, and
// the slot is named by the relocation that fills it: JUMP_SLOT in
// .rela.plt/.rel.plt, GLOB_DAT in .rela.dyn/.rel.dyn. Stubs whose slot has no
// symbol (IRELATIVE) stay unnamed. x86-64 and i386 only.
func (b *builder) addPLT(f *elfx.File, dyn []elf.Symbol) error {
	if f.Machine != elf.EM_X86_64 && f.Machine != elf.EM_386 {
		return nil
	}
	slots := map[uint64]string{}
	for _, name := range []string{".rela.plt", ".rel.plt", ".rela.dyn", ".rel.dyn"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		data, err := f.SectionData(name)
		if err != nil {
			if errors.Is(err, elfx.ErrNoSection) {
				continue
			}
			return err
		}
		if err := relocSlots(data, f.Class, f.ByteOrder, f.Machine, s.Type == elf.SHT_RELA, dyn, slots); err != nil {
			return fmt.Errorf("%s %s: %w", f.Path, name, err)
		}
	}
	if len(slots) == 0 {
		return nil
	}
	var gotPLT uint64 // i386 PIC stubs address the GOT relative to %ebx
	if s := f.Section(".got.plt"); s != nil {
		gotPLT = s.Addr
	} else if s := f.Section(".got"); s != nil {
		gotPLT = s.Addr
	}
	// f.Section returns the first section of a name: a forged file with
	// thousands of ".plt" sections over the same bytes gets no more work.
	for _, name := range []string{".plt", ".plt.sec", ".plt.got"} {
		s := f.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_EXECINSTR == 0 {
			continue
		}
		code, err := f.SectionData(s.Name)
		if err != nil {
			return err
		}
		stride := s.Entsize
		if stride != 8 && stride != 16 {
			stride = 16
		}
		for off := uint64(0); off+stride <= uint64(len(code)); off += stride {
			slot, ok := stubTarget(code[off:off+stride], s.Addr+off, f.Machine, gotPLT)
			if !ok {
				continue
			}
			name, ok := slots[slot]
			if !ok {
				continue
			}
			if err := b.add(cand{addr: s.Addr + off, size: stride, name: b.refString(name + "@plt"), prio: fromPLT}); err != nil {
				return err
			}
		}
	}
	return nil
}

// stubTarget finds the first indirect jump through memory in one stub and
// returns the address it loads from. Patterns (optionally after endbr and a
// bnd prefix, so the opcode is searched within the stub):
//
//	x86-64: ff 25 disp32   jmp *disp32(%rip)
//	i386:   ff 25 abs32    jmp *abs32
//	i386:   ff a3 disp32   jmp *disp32(%ebx), %ebx = GOT
func stubTarget(stub []byte, addr uint64, m elf.Machine, got uint64) (uint64, bool) {
	for i := 0; i+6 <= len(stub); i++ {
		if stub[i] != 0xff {
			continue
		}
		v := binary.LittleEndian.Uint32(stub[i+2:])
		switch {
		case stub[i+1] == 0x25 && m == elf.EM_X86_64:
			// RIP-relative: from the end of the 6-byte instruction.
			return addr + uint64(i) + 6 + uint64(int64(int32(v))), true
		case stub[i+1] == 0x25 && m == elf.EM_386:
			return uint64(v), true
		case stub[i+1] == 0xa3 && m == elf.EM_386 && got != 0:
			return uint64(uint32(got + uint64(int64(int32(v))))), true
		}
	}
	return 0, false
}

// relocSlots records, for each relocation of a PLT-filling type, the slot
// address and the symbol name. dyn is debug/elf's dynamic symbol list, which
// omits the null symbol 0.
func relocSlots(data []byte, class elf.Class, bo binary.ByteOrder, m elf.Machine, rela bool, dyn []elf.Symbol, out map[uint64]string) error {
	var size int
	switch {
	case class == elf.ELFCLASS64 && rela:
		size = 24
	case class == elf.ELFCLASS64:
		size = 16
	case rela:
		size = 12
	default:
		size = 8
	}
	if len(data)%size != 0 {
		return fmt.Errorf("relocation section of %d bytes is not a multiple of %d: %w", len(data), size, errCorrupt)
	}
	if len(data)/size > maxRelocs {
		return fmt.Errorf("%d relocations: %w", len(data)/size, errCorrupt)
	}
	for off := 0; off+size <= len(data); off += size {
		var slot uint64
		var sym, typ uint32
		if class == elf.ELFCLASS64 {
			slot = bo.Uint64(data[off:])
			info := bo.Uint64(data[off+8:])
			sym, typ = uint32(info>>32), uint32(info)
		} else {
			slot = uint64(bo.Uint32(data[off:]))
			info := bo.Uint32(data[off+4:])
			sym, typ = info>>8, info&0xff
		}
		if !pltReloc(m, typ) || sym == 0 {
			continue
		}
		if int(sym) > len(dyn) {
			return fmt.Errorf("relocation names symbol %d of %d: %w", sym, len(dyn), errCorrupt)
		}
		if name := dyn[sym-1].Name; name != "" {
			out[slot] = name
		}
	}
	return nil
}

func pltReloc(m elf.Machine, typ uint32) bool {
	switch m {
	case elf.EM_X86_64:
		return typ == uint32(elf.R_X86_64_JMP_SLOT) || typ == uint32(elf.R_X86_64_GLOB_DAT)
	case elf.EM_386:
		return typ == uint32(elf.R_386_JMP_SLOT) || typ == uint32(elf.R_386_GLOB_DAT)
	}
	return false
}
