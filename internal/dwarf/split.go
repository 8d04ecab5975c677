package dwarf

import (
	"fmt"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Split DWARF (gcc and clang -gsplit-dwarf): a binary keeps skeleton units
// (address ranges, the line table, DW_AT_dwo_name, DW_AT_comp_dir and a dwo
// id) and the rest of each unit, its functions and inlined calls, goes to
// a .dwo file, or, packaged, to a .dwp file indexed by dwo id
// (.debug_cu_index). A skeleton's split unit is read here from the
// sections the caller finds for it; addresses and (DWARF 4) range lists
// stay in the binary, relative to the skeleton's bases.

// Skeleton is what a skeleton unit says of its split unit. DWOName and
// CompDir are untrusted: finding the file is the caller's job
// (internal/locate), which must keep the paths it builds contained.
type Skeleton struct {
	DWOName, CompDir string
	ID               uint64
}

// SplitSections are one split unit's sections: a .dwo file's, or the
// unit's contributions to a .dwp file (and its shared .debug_str.dwo).
type SplitSections struct {
	Info, Abbrev, Line, Str, StrOffsets, Rnglists []byte
}

// SplitFinder returns the sections of a skeleton's split unit, or why
// there are none (the skeleton then answers lines without functions, as
// llvm-symbolizer does without the file). release, if set, is called once
// the unit has been read: nothing parsed keeps the sections.
type SplitFinder func(Skeleton) (ss SplitSections, release func(), err error)

// splitLink is what a split table takes from its skeleton.
type splitLink struct {
	addrBase, rangesBase, base uint64
	compDir                    string
	// The skeleton, whose line table names the files of a split unit
	// without one of its own (clang writes no .debug_line.dwo).
	skelT *Table
	skelU *unit
}

// fill completes a split unit's head with its skeleton's bases; its line
// table (file names only, for declarations) is at the start of its
// .debug_line.dwo when there is one.
func (l *splitLink) fill(u *unit, h *unitHead, hasLine bool) {
	if h.addrBase == 0 {
		h.addrBase = l.addrBase
	}
	if !h.top.hasLow {
		h.base = l.base
	}
	h.rangesBase = l.rangesBase
	if h.compDir == "" {
		h.compDir = l.compDir
	}
	if !h.hasStmt && hasLine {
		h.stmtList, h.hasStmt = 0, true
	}
}

// splitUnit finds the split unit of skeleton u; release (non-nil) gives
// its sections back once the unit has been read.
func (t *Table) splitUnit(u *unit, h *unitHead) (st *Table, su *unit, sh *unitHead, release func(), err error) {
	release = func() {}
	sk := Skeleton{DWOName: h.dwoName, CompDir: h.compDir, ID: h.dwoID}
	if t.split == nil {
		return nil, nil, nil, release, fmt.Errorf("split unit %.200q: %w", sk.DWOName, frame.ErrNotFound)
	}
	ss, rel, err := t.split(sk)
	if rel != nil {
		release = rel
	}
	if err != nil {
		return nil, nil, nil, release, err
	}
	st = &Table{
		sec: sections{info: ss.Info, abbrev: ss.Abbrev, line: ss.Line, str: ss.Str, strOffsets: ss.StrOffsets,
			rnglists: ss.Rnglists, addr: t.sec.addr, ranges: t.sec.ranges},
		abbrevs: map[abbrevKey]*abbrevTable{},
		link: &splitLink{addrBase: h.addrBase, rangesBase: h.gnuRangesBase, base: h.base, compDir: h.compDir,
			skelT: t, skelU: u},
	}
	units, err := scanUnits(ss.Info, nil)
	if len(units) == 0 {
		if err == nil {
			err = fmt.Errorf("split unit %.200q: no unit: %w", sk.DWOName, frame.ErrNoDebugInfo)
		}
		return nil, nil, nil, release, err
	}
	st.units = units
	for _, su := range units {
		sh, err := st.headOf(su)
		if err != nil {
			continue
		}
		if id := su.dwoID; su.unitType == utSplitCompile && id == sk.ID || su.shape.version < 5 && sh.dwoID == sk.ID {
			return st, su, sh, release, nil
		}
	}
	return nil, nil, nil, release, fmt.Errorf("split unit %.200q: no unit with dwo id %#x: %w", sk.DWOName, sk.ID, frame.ErrBuildIDMismatch)
}

// DWOSections reads a .dwo file's sections.
func DWOSections(f *elfx.File) (SplitSections, error) {
	var ss SplitSections
	for _, s := range []struct {
		name string
		dst  *[]byte
	}{
		{".debug_info.dwo", &ss.Info}, {".debug_abbrev.dwo", &ss.Abbrev}, {".debug_line.dwo", &ss.Line},
		{".debug_str.dwo", &ss.Str}, {".debug_str_offsets.dwo", &ss.StrOffsets}, {".debug_rnglists.dwo", &ss.Rnglists},
	} {
		d, err := sectionData(f, s.name)
		if err != nil {
			return ss, fmt.Errorf("%s: %w", f.Path, err)
		}
		*s.dst = d
	}
	if len(ss.Info) == 0 {
		return ss, fmt.Errorf("%s: no .debug_info.dwo: %w", f.Path, frame.ErrNoDebugInfo)
	}
	return ss, nil
}

// DWP is a .dwp package: split units of many skeletons, found by dwo id
// through its .debug_cu_index (DWARF 5, or GNU's pre-standard version 2).
type DWP struct {
	all   SplitSections // the package's whole sections
	index cuIndex
}

// OpenDWP reads f's sections and its unit index.
func OpenDWP(f *elfx.File) (*DWP, error) {
	all, err := DWOSections(f)
	if err != nil {
		return nil, err
	}
	idx, err := sectionData(f, ".debug_cu_index")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	ix, err := parseCUIndex(idx)
	if err != nil {
		return nil, fmt.Errorf("%s: .debug_cu_index: %w", f.Path, err)
	}
	return &DWP{all: all, index: ix}, nil
}

// Sections returns the contributions of the unit with dwo id id.
func (d *DWP) Sections(id uint64) (SplitSections, error) {
	row, ok := d.index.find(id)
	if !ok {
		return SplitSections{}, fmt.Errorf("no unit with dwo id %#x in the package: %w", id, frame.ErrNotFound)
	}
	ss := SplitSections{Str: d.all.Str}
	for i, kind := range d.index.kinds {
		off, size := d.index.contribution(row, i)
		var dst *[]byte
		var from []byte
		switch {
		case kind == sectInfo:
			dst, from = &ss.Info, d.all.Info
		case kind == sectAbbrev:
			dst, from = &ss.Abbrev, d.all.Abbrev
		case kind == sectLine:
			dst, from = &ss.Line, d.all.Line
		case kind == sectStrOffsets:
			dst, from = &ss.StrOffsets, d.all.StrOffsets
		case kind == sectRnglists && d.index.version == 5:
			dst, from = &ss.Rnglists, d.all.Rnglists
		default:
			continue
		}
		if uint64(off)+uint64(size) > uint64(len(from)) {
			return SplitSections{}, corruptf("dwo id %#x: contribution [%#x,+%#x) runs past its section", id, off, size)
		}
		*dst = from[off : off+size : off+size]
	}
	if len(ss.Info) == 0 {
		return SplitSections{}, corruptf("dwo id %#x: no .debug_info.dwo contribution", id)
	}
	return ss, nil
}

// Section kinds of a unit index (DW_SECT_*): the same numbers in both
// versions for what is read here.
const (
	sectInfo       = 1
	sectAbbrev     = 3
	sectLine       = 4
	sectStrOffsets = 6
	sectRnglists   = 8
)

// Bounds of a unit index: real packages have at most a few hundred
// thousand units, and eight section kinds.
const (
	maxIndexSlots    = 1 << 24
	maxIndexSections = 16
)

// cuIndex is a parsed .debug_cu_index: a hash table from dwo id to row,
// and per row an offset and a size for each section kind.
type cuIndex struct {
	version              uint32
	kinds                []uint32
	sigs                 []byte // slots x u64
	rows                 []byte // slots x u32 (1-based row, 0 empty)
	offs, sizes          []byte // units x kinds x u32
	slots, units, nkinds uint32
}

func parseCUIndex(d []byte) (cuIndex, error) {
	var ix cuIndex
	b := buf{data: d}
	ix.version = uint32(b.u16())
	if ix.version == 5 {
		b.u16() // padding
	} else {
		b.off = 0
		ix.version = b.u32()
	}
	ix.nkinds, ix.units, ix.slots = b.u32(), b.u32(), b.u32()
	if b.err != nil || ix.version != 2 && ix.version != 5 {
		return ix, corruptf("version %d or truncated header", ix.version)
	}
	if ix.slots == 0 || ix.slots > maxIndexSlots || ix.slots&(ix.slots-1) != 0 || ix.units > ix.slots ||
		ix.nkinds == 0 || ix.nkinds > maxIndexSections {
		return ix, corruptf("%d slots, %d units, %d section kinds", ix.slots, ix.units, ix.nkinds)
	}
	need := uint64(ix.slots)*12 + uint64(ix.nkinds)*4 + 2*uint64(ix.units)*uint64(ix.nkinds)*4
	if need > uint64(b.left()) {
		return ix, corruptf("tables of %d bytes run past the section's %d", need, b.left())
	}
	take := func(n uint64) []byte {
		s := d[b.off : b.off+int(n)]
		b.off += int(n)
		return s
	}
	ix.sigs = take(uint64(ix.slots) * 8)
	ix.rows = take(uint64(ix.slots) * 4)
	kinds := take(uint64(ix.nkinds) * 4)
	for i := uint32(0); i < ix.nkinds; i++ {
		ix.kinds = append(ix.kinds, le32(kinds[4*i:]))
	}
	ix.offs = take(uint64(ix.units) * uint64(ix.nkinds) * 4)
	ix.sizes = take(uint64(ix.units) * uint64(ix.nkinds) * 4)
	return ix, nil
}

// find probes the hash table as the DWARF 5 standard lays it out.
func (ix *cuIndex) find(id uint64) (uint32, bool) {
	mask := uint64(ix.slots - 1)
	h := id & mask
	step := (id>>32)&mask | 1
	for range ix.slots {
		row := le32(ix.rows[4*h:])
		if row == 0 {
			return 0, false
		}
		if le64(ix.sigs[8*h:]) == id {
			if row > ix.units {
				return 0, false
			}
			return row - 1, true
		}
		h = (h + step) & mask
	}
	return 0, false
}

func (ix *cuIndex) contribution(row uint32, kind int) (off, size uint32) {
	i := (uint64(row)*uint64(ix.nkinds) + uint64(kind)) * 4
	return le32(ix.offs[i:]), le32(ix.sizes[i:])
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }
