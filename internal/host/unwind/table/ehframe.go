package table

import (
	"debug/elf"
	"errors"
	"fmt"
	"slices"

	"github.com/profsym/profsym/internal/frame"
)

// .eh_frame_hdr (LSB "Exception Frame Header"): a version byte, three
// encodings, a pointer to .eh_frame, an FDE count and a table of
// (initial location, FDE address) pairs sorted by location, both relative
// to the header (datarel). It locates .eh_frame when section headers are
// gone, gives the datarel base, and indexes the FDEs, which lets a walk
// stopped by a corrupt entry pick up the FDEs after it.
type ehHdr struct {
	addr      uint64 // virtual address of the header
	frameAddr uint64 // eh_frame_ptr
	count     int    // FDEs in the table (0: no table)
	tableEnc  uint8
	table     []byte // count*2 encoded pointers
	tableAddr uint64
	entrySize int // bytes of one encoded pointer
}

// parseEhHdr validates the header. A count that the bytes present cannot
// hold is refused before anything is read from the table.
func parseEhHdr(data []byte, addr uint64, ptrSize int, big bool) (*ehHdr, error) {
	r := reader{b: data, big: big}
	version, frameEnc, countEnc, tableEnc := r.u8(), r.u8(), r.u8(), r.u8()
	if r.bad {
		return nil, fmt.Errorf(".eh_frame_hdr: %w", errTruncated)
	}
	if version != 1 {
		return nil, fmt.Errorf(".eh_frame_hdr: version %d", version)
	}
	sec := section{name: ".eh_frame_hdr", data: data, addr: addr, ptrSize: ptrSize, big: big, dataBase: addr, hasData: true}
	h := &ehHdr{addr: addr, tableEnc: tableEnc}
	fp, err := sec.readPtr(&r, frameEnc&^peIndirect)
	if err != nil {
		return nil, fmt.Errorf(".eh_frame_hdr: eh_frame_ptr: %v", err)
	}
	h.frameAddr = fp
	if countEnc == peOmit || tableEnc == peOmit {
		return h, nil
	}
	n, err := sec.readPtr(&r, countEnc&^peIndirect)
	if err != nil {
		return nil, fmt.Errorf(".eh_frame_hdr: fde_count: %v", err)
	}
	switch tableEnc & 0x0f {
	case peUdata2, peSdata2:
		h.entrySize = 2
	case peUdata4, peSdata4:
		h.entrySize = 4
	case peUdata8, peSdata8:
		h.entrySize = 8
	case peAbsptr:
		h.entrySize = ptrSize
	default:
		// Variable-size entries cannot be binary searched; no linker
		// writes them. The header still locates .eh_frame.
		return h, nil
	}
	room := uint64(r.left()) / uint64(2*h.entrySize)
	if n > room {
		return nil, fmt.Errorf(".eh_frame_hdr: claims %d FDEs, the section holds at most %d", n, room)
	}
	h.count = int(n)
	h.tableAddr = addr + uint64(r.off)
	h.table = r.take(h.count * 2 * h.entrySize)
	return h, nil
}

// fdeOffsets returns the .eh_frame offsets of the indexed FDEs at or after
// from, sorted and without duplicates.
func (h *ehHdr) fdeOffsets(frameAddr uint64, frameLen int, from int, ptrSize int, big bool) []int {
	sec := section{name: ".eh_frame_hdr", data: h.table, addr: h.tableAddr, ptrSize: ptrSize, big: big, dataBase: h.addr, hasData: true}
	r := reader{b: h.table, big: big}
	var offs []int
	for i := 0; i < h.count; i++ {
		if _, err := sec.readPtr(&r, h.tableEnc&^peIndirect); err != nil {
			break
		}
		a, err := sec.readPtr(&r, h.tableEnc&^peIndirect)
		if err != nil {
			break
		}
		if a < frameAddr || a-frameAddr >= uint64(frameLen) {
			continue
		}
		if off := int(a - frameAddr); off >= from {
			offs = append(offs, off)
		}
	}
	slices.Sort(offs)
	return slices.Compact(offs)
}

// ehFrame locates .eh_frame (by section, or through PT_GNU_EH_FRAME when
// the section headers are gone) and reads it.
func (b *builder) ehFrame() (*source, error) {
	f := b.f
	big, ps := b.big, b.ptrSz
	var hdr *ehHdr
	var hdrErr error
	hdrData, hdrAddr, ok := b.hdrBytes()
	if ok {
		hdr, hdrErr = parseEhHdr(hdrData, hdrAddr, ps, big)
	}
	var data []byte
	var addr uint64
	if s := f.Section(".eh_frame"); s != nil && s.Type != elf.SHT_NOBITS {
		if s.Size > maxCFISection {
			return nil, fmt.Errorf(".eh_frame of %d bytes: %w", s.Size, frame.ErrLimitExceeded)
		}
		d, err := f.SectionData(".eh_frame")
		if err != nil {
			return nil, fmt.Errorf(".eh_frame: %w", err)
		}
		data, addr = d, s.Addr
	} else if hdr != nil {
		// Without section headers .eh_frame runs to its terminator, at the
		// latest to the end of the segment holding it.
		d, err := b.segmentFrom(hdr.frameAddr)
		if err != nil {
			return nil, fmt.Errorf(".eh_frame at %#x: %w", hdr.frameAddr, err)
		}
		data, addr = d, hdr.frameAddr
	} else {
		return nil, hdrErr
	}
	return b.readEHFrame(data, addr, hdr, hdrErr)
}

// readEHFrame parses .eh_frame bytes at addr, with the header if any.
func (b *builder) readEHFrame(data []byte, addr uint64, hdr *ehHdr, hdrErr error) (*source, error) {
	big, ps := b.big, b.ptrSz
	if len(data) > maxCFISection {
		data = data[:maxCFISection]
	}
	sec := &section{name: ".eh_frame", data: data, addr: addr, ptrSize: ps, big: big, deref: b.deref}
	if hdr != nil {
		sec.dataBase, sec.hasData = hdr.addr, true
	}
	b.stats.SourceBytes += len(data)
	out := b.newSource("eh_frame")
	nsegs := len(data)/48 + 1 // about the mean FDE size of C and C++ code
	if hdr != nil && hdr.count > 0 {
		nsegs = hdr.count // checked against the header's size
	}
	out.segs = make([]seg, 0, min(nsegs, b.max))
	p := b.newParser(sec, out)
	stop, err := p.walk()
	if err != nil {
		if errors.Is(err, errLimit) {
			return nil, err
		}
		p.note(err)
		// The index still knows the FDEs past the damage.
		if hdr != nil && hdr.count > 0 {
			for _, off := range hdr.fdeOffsets(addr, len(data), stop+1, ps, big) {
				if ferr := p.fdeAt(off); ferr != nil {
					if errors.Is(ferr, errLimit) {
						return nil, ferr
					}
					out.stats.BadFDEs++
				}
			}
		}
		if len(out.segs) == 0 {
			return nil, err
		}
	}
	if hdrErr != nil {
		p.note(hdrErr)
	}
	return out, nil
}

// hdrBytes returns .eh_frame_hdr by section or by PT_GNU_EH_FRAME.
func (b *builder) hdrBytes() ([]byte, uint64, bool) {
	if s := b.f.Section(".eh_frame_hdr"); s != nil && s.Type != elf.SHT_NOBITS {
		if d, err := b.f.SectionData(".eh_frame_hdr"); err == nil {
			return d, s.Addr, true
		}
	}
	for _, p := range b.f.Progs {
		if p.Type == elf.PT_GNU_EH_FRAME && p.Filesz > 0 && p.Filesz < maxCFISection {
			if d, err := b.f.ReadVaddr(p.Vaddr, int(p.Filesz)); err == nil {
				return d, p.Vaddr, true
			}
		}
	}
	return nil, 0, false
}

// segmentFrom returns the file bytes from addr to the end of the PT_LOAD
// segment holding it.
func (b *builder) segmentFrom(addr uint64) ([]byte, error) {
	for _, p := range b.f.Loads() {
		if addr >= p.Vaddr && addr-p.Vaddr < p.Filesz {
			return b.f.ReadVaddr(addr, int(min(p.Filesz-(addr-p.Vaddr), maxCFISection)))
		}
	}
	return nil, fmt.Errorf("not in a loaded segment")
}
