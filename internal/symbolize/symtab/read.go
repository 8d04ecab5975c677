package symtab

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// addSymtab reads .symtab in place: the entries' bytes and their names in
// the string table, with no elf.Symbol or string made per entry (debug/elf
// makes both, and a Go program's 50,000 symbols cost a cold open 25 ms).
// Entries are bounded as elfx.Symbols bounds them.
func (b *builder) addSymtab(f *elfx.File) error {
	s := f.SectionByType(elf.SHT_SYMTAB)
	if s == nil || s.Type == elf.SHT_NOBITS {
		return nil
	}
	is64 := f.Class == elf.ELFCLASS64
	entsize := uint64(elf.Sym32Size)
	if is64 {
		entsize = elf.Sym64Size
	}
	if n := s.Size / entsize; n > elfx.MaxSymbols {
		return fmt.Errorf("%s %s: %d symbols, more than %d: %w", f.Path, s.Name, n, elfx.MaxSymbols, frame.ErrLimitExceeded)
	}
	if int(s.Link) <= 0 || int(s.Link) >= len(f.Sections) {
		return fmt.Errorf("%s %s: string table %d: %w", f.Path, s.Name, s.Link, errCorrupt)
	}
	data, err := sectionOf(f, s)
	if err != nil {
		return tableErr(f, s.Name, err)
	}
	strs, err := sectionOf(f, f.Sections[s.Link])
	if err != nil {
		return tableErr(f, s.Name+" strings", err)
	}
	if uint64(len(data))%entsize != 0 {
		return fmt.Errorf("%s %s: %d bytes, not whole entries: %w", f.Path, s.Name, len(data), errCorrupt)
	}
	bo := f.ByteOrder
	pool := b.pool(strs)
	var file ref
	for i, off := 1, entsize; off+entsize <= uint64(len(data)); i, off = i+1, off+entsize {
		e := data[off : off+entsize]
		var nameOff uint32
		var info uint8
		var shndx elf.SectionIndex
		var value, size uint64
		if is64 {
			nameOff, info, shndx = bo.Uint32(e), e[4], elf.SectionIndex(bo.Uint16(e[6:]))
			value, size = bo.Uint64(e[8:]), bo.Uint64(e[16:])
		} else {
			nameOff, value, size = bo.Uint32(e), uint64(bo.Uint32(e[4:])), uint64(bo.Uint32(e[8:]))
			info, shndx = e[12], elf.SectionIndex(bo.Uint16(e[14:]))
		}
		name := cstr(strs, nameOff)
		typ := elf.ST_TYPE(info)
		if typ == elf.STT_FILE {
			file = ref{pool, nameOff, uint32(len(name))}
			continue
		}
		if len(name) == 0 || shndx == elf.SHN_UNDEF || shndx >= elf.SHN_LORESERVE {
			continue // imports, absolute values, commons
		}
		switch typ {
		case elf.STT_FUNC, elf.STT_GNU_IFUNC:
		case elf.STT_NOTYPE:
			// As addELF: untyped labels in executable sections, not
			// assembler-local or mapping symbols.
			if _, ok := b.textAt(value); !ok || bytes.HasPrefix(name, []byte(".L")) || name[0] == '$' {
				continue
			}
		default:
			continue
		}
		if i > 1<<31-1 {
			break // beyond MaxSymbols already
		}
		if at := bytes.IndexByte(name, '@'); at > 0 {
			name = name[:at] // the version, as bareName drops it
		}
		c := cand{addr: value, size: size, name: ref{pool, nameOff, uint32(len(name))}, prio: fromSymtab, seq: int32(i)}
		if elf.ST_BIND(info) == elf.STB_LOCAL {
			c.file = file
		}
		if err := b.add(c); err != nil {
			return err
		}
	}
	return nil
}

// sectionOf is s's contents, decompressed within the file's budget.
func sectionOf(f *elfx.File, s *elf.Section) ([]byte, error) {
	if s.Type == elf.SHT_NOBITS {
		return nil, nil
	}
	if got := f.Section(s.Name); got != s {
		// Two sections of one name (a forged table): read this one by
		// its own bounds, uncompressed only.
		if s.Flags&elf.SHF_COMPRESSED != 0 {
			return nil, fmt.Errorf("compressed section %q shadowed by another of its name: %w", s.Name, errCorrupt)
		}
		raw := f.Bytes()
		end := s.Offset + s.FileSize
		if end < s.Offset || end > uint64(len(raw)) {
			return nil, fmt.Errorf("section %q outside the file: %w", s.Name, errCorrupt)
		}
		return raw[s.Offset:end], nil
	}
	d, err := f.SectionData(s.Name)
	if errors.Is(err, elfx.ErrNoSection) {
		return nil, nil
	}
	return d, err
}

// cstr is the NUL-terminated name at off, or nil when off or the name
// runs past the table (a name llvm reads as empty too).
func cstr(strs []byte, off uint32) []byte {
	if uint64(off) >= uint64(len(strs)) {
		return nil
	}
	d := strs[off:]
	if i := bytes.IndexByte(d, 0); i >= 0 {
		return d[:i:i]
	}
	return nil
}
