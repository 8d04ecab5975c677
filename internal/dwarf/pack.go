package dwarf

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// Skeletons lists f's skeleton units: what a copy of f's symbols needs
// beside it to name functions (the agent packs their split units into the
// file it uploads, see Pack).
func Skeletons(f *elfx.File) ([]Skeleton, error) {
	var s sections
	for _, n := range []struct {
		name string
		dst  *[]byte
	}{
		{".debug_info", &s.info}, {".debug_abbrev", &s.abbrev}, {".debug_str", &s.str},
		{".debug_line_str", &s.lineStr}, {".debug_str_offsets", &s.strOffsets},
	} {
		d, err := sectionData(f, n.name)
		if err != nil {
			return nil, err
		}
		*n.dst = d
	}
	t := &Table{sec: s, abbrevs: map[abbrevKey]*abbrevTable{}}
	units, err := scanUnits(s.info, func(n int64) error { return f.Charge(n, "DWARF unit index") })
	if err != nil && len(units) == 0 {
		return nil, err
	}
	var out []Skeleton
	for _, u := range units {
		h, err := t.headOf(u)
		if err != nil || !h.hasDWO {
			continue
		}
		out = append(out, Skeleton{DWOName: h.dwoName, CompDir: h.compDir, ID: h.dwoID})
	}
	return out, nil
}

// Pack builds the sections of a .dwp package (as llvm-dwp and dwp do)
// from split units, each a .dwo file's sections, all of one DWARF version:
// their sections concatenated, .debug_str.dwo merged with the string
// offsets of each unit moved along, and a .debug_cu_index (version 5, or
// GNU's 2 for DWARF 4 units) over their dwo ids. A file holding these
// sections is its own package: the engine reads its skeletons' split units
// from it. The result maps section names to contents.
func Pack(dwos []SplitSections) (map[string][]byte, error) {
	if len(dwos) == 0 {
		return nil, fmt.Errorf("no split units to pack: %w", frame.ErrNoDebugInfo)
	}
	type unitRow struct {
		id          uint64
		offs, sizes [5]uint32 // info, abbrev, line, str_offsets, rnglists
	}
	var (
		info, abbrev, line, str, strOffs, rngs []byte
		rows                                   []unitRow
		version                                uint8
		seen                                   = map[uint64]bool{}
	)
	for i, d := range dwos {
		st := &Table{sec: sections{info: d.Info, abbrev: d.Abbrev, str: d.Str, strOffsets: d.StrOffsets},
			abbrevs: map[abbrevKey]*abbrevTable{}, link: &splitLink{}}
		units, err := scanUnits(d.Info, nil)
		if len(units) != 1 {
			return nil, fmt.Errorf("split unit %d: %d units (%v): %w", i, len(units), err, frame.ErrCorruptFile)
		}
		u := units[0]
		h, err := st.headOf(u)
		if err != nil {
			return nil, fmt.Errorf("split unit %d: %w", i, err)
		}
		id := h.dwoID
		if u.unitType == utSplitCompile {
			id = u.dwoID
		}
		if version == 0 {
			version = u.shape.version
		}
		if u.shape.version != version || u.shape.offSize != 4 {
			return nil, fmt.Errorf("split unit %d: DWARF %d (%d-byte offsets) among DWARF %d units: %w",
				i, u.shape.version, u.shape.offSize, version, frame.ErrCorruptFile)
		}
		if seen[id] {
			continue // the same unit twice (one .dwo named by two skeletons)
		}
		seen[id] = true
		if uint64(len(str))+uint64(len(d.Str)) > 1<<32-1 {
			return nil, fmt.Errorf("merged strings pass 4 GiB: %w", frame.ErrLimitExceeded)
		}
		// Moving the unit's strings along means adding where they now
		// start to each of its string offsets (after DWARF 5's header).
		so := append([]byte(nil), d.StrOffsets...)
		first := 0
		if version >= 5 {
			first = min(8, len(so))
		}
		for p := first; p+4 <= len(so); p += 4 {
			binary.LittleEndian.PutUint32(so[p:], binary.LittleEndian.Uint32(so[p:])+uint32(len(str)))
		}
		var r unitRow
		r.id = id
		for k, pair := range []struct {
			dst *[]byte
			src []byte
		}{{&info, d.Info}, {&abbrev, d.Abbrev}, {&line, d.Line}, {&strOffs, so}, {&rngs, d.Rnglists}} {
			if uint64(len(*pair.dst))+uint64(len(pair.src)) > 1<<32-1 {
				return nil, fmt.Errorf("package section passes 4 GiB: %w", frame.ErrLimitExceeded)
			}
			r.offs[k], r.sizes[k] = uint32(len(*pair.dst)), uint32(len(pair.src))
			*pair.dst = append(*pair.dst, pair.src...)
		}
		str = append(str, d.Str...)
		rows = append(rows, r)
	}
	// The index: kinds with a contribution, a hash table of the ids.
	kinds := []uint32{sectInfo, sectAbbrev, sectLine, sectStrOffsets, sectRnglists}
	col := []int{0, 1, 2, 3, 4}
	if version < 5 {
		kinds, col = kinds[:4], col[:4] // version 2 has no range lists column
	}
	var keepK []uint32
	var keepC []int
	for i, c := range col {
		for _, r := range rows {
			if r.sizes[c] > 0 {
				keepK, keepC = append(keepK, kinds[i]), append(keepC, c)
				break
			}
		}
	}
	slots := uint32(1) << bits.Len32(uint32(len(rows)*3/2+1))
	sigs := make([]uint64, slots)
	idx := make([]uint32, slots)
	for i, r := range rows {
		mask := uint64(slots - 1)
		h, step := r.id&mask, (r.id>>32)&mask|1
		for idx[h] != 0 {
			h = (h + step) & mask
		}
		sigs[h], idx[h] = r.id, uint32(i+1)
	}
	var ix []byte
	le := binary.LittleEndian
	if version >= 5 {
		ix = le.AppendUint16(ix, 5)
		ix = le.AppendUint16(ix, 0)
	} else {
		ix = le.AppendUint32(ix, 2)
	}
	ix = le.AppendUint32(ix, uint32(len(keepK)))
	ix = le.AppendUint32(ix, uint32(len(rows)))
	ix = le.AppendUint32(ix, slots)
	for _, s := range sigs {
		ix = le.AppendUint64(ix, s)
	}
	for _, v := range idx {
		ix = le.AppendUint32(ix, v)
	}
	for _, k := range keepK {
		ix = le.AppendUint32(ix, k)
	}
	for _, r := range rows {
		for _, c := range keepC {
			ix = le.AppendUint32(ix, r.offs[c])
		}
	}
	for _, r := range rows {
		for _, c := range keepC {
			ix = le.AppendUint32(ix, r.sizes[c])
		}
	}
	out := map[string][]byte{".debug_info.dwo": info, ".debug_abbrev.dwo": abbrev, ".debug_str.dwo": str,
		".debug_str_offsets.dwo": strOffs, ".debug_cu_index": ix}
	if len(line) > 0 {
		out[".debug_line.dwo"] = line
	}
	if len(rngs) > 0 && version >= 5 {
		out[".debug_rnglists.dwo"] = rngs
	}
	return out, nil
}
