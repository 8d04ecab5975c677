package dwarf

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/profsym/profsym/internal/frame"
)

// unit is one unit header of .debug_info. Headers are read by New; the
// rest is filled in lazily (unitState), in three independent steps so that
// a unit parsing its DIE tree may consult another unit's abbreviations and
// file names (cross-unit DW_FORM_ref_addr) without waiting on that unit's
// own full parse, which could otherwise deadlock on a reference cycle.
// The header is all an unused unit costs: the index is of every unit of a
// file the file decides the number of.
type unit struct {
	off       uint64 // offset of the unit header in .debug_info
	end       uint64 // offset one past the unit
	dieOff    uint64 // offset of the unit DIE
	abbrevOff uint64
	dwoID     uint64 // DWARF 5 skeleton and split units: from the header
	shape     unitShape
	unitType  uint8

	lazy atomic.Pointer[unitState] // nil until the unit is first used
}

// unitState is what using a unit parses.
type unitState struct {
	headOnce sync.Once
	head     *unitHead
	headErr  error

	filesOnce sync.Once
	lines     *lineHeader
	filesErr  error

	// The full parse is once per unit, under fullMu; Prefetch skips a unit
	// whose parse another goroutine holds (TryLock) rather than wait.
	fullMu   sync.Mutex
	fullDone atomic.Bool
	full     *unitData
	fullErr  error
}

// state returns u's lazily parsed state, making it on first use.
func (u *unit) state() *unitState {
	if s := u.lazy.Load(); s != nil {
		return s
	}
	u.lazy.CompareAndSwap(nil, &unitState{})
	return u.lazy.Load()
}

// parsed reports whether u's full parse is done, without making its state.
func (u *unit) parsed() bool {
	s := u.lazy.Load()
	return s != nil && s.fullDone.Load()
}

// unitHead is the unit's abbreviation table plus what its unit DIE says.
type unitHead struct {
	abbrevs  *abbrevTable
	tag      uint16
	compDir  string
	stmtList uint64
	hasStmt  bool
	base     uint64 // base address for range lists: the unit DIE's low_pc

	addrBase     uint64
	strOffBase   uint64
	rnglistsBase uint64
	hasStrOff    bool
	hasRngBase   bool

	// A skeleton unit (split DWARF): where its split unit is, and the
	// base its DWARF 4 (GNU) split unit's range lists are relative to.
	dwoName       string
	dwoID         uint64
	hasDWO        bool
	gnuRangesBase uint64
	// In a split unit: what its DW_AT_ranges offsets add (the skeleton's
	// DW_AT_GNU_ranges_base).
	rangesBase uint64

	top dieAttrs // the unit DIE's own attributes, for its ranges
}

const (
	utCompile      = 1
	utType         = 2
	utPartial      = 3
	utSkeleton     = 4
	utSplitCompile = 5
	utSplitType    = 6
)

// unitBytes is the heap one indexed unit holds: its header (unit), its
// pointer and its entry in the address index (99 bytes measured by
// TestUnitIndexCharged, with an eighth to spare); what parsing it makes
// (unitState) comes when it is used and is counted then (Table.parsed). A
// unit header is 12 bytes of file, so an index is up to 9 times the size of
// the .debug_info it comes from, which is why it is charged to the file's
// budget. Before the header and its state were split and heads decoded for
// the index were kept, it was 626 bytes.
const unitBytes = 112

// unitChunk is how many units are allocated together.
const unitChunk = 256

// unchargedUnits bounds the units of a scan with no budget to charge: a
// split unit's .dwo or a package's contribution, which hold one unit or a
// few.
const unchargedUnits = 4096

// scanUnits reads every unit header in .debug_info without touching DIEs.
// charge, if set, is asked for each unit's heap before it is indexed
// (elfx.File.Charge); when it refuses, or past unchargedUnits without it,
// the units scanned so far are returned with its error.
func scanUnits(info []byte, charge func(n int64) error) ([]*unit, error) {
	var units []*unit
	var chunk []unit // units are allocated unitChunk at a time
	b := buf{data: info}
	for b.off < len(info) {
		start := uint64(b.off)
		length, offSize := b.unitLength()
		if b.err != nil {
			return units, corruptf("unit header at %#x", start)
		}
		body := uint64(b.off)
		end := body + length
		if end < body || end > uint64(len(info)) {
			return units, corruptf("unit at %#x: length %#x runs past .debug_info", start, length)
		}
		if len(chunk) == cap(chunk) {
			chunk = make([]unit, 0, unitChunk)
		}
		chunk = append(chunk, unit{off: start, end: end})
		u := &chunk[len(chunk)-1]
		u.shape.offSize = uint8(offSize)
		ver := b.u16()
		u.shape.version = uint8(ver)
		switch {
		case ver >= 2 && ver <= 4:
			u.abbrevOff = b.uN(offSize)
			u.shape.addrSize = b.u8()
			u.unitType = utCompile
		case ver == 5:
			u.unitType = b.u8()
			u.shape.addrSize = b.u8()
			u.abbrevOff = b.uN(offSize)
			switch u.unitType {
			case utSkeleton, utSplitCompile:
				u.dwoID = b.u64()
			case utType, utSplitType:
				b.skip(8 + uint64(offSize))
			}
		default:
			// A version we do not know: its header layout is unknown too,
			// but the length still lets us step over it.
			b.seek(end)
			continue
		}
		if b.err != nil || uint64(b.off) > end {
			return units, corruptf("unit header at %#x truncated", start)
		}
		u.dieOff = uint64(b.off)
		b.seek(end)
		switch u.shape.addrSize {
		case 4, 8:
		default:
			return units, corruptf("unit at %#x: address size %d", start, u.shape.addrSize)
		}
		if u.unitType == utCompile || u.unitType == utPartial || u.unitType == utSkeleton || u.unitType == utSplitCompile {
			switch {
			case charge == nil && len(units) >= unchargedUnits:
				return units, fmt.Errorf("more than %d units in a split unit's section: %w", unchargedUnits, frame.ErrLimitExceeded)
			case charge != nil:
				if err := charge(unitBytes); err != nil {
					return units, fmt.Errorf("indexing unit %d of .debug_info: %w", len(units), err)
				}
			}
			units = append(units, u)
		}
	}
	return units, nil
}

// unitAt returns the unit whose extent holds .debug_info offset off.
func (t *Table) unitAt(off uint64) *unit {
	if i := t.unitIndex(off); i >= 0 {
		return t.units[i]
	}
	return nil
}

// unitIndex is unitAt's index in t.units, or -1.
func (t *Table) unitIndex(off uint64) int {
	us := t.units
	lo, hi := 0, len(us)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if us[m].end <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(us) && us[lo].off <= off && off < us[lo].end {
		return lo
	}
	return -1
}

type abbrevKey struct {
	off   uint64
	shape unitShape
}

// abbrevsFor returns the (shared) abbreviation table for u.
func (t *Table) abbrevsFor(u *unit) (*abbrevTable, error) {
	k := abbrevKey{u.abbrevOff, u.shape}
	t.abbrevMu.Lock()
	a, ok := t.abbrevs[k]
	t.abbrevMu.Unlock()
	if ok {
		return a, nil
	}
	a, err := parseAbbrevs(t.sec.abbrev, u.abbrevOff, u.shape)
	if err != nil {
		return nil, err
	}
	t.abbrevMu.Lock()
	defer t.abbrevMu.Unlock()
	if prev, ok := t.abbrevs[k]; ok {
		return prev, nil
	}
	// The tables of a well-formed file do not overlap, so together they
	// decode .debug_abbrev about once (twice if units of two shapes share
	// one). Units pointing into the middle of each other's tables would
	// decode it once per unit: quadratic memory from a small file.
	if t.abbrevBytes+a.size > 2*len(t.sec.abbrev)+maxAbbrevSlack {
		return nil, corruptf("abbreviation tables overlap: %d bytes decoded from a %d-byte .debug_abbrev",
			t.abbrevBytes+a.size, len(t.sec.abbrev))
	}
	t.abbrevBytes += a.size
	t.abbrevs[k] = a
	t.parsed.Add(a.heapBytes())
	return a, nil
}

// maxAbbrevSlack allows the few tables decoded twice that real files have
// beyond the 2x bound (shared tables of units of many shapes).
const maxAbbrevSlack = 64 << 10

// headOf parses u's abbreviations and unit DIE once.
func (t *Table) headOf(u *unit) (*unitHead, error) {
	s := u.state()
	s.headOnce.Do(func() {
		s.head, s.headErr = t.parseHead(u)
	})
	return s.head, s.headErr
}

func (t *Table) parseHead(u *unit) (*unitHead, error) {
	h := new(unitHead)
	if err := t.parseHeadInto(u, h); err != nil {
		return nil, err
	}
	return h, nil
}

// parseHeadInto is parseHead into h, which it overwrites: indexing reuses
// one for every unit rather than make garbage of one per unit.
func (t *Table) parseHeadInto(u *unit, h *unitHead) error {
	abbrevs, err := t.abbrevsFor(u)
	if err != nil {
		return err
	}
	*h = unitHead{abbrevs: abbrevs}
	b := buf{data: t.sec.info[:u.end]}
	b.seek(u.dieOff)
	code := b.uleb()
	if b.err != nil {
		return corruptf("unit at %#x: no unit DIE", u.off)
	}
	a := abbrevs.get(code)
	if a == nil {
		return corruptf("unit at %#x: unknown abbreviation %d", u.off, code)
	}
	h.tag = a.tag
	// The bases may follow the attributes that need them, so one pass
	// collects them and a second decodes everything with them in place.
	start := b.off
	for _, s := range a.attrs {
		form := s.form
		if form == formIndirect {
			form = uint16(b.uleb())
		}
		switch s.at {
		case atAddrBase, atGNUAddrBase:
			h.addrBase = t.readUnsigned(&b, u.shape, form, s.implicit)
			continue
		case atStrOffsetsBase:
			h.strOffBase = t.readUnsigned(&b, u.shape, form, s.implicit)
			h.hasStrOff = true
			continue
		case atRnglistsBase:
			h.rnglistsBase = t.readUnsigned(&b, u.shape, form, s.implicit)
			h.hasRngBase = true
			continue
		case atGNURangesBase:
			h.gnuRangesBase = t.readUnsigned(&b, u.shape, form, s.implicit)
			continue
		case atGNUDWOID:
			h.dwoID = t.readUnsigned(&b, u.shape, form, s.implicit)
			continue
		}
		if !u.shape.skipForm(&b, form) {
			return corruptf("unit at %#x: unknown form %#x", u.off, form)
		}
	}
	if b.err != nil {
		return corruptf("unit DIE at %#x truncated", u.dieOff)
	}
	if !h.hasStrOff && u.shape.version >= 5 {
		// Producers that omit it use the table's first entries (llvm
		// assumes the 8-byte DWARF 5 header for a 32-bit table).
		h.strOffBase = 8
		if u.shape.offSize == 8 {
			h.strOffBase = 16
		}
	}
	b.off = start
	if err := t.decodeAttrs(&b, a, u, h, &h.top); err != nil {
		return err
	}
	if h.top.hasCompDir {
		h.compDir = string(h.top.compDir)
	}
	h.stmtList, h.hasStmt = h.top.stmtList, h.top.hasStmt
	if h.top.hasLow {
		h.base = h.top.low
	}
	if h.top.hasDWOName && t.link == nil && u.unitType != utSplitCompile {
		h.dwoName, h.hasDWO = string(h.top.dwoName), true
		if u.unitType == utSkeleton {
			h.dwoID = u.dwoID
		}
	}
	if t.link != nil {
		t.link.fill(u, h, len(t.sec.line) > 0)
	}
	return nil
}

// readUnsigned decodes a constant or section-offset form.
func (t *Table) readUnsigned(b *buf, shape unitShape, form uint16, implicit int64) uint64 {
	switch form {
	case formData1, formFlag:
		return uint64(b.u8())
	case formData2:
		return uint64(b.u16())
	case formData4:
		return uint64(b.u32())
	case formData8:
		return b.u64()
	case formUdata:
		return b.uleb()
	case formSdata:
		return uint64(b.sleb())
	case formSecOffset:
		return b.uN(int(shape.offSize))
	case formImplicitConst:
		return uint64(implicit)
	}
	shape.skipForm(b, form)
	return 0
}
