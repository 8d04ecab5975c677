// Package dwarf answers address lookups from DWARF 2-5 debug info, the
// way llvm-symbolizer --inlines does: the chain of inlined frames for an
// address, with file, line, column and discriminator, declaration file and
// line, and start address of each frame.
//
// New reads only unit headers and builds a sorted unit address index (from
// .debug_aranges, and from unit DIEs for units aranges does not cover).
// A lookup binary-searches that index and parses only the unit it lands
// in, once: its line program and its subprogram / inlined_subroutine tree,
// both flattened into sorted arrays, so repeated lookups in a unit do a
// few binary searches and no allocation.
//
// The reader is purpose-built rather than debug/dwarf based: debug/dwarf
// allocates a map entry per attribute and an interface per value, and has
// no lazily-parsed per-unit lookup. Every offset and length read from the
// file is bounds-checked; malformed input yields errors wrapping
// frame.ErrCorruptFile.
package dwarf

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Table answers lookups for one ELF file's DWARF. It is safe for
// concurrent use. Slices it hands out alias nothing: names and paths are
// copied out of the file, so frames stay valid after the file is closed.
type Table struct {
	sec   sections
	units []*unit
	index []cuRange // disjoint, sorted by lo

	abbrevMu    sync.Mutex
	abbrevs     map[abbrevKey]*abbrevTable
	abbrevBytes int // .debug_abbrev bytes decoded into abbrevs

	parsed atomic.Int64 // bytes held by parsed units
}

type sections struct {
	info, abbrev, line, str, lineStr, strOffsets, addr, ranges, rnglists, aranges []byte
}

// New indexes f's DWARF. It returns an error wrapping frame.ErrNoDebugInfo
// if f has no .debug_info or no unit covers any code.
func New(f *elfx.File) (*Table, error) {
	var s sections
	var firstErr error
	get := func(name string, dst *[]byte) {
		d, err := f.SectionData(name)
		if err != nil {
			if !errors.Is(err, elfx.ErrNoSection) && firstErr == nil {
				firstErr = err
			}
			return
		}
		*dst = d
	}
	// Decompression dominates opening a compressed file, and .debug_info
	// and .debug_line are the big ones, so inflate those two in parallel.
	var wg sync.WaitGroup
	var lineErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		d, err := f.SectionData(".debug_line")
		if err != nil && !errors.Is(err, elfx.ErrNoSection) {
			lineErr = err
		}
		s.line = d
	}()
	get(".debug_info", &s.info)
	get(".debug_abbrev", &s.abbrev)
	get(".debug_str", &s.str)
	get(".debug_line_str", &s.lineStr)
	get(".debug_str_offsets", &s.strOffsets)
	get(".debug_addr", &s.addr)
	get(".debug_ranges", &s.ranges)
	get(".debug_rnglists", &s.rnglists)
	get(".debug_aranges", &s.aranges)
	wg.Wait()
	if firstErr == nil {
		firstErr = lineErr
	}
	if firstErr != nil {
		return nil, fmt.Errorf("dwarf: %s: %w", f.Path, firstErr)
	}
	t, err := newTable(s)
	if err != nil {
		return nil, fmt.Errorf("dwarf: %s: %w", f.Path, err)
	}
	return t, nil
}

// newTable indexes already-loaded sections.
func newTable(s sections) (t *Table, err error) {
	defer contain.Panic(func(r any) { t, err = nil, corruptf("indexing: %v", r) })
	if len(s.info) == 0 {
		return nil, fmt.Errorf("no .debug_info: %w", frame.ErrNoDebugInfo)
	}
	t = &Table{sec: s, abbrevs: map[abbrevKey]*abbrevTable{}}
	units, err := scanUnits(s.info)
	if err != nil && len(units) == 0 {
		return nil, err
	}
	// A broken header chain still leaves the units before it usable.
	t.units = units
	unitIdx := func(off uint64) int32 {
		i := t.unitIndex(off)
		if i < 0 || t.units[i].off != off {
			return -1
		}
		return int32(i)
	}
	var rs []cuRange
	covered := map[uint64]bool{}
	if len(s.aranges) > 0 {
		// A corrupt aranges section is not fatal: the unit DIEs still
		// describe every unit, so index those instead.
		if ar, seen, err := parseAranges(s.aranges, unitIdx); err == nil {
			rs, covered = ar, seen
		}
	}
	var scratch []addrRange
	for i, u := range t.units {
		if covered[u.off] {
			continue
		}
		h, err := t.headOf(u)
		if err != nil {
			continue // the unit is unusable; others may still answer
		}
		if h.tag != tagCompileUnit && h.tag != tagSkeletonUnit {
			continue
		}
		scratch, err = t.dieRanges(u, h, &h.top, scratch[:0])
		if err != nil {
			continue
		}
		for _, r := range scratch {
			rs = append(rs, cuRange{r.lo, r.hi, int32(i)})
		}
	}
	t.index = buildIndex(rs)
	if len(t.index) == 0 {
		return nil, fmt.Errorf("no DWARF unit covers code: %w", frame.ErrNoDebugInfo)
	}
	return t, nil
}

// unitFor returns the unit whose range holds pc.
func (t *Table) unitFor(pc uint64) *unit {
	ix := t.index
	lo, hi := 0, len(ix)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if ix[m].lo <= pc {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 || pc >= ix[lo-1].hi {
		return nil
	}
	return t.units[ix[lo-1].u]
}

// Lookup appends the frames for pc to dst, innermost first, and returns
// it. With inlines false only the outermost function frame is returned,
// located at pc by the line table. An address no unit covers returns dst
// unchanged and a nil error.
func (t *Table) Lookup(pc uint64, inlines bool, dst []frame.Frame) ([]frame.Frame, error) {
	u := t.unitFor(pc)
	if u == nil {
		return dst, nil
	}
	d, err := t.fullOf(u)
	if err != nil {
		return dst, err
	}
	return d.lookup(pc, inlines, dst), nil
}

// SizeBytes estimates the memory held by the index and the parsed units.
func (t *Table) SizeBytes() int64 {
	return int64(len(t.index))*24 + int64(len(t.units))*200 + t.parsed.Load()
}
