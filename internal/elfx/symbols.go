package elfx

import (
	"debug/elf"
	"fmt"

	"github.com/profsym/profsym/internal/frame"
)

// MaxSymbols bounds the entries of one symbol table that Symbols and
// DynamicSymbols decode. debug/elf builds an elf.Symbol (about 90 bytes
// plus its name) for each, so the table's size on disk, not its contents,
// decides the memory; real tables stay below 4 million entries
// (Chromium-sized programs).
const MaxSymbols = 8 << 20

// Symbols is debug/elf's .symtab reader, bounded: a table with more than
// MaxSymbols entries fails with frame.ErrLimitExceeded, and a compressed
// table or string table is charged against the file's decompression limit
// before debug/elf expands it.
func (f *File) Symbols() ([]elf.Symbol, error) {
	if err := f.checkSymbols(elf.SHT_SYMTAB); err != nil {
		return nil, err
	}
	return f.File.Symbols()
}

// DynamicSymbols is debug/elf's .dynsym reader, bounded like Symbols.
func (f *File) DynamicSymbols() ([]elf.Symbol, error) {
	if err := f.checkSymbols(elf.SHT_DYNSYM); err != nil {
		return nil, err
	}
	return f.File.DynamicSymbols()
}

func (f *File) checkSymbols(typ elf.SectionType) error {
	s := f.SectionByType(typ)
	if s == nil {
		return nil // debug/elf reports ErrNoSymbols
	}
	entsize := uint64(elf.Sym64Size)
	if f.Class == elf.ELFCLASS32 {
		entsize = elf.Sym32Size
	}
	if n := s.Size / entsize; n > MaxSymbols {
		return fmt.Errorf("%s %s: %d symbols, more than %d: %w", f.Path, s.Name, n, MaxSymbols, frame.ErrLimitExceeded)
	}
	sections := []*elf.Section{s}
	if int(s.Link) < len(f.Sections) {
		sections = append(sections, f.Sections[s.Link])
	}
	if typ == elf.SHT_DYNSYM {
		// DynamicSymbols also reads the symbol versions, each section
		// whole at the size its header claims.
		for _, vt := range []elf.SectionType{elf.SHT_GNU_VERSYM, elf.SHT_GNU_VERNEED, elf.SHT_GNU_VERDEF} {
			if vs := f.SectionByType(vt); vs != nil {
				sections = append(sections, vs)
			}
		}
	}
	// debug/elf reads exactly the size a compressed header claims, so
	// charging that size bounds what it allocates.
	f.budget.mu.Lock()
	defer f.budget.mu.Unlock()
	for _, cs := range sections {
		if cs.Flags&elf.SHF_COMPRESSED == 0 {
			continue
		}
		if err := f.budget.check(cs.Size); err != nil {
			return fmt.Errorf("%s %s: %w", f.Path, cs.Name, err)
		}
		f.budget.spent += int64(cs.Size)
	}
	return nil
}
