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
	sup   *Table      // the supplementary (dwz common) file's, or nil
	split SplitFinder // finds skeleton units' split units, or nil
	link  *splitLink  // set in a split unit's table
	units []*unit
	index []cuRange // disjoint, sorted by lo

	abbrevMu    sync.Mutex
	abbrevs     map[abbrevKey]*abbrevTable
	abbrevBytes int // .debug_abbrev bytes decoded into abbrevs

	parsed atomic.Int64 // bytes held by parsed units

	// limitErr says why units past the last one indexed are not: their
	// index did not fit the file's budget. Lookups no unit answers return it.
	limitErr error
}

type sections struct {
	info, abbrev, line, str, lineStr, strOffsets, addr, ranges, rnglists, aranges []byte
}

// Extra are the other files a file's DWARF points into.
type Extra struct {
	// Sup is the supplementary file's table (NewSup): the dwz common file
	// that .gnu_debugaltlink or .debug_sup names. Without it, what lives
	// there (names and declarations shared by several binaries) reads as
	// absent, as it does for llvm-symbolizer.
	Sup *Table
	// Split finds the split units of skeleton units (-gsplit-dwarf: .dwo
	// and .dwp files), when the unit is first parsed. Without it, or
	// without the file, a skeleton answers lines without functions, as
	// llvm-symbolizer does.
	Split SplitFinder
}

// New indexes f's DWARF. It returns an error wrapping frame.ErrNoDebugInfo
// if f has no .debug_info or no unit covers any code.
func New(f *elfx.File) (*Table, error) { return NewExtra(f, Extra{}) }

// NewExtra is New for DWARF that points into other files.
func NewExtra(f *elfx.File, x Extra) (*Table, error) {
	var t *Table
	_, err := decodeSections(f, func(s sections) (err error) {
		t, err = newTable(s, x, func(n int64) error { return f.Charge(n, "DWARF unit index") })
		return err
	}, func(line []byte) { t.sec.line = line })
	if err != nil {
		return nil, fmt.Errorf("dwarf: %s: %w", f.Path, err)
	}
	return t, nil
}

// NewSup reads a supplementary file (a dwz common file): partial units
// that the DWARF of other files refers to, with no code of their own.
func NewSup(f *elfx.File) (*Table, error) {
	s, err := decodeSections(f, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("dwarf: %s: %w", f.Path, err)
	}
	if len(s.info) == 0 {
		return nil, fmt.Errorf("dwarf: %s: no .debug_info: %w", f.Path, frame.ErrNoDebugInfo)
	}
	t := &Table{sec: s, abbrevs: map[abbrevKey]*abbrevTable{}}
	units, err := scanUnits(s.info, func(n int64) error { return f.Charge(n, "DWARF unit index") })
	if err != nil && len(units) == 0 {
		return nil, fmt.Errorf("dwarf: %s: %w", f.Path, err)
	}
	t.units = units
	t.limitErr = limited(err)
	return t, nil
}

// decodeSections decodes f's DWARF sections. Decompression dominates
// opening a compressed file: every section decodes on its own goroutine
// (elfx reserves each one's share of the file's budget), .debug_info, the
// largest, on the calling one, and build (if set) runs while .debug_line,
// which only unit parses need, is still decoding; setLine then gets it.
func decodeSections(f *elfx.File, build func(sections) error, setLine func([]byte)) (sections, error) {
	var s sections
	need := []struct {
		name string
		dst  *[]byte
	}{
		{".debug_info", &s.info}, {".debug_abbrev", &s.abbrev}, {".debug_str", &s.str},
		{".debug_line_str", &s.lineStr}, {".debug_str_offsets", &s.strOffsets}, {".debug_addr", &s.addr},
		{".debug_ranges", &s.ranges}, {".debug_rnglists", &s.rnglists}, {".debug_aranges", &s.aranges},
	}
	errs := make([]error, len(need))
	var wg sync.WaitGroup
	for i, n := range need[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			*n.dst, errs[i+1] = sectionData(f, n.name)
		}()
	}
	var line []byte
	var lineErr error
	lineDone := make(chan struct{})
	go func() {
		defer close(lineDone)
		line, lineErr = sectionData(f, ".debug_line")
	}()
	// A new goroutine would queue behind the others: .debug_info, the
	// critical path, decodes here.
	s.info, errs[0] = sectionData(f, ".debug_info")
	wg.Wait()
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	if err == nil && build != nil {
		err = build(s)
	}
	<-lineDone
	if err == nil && lineErr != nil {
		err = lineErr
	}
	if err != nil {
		return s, err
	}
	s.line = line
	if setLine != nil {
		setLine(line)
	}
	return s, nil
}

// sectionData is f's section name, or nil when f has none.
func sectionData(f *elfx.File, name string) ([]byte, error) {
	d, err := f.SectionData(name)
	if errors.Is(err, elfx.ErrNoSection) {
		return nil, nil
	}
	return d, err
}

// newTable indexes already-loaded sections.
func newTable(s sections, x Extra, charge func(int64) error) (t *Table, err error) {
	defer contain.Panic(func(r any) { t, err = nil, corruptf("indexing: %v", r) })
	if len(s.info) == 0 {
		return nil, fmt.Errorf("no .debug_info: %w", frame.ErrNoDebugInfo)
	}
	t = &Table{sec: s, sup: x.Sup, split: x.Split, abbrevs: map[abbrevKey]*abbrevTable{}}
	units, err := scanUnits(s.info, charge)
	if err != nil && len(units) == 0 {
		return nil, err
	}
	// A broken header chain, or a budget that ran out, still leaves the
	// units before it usable.
	t.units = units
	t.limitErr = limited(err)
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
	var head unitHead
	for i, u := range t.units {
		if covered[u.off] {
			continue
		}
		// Parsed, not kept: a unit's head is heap only once it is used.
		h := &head
		if err := t.parseHeadInto(u, h); err != nil {
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
		if t.limitErr != nil {
			return nil, t.limitErr
		}
		return nil, fmt.Errorf("no DWARF unit covers code: %w", frame.ErrNoDebugInfo)
	}
	return t, nil
}

// limited keeps err if it is a limit's: the units past it exist but were
// not indexed, which a lookup that finds no unit must say.
func limited(err error) error {
	if errors.Is(err, frame.ErrLimitExceeded) {
		return err
	}
	return nil
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
// unchanged and a nil error. missing says why the frames lack what the
// unit describes elsewhere (a skeleton unit whose split unit could not be
// read: lines without functions).
func (t *Table) Lookup(pc uint64, inlines bool, dst []frame.Frame) (_ []frame.Frame, missing, err error) {
	u := t.unitFor(pc)
	if u == nil {
		return dst, nil, t.limitErr
	}
	d, err := t.fullOf(u)
	if err != nil {
		return dst, nil, err
	}
	return d.lookup(pc, inlines, dst), d.missing, nil
}

// SizeBytes estimates the memory held by the index and the parsed units.
func (t *Table) SizeBytes() int64 {
	return int64(len(t.index))*24 + int64(len(t.units))*unitBytes + t.parsed.Load()
}
