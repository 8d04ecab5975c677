package elfx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// FDEs is .eh_frame_hdr's search table over .eh_frame: where a file's
// functions start and end, as its unwind information says, for code a
// stripped symbol table no longer names (a compiler's split-off .cold
// parts, an interpreter's loop). Every offset is checked: the sections
// are the file's.
type FDEs struct {
	rows   []fdeRow
	eh     []byte
	ehAddr uint64
}

// FDEs reads f's .eh_frame_hdr search table and .eh_frame.
func (f *File) FDEs() (*FDEs, error) {
	s, ehf := f.Section(".eh_frame_hdr"), f.Section(".eh_frame")
	if s == nil || ehf == nil {
		return nil, errors.New("no .eh_frame_hdr or .eh_frame")
	}
	hdr, err := f.SectionData(".eh_frame_hdr")
	if err != nil {
		return nil, fmt.Errorf(".eh_frame_hdr: %w", err)
	}
	eh, err := f.SectionData(".eh_frame")
	if err != nil {
		return nil, fmt.Errorf(".eh_frame: %w", err)
	}
	return ParseFDEs(hdr, s.Addr, eh, ehf.Addr)
}

// ParseFDEs is File.FDEs over the sections' bytes and addresses.
func ParseFDEs(hdr []byte, hdrAddr uint64, eh []byte, ehAddr uint64) (*FDEs, error) {
	rows, err := parseHdrTable(hdr, hdrAddr)
	if err != nil {
		return nil, err
	}
	return &FDEs{rows: rows, eh: eh, ehAddr: ehAddr}, nil
}

// Starts returns the functions' initial locations, sorted.
func (x *FDEs) Starts() []uint64 {
	out := make([]uint64, len(x.rows))
	for i, r := range x.rows {
		out[i] = r.loc
	}
	return out
}

// fdeRow is one row of .eh_frame_hdr's search table.
type fdeRow struct{ loc, fde uint64 }

// parseHdrTable reads the sorted (initial location, FDE address) table of
// .eh_frame_hdr at address addr. Only the encoding every linker writes is
// accepted: datarel sdata4 entries.
func parseHdrTable(b []byte, addr uint64) ([]fdeRow, error) {
	const datarelSdata4 = 0x3b
	if len(b) < 12 || b[0] != 1 || b[3] != datarelSdata4 {
		return nil, errors.New(".eh_frame_hdr without a datarel sdata4 search table")
	}
	r := b[4:]
	// eh_frame_ptr, then fde_count, each in its own encoding.
	_, n, err := readEHPointer(r, b[1], addr+4)
	if err != nil {
		return nil, err
	}
	r = r[n:]
	count, n, err := readEHPointer(r, b[2], addr+4+uint64(n))
	if err != nil {
		return nil, err
	}
	r = r[n:]
	if count > uint64(len(r)/8) {
		return nil, fmt.Errorf(".eh_frame_hdr: %d entries in %d bytes", count, len(r))
	}
	out := make([]fdeRow, count)
	for i := range out {
		loc := int32(binary.LittleEndian.Uint32(r[8*i:]))
		fde := int32(binary.LittleEndian.Uint32(r[8*i+4:]))
		out[i] = fdeRow{addr + uint64(int64(loc)), addr + uint64(int64(fde))}
	}
	if !sort.SliceIsSorted(out, func(i, j int) bool { return out[i].loc < out[j].loc }) {
		return nil, errors.New(".eh_frame_hdr table not sorted")
	}
	return out, nil
}

// readEHPointer reads one DWARF EH pointer of encoding enc (absptr, udata4,
// sdata4, udata8, optionally pcrel) at address at.
func readEHPointer(b []byte, enc byte, at uint64) (uint64, int, error) {
	var v uint64
	var n int
	switch enc & 0x0f {
	case 0x00, 0x04: // absptr, udata8
		if len(b) < 8 {
			return 0, 0, errEHTruncated
		}
		v, n = binary.LittleEndian.Uint64(b), 8
	case 0x03: // udata4
		if len(b) < 4 {
			return 0, 0, errEHTruncated
		}
		v, n = uint64(binary.LittleEndian.Uint32(b)), 4
	case 0x0b: // sdata4
		if len(b) < 4 {
			return 0, 0, errEHTruncated
		}
		v, n = uint64(int64(int32(binary.LittleEndian.Uint32(b)))), 4
	default:
		return 0, 0, fmt.Errorf("pointer encoding %#x", enc)
	}
	switch enc & 0x70 {
	case 0:
	case 0x10: // pcrel
		v += at
	default:
		return 0, 0, fmt.Errorf("pointer encoding %#x", enc)
	}
	return v, n, nil
}

var errEHTruncated = errors.New("truncated .eh_frame")

// Covering finds the function whose FDE holds pc: the table row with the
// greatest initial location <= pc, and that FDE's pc_range, read from
// .eh_frame with the pointer encoding of its CIE.
func (x *FDEs) Covering(pc uint64) (start, end uint64, ok bool) {
	idx, eh, ehAddr := x.rows, x.eh, x.ehAddr
	i := sort.Search(len(idx), func(i int) bool { return idx[i].loc > pc }) - 1
	if i < 0 {
		return 0, 0, false
	}
	off := idx[i].fde - ehAddr
	if idx[i].fde < ehAddr || off+8 > uint64(len(eh)) {
		return 0, 0, false
	}
	// FDE: length (4), CIE pointer (4, relative to itself), pc_begin, pc_range.
	if binary.LittleEndian.Uint32(eh[off:]) == 0xffffffff {
		return 0, 0, false // 64-bit DWARF: not written for .eh_frame
	}
	ciePtr := uint64(binary.LittleEndian.Uint32(eh[off+4:]))
	if ciePtr == 0 || ciePtr > off+4 {
		return 0, 0, false
	}
	enc, ok := cieEncoding(eh, off+4-ciePtr)
	if !ok {
		return 0, 0, false
	}
	begin, n, err := readEHPointer(eh[off+8:], enc, ehAddr+off+8)
	if err != nil {
		return 0, 0, false
	}
	size, _, err := readEHPointer(eh[off+8+uint64(n):], enc&0x0f, 0)
	if err != nil || begin > pc || pc-begin >= size {
		return 0, 0, false
	}
	return begin, begin + size, true
}

// cieEncoding returns the FDE pointer encoding a CIE declares (its 'R'
// augmentation; absptr without one).
func cieEncoding(eh []byte, off uint64) (byte, bool) {
	if off+9 > uint64(len(eh)) {
		return 0, false
	}
	length := uint64(binary.LittleEndian.Uint32(eh[off:]))
	if length < 6 || length == 0xffffffff || off+4+length > uint64(len(eh)) || binary.LittleEndian.Uint32(eh[off+4:]) != 0 {
		return 0, false
	}
	b := eh[off+9 : off+4+length] // after length, CIE id and version
	aug := 0
	for aug < len(b) && b[aug] != 0 {
		aug++
	}
	if aug == len(b) {
		return 0, false
	}
	augStr, b := string(b[:aug]), b[aug+1:]
	if len(augStr) == 0 || augStr[0] != 'z' {
		return 0, len(augStr) == 0
	}
	// code alignment (uleb), data alignment (sleb), return register
	// (uleb, version 3), augmentation length (uleb).
	for range 4 {
		i := 0
		for i < len(b) && b[i]&0x80 != 0 {
			i++
		}
		if i >= len(b) {
			return 0, false
		}
		b = b[i+1:]
	}
	for _, c := range augStr[1:] {
		switch c {
		case 'R':
			if len(b) == 0 {
				return 0, false
			}
			return b[0], true
		case 'L':
			if len(b) == 0 {
				return 0, false
			}
			b = b[1:]
		case 'P':
			if len(b) == 0 {
				return 0, false
			}
			_, n, err := readEHPointer(b[1:], b[0]&0x7f, 0)
			if err != nil {
				return 0, false
			}
			b = b[1+n:]
		case 'S', 'B':
		default:
			return 0, false
		}
	}
	return 0, true
}
