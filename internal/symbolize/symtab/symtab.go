// Package symtab turns ELF symbol tables into an address-to-function-name
// source: .symtab, .dynsym, MiniDebugInfo (.gnu_debugdata) and synthesized
// "name@plt" entries, merged into one sorted, read-only table. It is the
// fallback when a binary has no DWARF, and matches what llvm-symbolizer
// reports from symbol tables.
package symtab

import (
	"bytes"
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/ulikunitz/xz"
)

// MaxMiniDebugInfo bounds the decompressed size of .gnu_debugdata. Real ones
// are a few MiB at most (Fedora's libc: ~200 KiB); the bound stops an xz bomb.
const MaxMiniDebugInfo = 128 << 20

// maxSymbols bounds how many symbols one file may contribute, so a forged
// table cannot make us allocate without limit. Chromium-sized binaries have
// a few million.
const maxSymbols = 20_000_000

var errCorrupt = fmt.Errorf("symbol table: %w", frame.ErrCorruptFile)

// Table is an immutable, sorted set of function ranges. Safe for concurrent
// use.
type Table struct {
	ents  []entry
	names string // every name, concatenated; entries point into it
}

type entry struct {
	start, end uint64
	off, n     uint32 // name = names[off:off+n]
	foff, fn   uint32 // source file of a local symbol (STT_FILE), names[foff:foff+fn]
}

// Len is the number of distinct function ranges.
func (t *Table) Len() int { return len(t.ents) }

// SizeBytes is the memory the table holds.
func (t *Table) SizeBytes() int64 {
	return int64(len(t.ents))*32 + int64(len(t.names)) + 64
}

// Lookup finds the function containing pc. The name is raw (mangled, without
// symbol version); size is the extent used for matching, which for symbols
// recorded with size 0 runs up to the next symbol. Like llvm-symbolizer, only
// the symbol starting closest below pc is considered: if pc lies past its
// end there is no answer, even inside an enclosing larger symbol.
// Lookup does not allocate.
func (t *Table) Lookup(pc uint64) (name string, start, size uint64, ok bool) {
	// Last entry with start <= pc.
	lo, hi := 0, len(t.ents)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if t.ents[m].start <= pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return "", 0, 0, false
	}
	e := &t.ents[lo-1]
	if pc >= e.end {
		return "", 0, 0, false
	}
	return t.names[e.off : e.off+e.n], e.start, e.end - e.start, true
}

// Find returns the address of the symbol called name (a linear scan: for
// the odd marker such as the kernel's _stext, not for hot paths).
func (t *Table) Find(name string) (uint64, bool) {
	for i := range t.ents {
		e := &t.ents[i]
		if t.names[e.off:e.off+e.n] == name {
			return e.start, true
		}
	}
	return 0, false
}

// FileAt returns the source file name recorded for the local symbol
// covering pc: the STT_FILE symbol that precedes it in .symtab. llvm-symbolizer
// reports it when DWARF does not name a file (crtstuff.c's helpers, say).
func (t *Table) FileAt(pc uint64) string {
	i := sort.Search(len(t.ents), func(i int) bool { return t.ents[i].start > pc })
	if i == 0 || pc >= t.ents[i-1].end {
		return ""
	}
	e := &t.ents[i-1]
	return t.names[e.foff : e.foff+e.fn]
}

// Symbol is one entry, for iteration and tests.
type Symbol struct {
	Name       string
	Start, End uint64
}

// All calls fn for each entry in address order until fn returns false.
func (t *Table) All(fn func(Symbol) bool) {
	for i := range t.ents {
		e := &t.ents[i]
		if !fn(Symbol{Name: t.names[e.off : e.off+e.n], Start: e.start, End: e.end}) {
			return
		}
	}
}

// Source priorities: when several symbols start at the same address with the
// same size, the lower value wins.
const (
	fromSymtab int32 = iota
	fromMiniDebugInfo
	fromDynsym
	fromPLT
)

// cand is a candidate entry. It holds no pointers: sorting hundreds of
// thousands of them then moves plain words (with a pointer each, the
// write barriers of the swaps were most of building a Go binary's table).
type cand struct {
	addr, size uint64
	// name and the STT_FILE in effect for a local symbol, as references
	// into the builder's byte pools.
	name, file ref
	prio       int32
	seq        int32 // index in its table
}

// ref is n bytes at off in the builder's pool p.
type ref struct{ p, off, n uint32 }

// New builds the table for f. Missing tables are not errors (a file with no
// symbols gives an empty table); malformed ones are, wrapping
// frame.ErrCorruptFile.
func New(f *elfx.File) (t *Table, err error) {
	// debug/elf's symbol readers are not guaranteed panic-free on hostile
	// input; a panic makes this file corrupt.
	defer contain.Panic(func(r any) { t, err = nil, fmt.Errorf("%s: %v: %w", f.Path, r, errCorrupt) })
	b := builder{text: execRanges(f)}
	if err := b.addSymtab(f); err != nil {
		return nil, err
	}
	dyn, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, tableErr(f, ".dynsym", err)
	}
	if err := b.addELF(dyn, fromDynsym); err != nil {
		return nil, err
	}
	if err := b.addMiniDebugInfo(f); err != nil {
		return nil, err
	}
	if err := b.addPLT(f, dyn); err != nil {
		return nil, err
	}
	return b.build(), nil
}

// tableErr keeps a limit's reason; any other failure of debug/elf's
// readers means a malformed table.
func tableErr(f *elfx.File, what string, err error) error {
	if errors.Is(err, frame.ErrLimitExceeded) {
		return fmt.Errorf("%s %s: %w", f.Path, what, err)
	}
	return fmt.Errorf("%s %s: %v: %w", f.Path, what, err, errCorrupt)
}

type span struct{ start, end uint64 }

type builder struct {
	text  []span // executable sections (or segments), sorted
	cands []cand
	// pools hold the names: pool 0 copies of names from Go strings, the
	// others string tables read in place (.symtab's).
	pools [][]byte
}

// ref returns a reference to s, copied into pool 0.
func (b *builder) refString(s string) ref {
	if len(b.pools) == 0 {
		b.pools = append(b.pools, nil)
	}
	r := ref{0, uint32(len(b.pools[0])), uint32(len(s))}
	b.pools[0] = append(b.pools[0], s...)
	return r
}

// pool adds a string table read in place and returns its number.
func (b *builder) pool(strs []byte) uint32 {
	if len(b.pools) == 0 {
		b.pools = append(b.pools, nil)
	}
	b.pools = append(b.pools, strs)
	return uint32(len(b.pools) - 1)
}

func (b *builder) bytes(r ref) []byte {
	if r.n == 0 {
		return nil
	}
	return b.pools[r.p][r.off : r.off+r.n]
}

// execRanges lists the executable address ranges: SHF_EXECINSTR sections,
// or PF_X segments when there are no section headers.
func execRanges(f *elfx.File) []span {
	var out []span
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Flags&elf.SHF_EXECINSTR != 0 && s.Size > 0 && s.Addr+s.Size > s.Addr {
			out = append(out, span{s.Addr, s.Addr + s.Size})
		}
	}
	if len(out) == 0 {
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Memsz > 0 && p.Vaddr+p.Memsz > p.Vaddr {
				out = append(out, span{p.Vaddr, p.Vaddr + p.Memsz})
			}
		}
	}
	slices.SortFunc(out, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	return out
}

// textAt returns the executable range holding addr.
func (b *builder) textAt(addr uint64) (span, bool) {
	i := sort.Search(len(b.text), func(i int) bool { return b.text[i].end > addr })
	if i < len(b.text) && b.text[i].start <= addr {
		return b.text[i], true
	}
	return span{}, false
}

func (b *builder) add(c cand) error {
	if len(b.cands) >= maxSymbols {
		return fmt.Errorf("more than %d symbols: %w", maxSymbols, errCorrupt)
	}
	b.cands = append(b.cands, c)
	return nil
}

func (b *builder) addELF(syms []elf.Symbol, prio int32) error {
	var file ref
	for i := range syms {
		s := &syms[i]
		if elf.ST_TYPE(s.Info) == elf.STT_FILE {
			file = b.refString(s.Name)
			continue
		}
		if s.Name == "" || s.Section == elf.SHN_UNDEF || s.Section >= elf.SHN_LORESERVE {
			continue // imports, absolute values, commons
		}
		switch elf.ST_TYPE(s.Info) {
		case elf.STT_FUNC, elf.STT_GNU_IFUNC:
		case elf.STT_NOTYPE:
			// Untyped labels from hand-written assembly name code too
			// (llvm-symbolizer uses them), but only inside executable
			// sections, and not assembler-local or mapping symbols.
			if _, ok := b.textAt(s.Value); !ok || strings.HasPrefix(s.Name, ".L") || s.Name[0] == '$' {
				continue
			}
		default:
			continue
		}
		c := cand{addr: s.Value, size: s.Size, name: b.refString(bareName(s.Name)), prio: prio, seq: int32(i)}
		if elf.ST_BIND(s.Info) == elf.STB_LOCAL {
			c.file = file
		}
		if err := b.add(c); err != nil {
			return err
		}
	}
	return nil
}

// bareName drops a symbol version from a name. A debug file's .symtab
// spells versioned definitions into the name (glibc's
// "__libc_start_main@GLIBC_2.2.5", "memcpy@@GLIBC_2.14") where the
// binary's .dynsym keeps the version aside, so without this a function
// would be named one way from the binary (on the host) and another from
// its debug file (a gateway's debug directory, debuginfod or the symbol
// store). No other ELF symbol name holds an '@'; "@plt" names are made
// after this.
func bareName(name string) string {
	if i := strings.IndexByte(name, '@'); i > 0 {
		return name[:i]
	}
	return name
}

// addMiniDebugInfo reads .gnu_debugdata: an xz-compressed ELF file whose
// .symtab keeps the local function symbols that strip removed (Fedora, RHEL
// and others ship binaries this way; gdb and llvm read it).
func (b *builder) addMiniDebugInfo(f *elfx.File) error {
	data, err := f.SectionData(".gnu_debugdata")
	if errors.Is(err, elfx.ErrNoSection) {
		return nil
	}
	if err != nil {
		return err
	}
	raw, err := unxz(f, data)
	if err != nil {
		return fmt.Errorf("%s .gnu_debugdata: %w", f.Path, err)
	}
	mini, err := f.Embedded(raw)
	if err != nil {
		return fmt.Errorf("%s .gnu_debugdata: %w", f.Path, err)
	}
	syms, err := mini.Symbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return tableErr(f, ".gnu_debugdata .symtab", err)
	}
	return b.addELF(syms, fromMiniDebugInfo)
}

// unxz decompresses the xz stream of .gnu_debugdata, refusing output larger
// than MaxMiniDebugInfo or than what is left of the file's decompression
// limit (frame.ErrLimitExceeded). The decoder's dictionary is capped by its
// config (8 MiB default), whatever the stream header claims, and the output
// buffer grows as bytes arrive.
func unxz(f *elfx.File, data []byte) ([]byte, error) {
	r, err := xz.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("xz: %v: %w", err, errCorrupt)
	}
	return f.Decompress(r, MaxMiniDebugInfo, "xz")
}

// build sorts, deduplicates and freezes the candidates.
func (b *builder) build() *Table {
	c := b.cands
	// At one address keep one symbol, chosen as llvm-symbolizer does: the
	// largest size (so a sized symbol beats a zero-size label), then, among
	// aliases of equal size, the one that comes last in its table (glibc's
	// "__freelocale" over "freelocale", "scalbn" over "ldexp"). Across
	// tables the more complete one wins: .symtab, MiniDebugInfo, .dynsym.
	slices.SortFunc(c, func(x, y cand) int {
		if x.addr != y.addr {
			return cmp.Compare(x.addr, y.addr)
		}
		if x.size != y.size {
			return cmp.Compare(y.size, x.size)
		}
		if x.prio != y.prio {
			return cmp.Compare(x.prio, y.prio)
		}
		if x.seq != y.seq {
			return cmp.Compare(y.seq, x.seq)
		}
		return bytes.Compare(b.bytes(x.name), b.bytes(y.name))
	})
	uniq := c[:0]
	for i := range c {
		if len(uniq) > 0 && uniq[len(uniq)-1].addr == c[i].addr {
			continue
		}
		uniq = append(uniq, c[i])
	}
	t := &Table{ents: make([]entry, 0, len(uniq))}
	var names strings.Builder
	size := 0
	for i := range uniq {
		size += int(uniq[i].name.n)
	}
	names.Grow(size)
	files := map[string]uint32{} // a file's name, once
	for i, s := range uniq {
		end := s.addr + s.size
		if s.size == 0 || end < s.addr {
			// Unsized: up to the next symbol, but not past the end of the
			// executable section holding it.
			end = ^uint64(0)
			if i+1 < len(uniq) {
				end = uniq[i+1].addr
			}
			if r, ok := b.textAt(s.addr); ok {
				end = min(end, r.end)
			} else if end == ^uint64(0) {
				end = s.addr + 1
			}
		}
		if end <= s.addr {
			continue
		}
		if uint64(names.Len())+uint64(s.name.n)+uint64(s.file.n) > 1<<32-1 {
			break // cannot happen under maxSymbols with real names
		}
		off := uint32(names.Len())
		names.Write(b.bytes(s.name))
		var foff, fn uint32
		if s.file.n > 0 {
			file := string(b.bytes(s.file))
			o, seen := files[file]
			if !seen {
				o = uint32(names.Len())
				names.WriteString(file)
				files[file] = o
			}
			foff, fn = o, uint32(len(file))
		}
		t.ents = append(t.ents, entry{start: s.addr, end: end, off: off, n: s.name.n, foff: foff, fn: fn})
	}
	t.names = names.String()
	return t
}

// Bounds calls fn with every address at which Lookup's or FileAt's answer
// may change: each entry's start and end.
func (t *Table) Bounds(fn func(uint64)) {
	for i := range t.ents {
		fn(t.ents[i].start)
		fn(t.ents[i].end)
	}
}
