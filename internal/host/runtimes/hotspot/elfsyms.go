package hotspot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"

	"github.com/profsym/profsym/internal/elfx"
)

// Bounds on the dynamic symbol table scanned for the tables' variables
// (libjvm's has about 1,000 entries).
const maxDynsyms = 1 << 18

// dynamicSymbols finds names in f's .dynsym without decoding the whole
// table: debug/elf's DynamicSymbols allocates per entry, and the file may
// be a hostile one named libjvm.so. It returns the symbols' ELF virtual
// addresses: every one of names, and those of optional that are there.
func dynamicSymbols(f *elfx.File, names, optional []string) (tableSyms, error) {
	var dynsym *elf.Section
	for _, s := range f.Sections {
		if s.Type == elf.SHT_DYNSYM {
			dynsym = s
			break
		}
	}
	if dynsym == nil || int(dynsym.Link) >= len(f.Sections) || dynsym.Link == 0 {
		return nil, layoutErr("%s: no dynamic symbol table", f.Path)
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		return nil, layoutErr("%s: not a little-endian 64-bit ELF file", f.Path)
	}
	strtab := f.Sections[dynsym.Link]
	data := f.Bytes()
	in := func(off, size uint64) bool { return off+size >= off && off+size <= uint64(len(data)) }
	if !in(dynsym.Offset, dynsym.Size) || !in(strtab.Offset, strtab.Size) || dynsym.Size/24 > maxDynsyms {
		return nil, layoutErr("%s: dynamic symbol table outside the file or too large", f.Path)
	}
	syms := data[dynsym.Offset : dynsym.Offset+dynsym.Size]
	strs := data[strtab.Offset : strtab.Offset+strtab.Size]
	want := map[string]bool{}
	for _, n := range append(names, optional...) {
		want[n] = true
	}
	out := tableSyms{}
	for off := 0; off+24 <= len(syms) && len(out) < len(want); off += 24 {
		e := syms[off : off+24]
		name := uint64(binary.LittleEndian.Uint32(e))
		if name >= uint64(len(strs)) || elf.SymType(e[4]&0xf) != elf.STT_OBJECT {
			continue
		}
		s := strs[name:]
		if i := bytes.IndexByte(s, 0); i >= 0 {
			s = s[:i]
		} else {
			continue
		}
		if !bytes.HasPrefix(s, []byte("gHotSpotVM")) || !want[string(s)] {
			continue
		}
		if shndx := binary.LittleEndian.Uint16(e[6:]); shndx == uint16(elf.SHN_UNDEF) {
			continue
		}
		out[string(s)] = binary.LittleEndian.Uint64(e[8:])
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, layoutErr("%s: no symbol %s", f.Path, n)
		}
	}
	return out, nil
}
