package table

import (
	"errors"
	"fmt"
	"math"
)

// The framing of CFI sections: where each CIE and FDE begins and ends, and
// the pointer encodings their fields use (DW_EH_PE_*). cfi.go interprets
// what the records say.

// DW_EH_PE_* pointer encodings.
const (
	peAbsptr   = 0x00
	peUleb128  = 0x01
	peUdata2   = 0x02
	peUdata4   = 0x03
	peUdata8   = 0x04
	peSleb128  = 0x09
	peSdata2   = 0x0a
	peSdata4   = 0x0b
	peSdata8   = 0x0c
	pePcrel    = 0x10
	peTextrel  = 0x20
	peDatarel  = 0x30
	peFuncrel  = 0x40
	peAligned  = 0x50
	peIndirect = 0x80
	peOmit     = 0xff
)

var (
	errTruncated  = errors.New("truncated entry")
	errTerminator = errors.New("terminator")
)

// section is one CFI section image.
type section struct {
	name    string
	data    []byte
	addr    uint64 // virtual address of data[0]: the base of pcrel pointers (.eh_frame)
	debug   bool   // .debug_frame layout: CIE id ~0, CIE pointers are section offsets
	ptrSize int
	big     bool
	// dataBase is the DW_EH_PE_datarel base, the .eh_frame_hdr address;
	// hasData is false when the file has none.
	dataBase uint64
	hasData  bool
	// deref reads a pointer of the file image for DW_EH_PE_indirect.
	deref func(addr uint64, size int) (uint64, bool)
}

// entry is the framing of one CIE or FDE.
type entry struct {
	off    int // offset of the length field
	body   int // offset just past the CIE id / CIE pointer
	end    int // offset of the next entry
	isCIE  bool
	ciePtr int
}

// entryAt decodes the framing at off.
func (s *section) entryAt(off int) (entry, error) {
	r := reader{b: s.data, off: off, big: s.big}
	length := uint64(r.u32())
	is64 := false
	if length == 0xffffffff {
		length, is64 = r.u64(), true
	} else if length >= 0xfffffff0 {
		return entry{}, fmt.Errorf("%s+%#x: reserved length %#x", s.name, off, length)
	}
	if r.bad {
		return entry{}, fmt.Errorf("%s+%#x: %w", s.name, off, errTruncated)
	}
	if length == 0 {
		return entry{}, errTerminator
	}
	if length > uint64(r.left()) {
		return entry{}, fmt.Errorf("%s+%#x: length %#x runs past the section end", s.name, off, length)
	}
	e := entry{off: off, end: r.off + int(length)}
	idOff := r.off
	var id uint64
	if is64 {
		id = r.u64()
	} else {
		id = uint64(r.u32())
	}
	if r.bad || r.off > e.end {
		return entry{}, fmt.Errorf("%s+%#x: entry shorter than its id", s.name, off)
	}
	e.body = r.off
	if s.debug {
		if (!is64 && id == 0xffffffff) || (is64 && id == math.MaxUint64) {
			e.isCIE = true
		} else if id >= uint64(len(s.data)) {
			return e, fmt.Errorf("%s+%#x: CIE pointer %#x outside the section", s.name, off, id)
		} else {
			e.ciePtr = int(id)
		}
	} else {
		if id == 0 {
			e.isCIE = true
		} else if id > uint64(idOff) {
			return e, fmt.Errorf("%s+%#x: CIE pointer %#x before the section", s.name, off, id)
		} else {
			e.ciePtr = idOff - int(id)
		}
	}
	return e, nil
}

// readPtr decodes a pointer of encoding enc at r's position; fieldAddr is
// the address of the field for pcrel.
func (s *section) readPtr(r *reader, enc uint8) (uint64, error) {
	if enc == peOmit {
		return 0, nil
	}
	fieldOff := r.off
	if enc&0x70 == peAligned {
		// The value sits at the next pointer-aligned address.
		a := s.addr + uint64(r.off)
		pad := (uint64(s.ptrSize) - a%uint64(s.ptrSize)) % uint64(s.ptrSize)
		r.take(int(pad))
		fieldOff = r.off
	}
	var v uint64
	switch enc & 0x0f {
	case peAbsptr:
		if s.ptrSize == 4 {
			v = uint64(r.u32())
		} else {
			v = r.u64()
		}
	case peUleb128:
		v = r.uleb()
	case peUdata2:
		v = uint64(r.u16())
	case peUdata4:
		v = uint64(r.u32())
	case peUdata8, peSdata8:
		v = r.u64()
	case peSleb128:
		v = uint64(r.sleb())
	case peSdata2:
		v = uint64(int64(int16(r.u16())))
	case peSdata4:
		v = uint64(int64(int32(r.u32())))
	default:
		return 0, fmt.Errorf("pointer format %#x", enc)
	}
	if r.bad {
		return 0, errTruncated
	}
	switch enc & 0x70 {
	case peAbsptr, peAligned:
	case pePcrel:
		v += s.addr + uint64(fieldOff)
	case peDatarel:
		if !s.hasData {
			return 0, fmt.Errorf("datarel pointer without .eh_frame_hdr")
		}
		v += s.dataBase
	default: // textrel and funcrel are not produced for x86-64 or arm64 code addresses
		return 0, fmt.Errorf("pointer application %#x", enc&0x70)
	}
	if s.ptrSize == 4 {
		v &= math.MaxUint32
	}
	if enc&peIndirect != 0 {
		if s.deref == nil {
			return 0, fmt.Errorf("indirect pointer")
		}
		p, ok := s.deref(v, s.ptrSize)
		if !ok {
			return 0, fmt.Errorf("indirect pointer %#x not in the file", v)
		}
		v = p
	}
	return v, nil
}

// skipPtr steps over a pointer of encoding enc without resolving it (the
// personality routine, which unwinding does not need).
func (s *section) skipPtr(r *reader, enc uint8) error {
	if enc == peOmit {
		return nil
	}
	if enc&0x70 == peAligned {
		a := s.addr + uint64(r.off)
		r.take(int((uint64(s.ptrSize) - a%uint64(s.ptrSize)) % uint64(s.ptrSize)))
	}
	switch enc & 0x0f {
	case peAbsptr:
		r.take(s.ptrSize)
	case peUleb128:
		r.uleb()
	case peSleb128:
		r.sleb()
	case peUdata2, peSdata2:
		r.take(2)
	case peUdata4, peSdata4:
		r.take(4)
	case peUdata8, peSdata8:
		r.take(8)
	default:
		return fmt.Errorf("pointer format %#x", enc)
	}
	if r.bad {
		return errTruncated
	}
	return nil
}
