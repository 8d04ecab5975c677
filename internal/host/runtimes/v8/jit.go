package v8

import (
	"encoding/binary"

	"github.com/profsym/profsym/internal/frame"
)

// Code objects (V8 11, Node 20): what the v8dbg tables lack. The Code
// object is the metadata of a function's machine code, which lives in an
// InstructionStream in the code space.
const (
	fnCode          = 48 // JSFunction::code, between feedback_cell and prototype_or_initial_map
	codeInstrStart  = 40 // Code::instruction_start (raw address)
	codeFlags       = 48 // Code::flags (uint32): the kind in its low 4 bits
	codeInstrSize   = 56 // Code::instruction_size (int32)
	codeKindMaglev  = 12
	codeKindTurbo   = 13
	maxInlineDepth  = 64 // inlined calls followed for one PC
	maxInlinings    = 1 << 16
	inliningPosSize = 16 // InliningPosition: a SourcePosition and an int, padded
)

// Indices of DeoptimizationData (a FixedArray), from the tables where they
// are (v8dbg_DeoptimizationData*Index).
type deoptIndex struct {
	sfi, literals, inlining int64
}

// optFrames names an optimized frame: code (a Code object of Maglev or
// TurboFan) ran at offset off for the function whose SFI has low bits
// id. The code's source position table gives the line, and the functions
// inlined at off, innermost first.
func (r *reader) optFrames(code uint64, off int64, id uint32, di deoptIndex, info func(sfi uint64) (*fnInfo, error)) ([]frame.Frame, error) {
	if t, err := r.typeOf(code); err != nil || t != r.l.typeCode {
		return nil, badf("%#x: type %d, no code object (freed)", code, t)
	}
	deopt, err := r.word(code, r.l.codeDeopt)
	if err != nil {
		return nil, err
	}
	if t, err := r.typeOf(deopt); err != nil || t != r.l.typeDeopt && t != r.l.typeDeoptAlt {
		return nil, badf("code %#x: deoptimization data %#x of type %d", code, deopt, t)
	}
	sfi, err := r.word(deopt, r.l.arrayData+8*di.sfi)
	if err != nil {
		return nil, err
	}
	if r.l.deoptWrapped > 0 {
		// V8 13: a SharedFunctionInfoWrapper (the SFI must be checked
		// by its own map below, in info).
		if sfi, err = r.word(sfi, r.l.deoptWrapped); err != nil {
			return nil, err
		}
	}
	if uint32(sfi) != id {
		return nil, badf("code %#x: function %#x, the frame's was %#x (code freed, another there)", code, sfi, id)
	}
	outer, err := info(sfi)
	if err != nil {
		return nil, err
	}
	plain := []frame.Frame{{Name: outer.name, File: outer.file, StartFile: outer.file}}
	spt := r.positions(code, r.l.codePositions)
	if spt == nil {
		return plain, nil
	}
	raw := positionAt(spt, off)
	if raw < 0 {
		return plain, nil
	}
	var out []frame.Frame
	for depth := 0; depth < maxInlineDepth; depth++ {
		inl := (raw >> 31) & 0xffff
		if inl == 0 {
			fr := plain[0]
			fr.Line, fr.Column = lineCol(outer.lineEnds, scriptOffset(raw))
			return append(out, fr), nil
		}
		inlined, pos, err := r.inlining(deopt, di, inl-1)
		if err != nil {
			return append(out, plain...), nil
		}
		fi, err := info(inlined)
		if err != nil {
			return append(out, plain...), nil
		}
		fr := frame.Frame{Name: fi.name, File: fi.file, StartFile: fi.file}
		fr.Line, fr.Column = lineCol(fi.lineEnds, scriptOffset(raw))
		out = append(out, fr)
		raw = pos
	}
	return append(out, plain...), nil
}

// inlining reads entry i of the deoptimization data's inlining
// positions: the SharedFunctionInfo inlined there, and the position of
// the call in its caller.
func (r *reader) inlining(deopt uint64, di deoptIndex, i int64) (sfi uint64, pos int64, err error) {
	if i < 0 || i >= maxInlinings {
		return 0, 0, badf("inlining id %d", i)
	}
	positions, err := r.word(deopt, r.l.arrayData+8*di.inlining)
	if err != nil {
		return 0, 0, err
	}
	lw, err := r.word(positions, r.l.arrayLength)
	if err != nil {
		return 0, 0, err
	}
	if !isSmi(lw) || (i+1)*inliningPosSize > smi(lw) {
		return 0, 0, badf("inlining %d of %d bytes", i, smi(lw))
	}
	var b [inliningPosSize]byte
	if err := r.m.Read(positions-1+uint64(r.l.arrayData+i*inliningPosSize), b[:]); err != nil {
		return 0, 0, err
	}
	pos = int64(binary.LittleEndian.Uint64(b[:]))
	fid := int64(int32(binary.LittleEndian.Uint32(b[8:])))
	lits, err := r.word(deopt, r.l.arrayData+8*di.literals)
	if err != nil {
		return 0, 0, err
	}
	lw, err = r.word(lits, r.l.arrayLength)
	if err != nil {
		return 0, 0, err
	}
	if !isSmi(lw) || fid < 0 || fid >= smi(lw) {
		return 0, 0, badf("inlined function %d of %d literals", fid, smi(lw))
	}
	sfi, err = r.word(lits, r.l.arrayData+8*fid)
	return sfi, pos, err
}

// scriptOffset is the script offset of a raw SourcePosition: bit 0 says
// external, then the offset + 1 in 30 bits.
func scriptOffset(raw int64) int64 { return (raw>>1)&(1<<30-1) - 1 }

// Finding a code object from a PC (code V8 runs but did not install on
// the function: on-stack replacement). An InstructionStream starts with
// its map and its Code's address; its instructions follow its header
// (layout.istream: 16 bytes in V8 11, 32 in 13), aligned. V8 10 has no
// InstructionStream: the instructions follow the Code object's own
// 128-byte header.
const (
	istreamHeader = 16      // map, code (V8 11)
	codeAlign     = 64      // kCodeAlignment on x86-64
	maxCodeScan   = 1 << 20 // bytes searched below a PC for its code's start
	scanChunk     = 1 << 14
	readStep      = 1 << 12 // a page: what is mapped is readable in steps of it
)

// codeAt finds the optimized Code object whose instructions hold pc, by
// the InstructionStream headers below pc: a candidate is taken only when
// its map is an InstructionStream's and its Code says it starts there and
// holds pc. 0 when none is found within maxCodeScan bytes.
func (r *reader) codeAt(pc uint64) (code, start uint64) {
	hdr := uint64(r.l.istream)
	// Each chunk is read with the header below its lowest candidate.
	buf := make([]byte, scanChunk+hdr)
	top := pc &^ (codeAlign - 1)
	for scanned := uint64(0); scanned < maxCodeScan && top > scanChunk+hdr; scanned += scanChunk {
		lo := top - scanChunk
		from := lo - hdr // buf holds [from, top)
		floor := uint64(0)
		if r.m.Read(from, buf) != nil {
			// The chunk reaches below the mapping that holds pc: V8
			// put the code near the start of a JIT region (a worker's
			// fresh code space). Its pages above are searched, and
			// nothing below them.
			floor = r.readAbove(from, top, buf)
			if floor == 0 {
				return 0, 0
			}
		}
		for s := top; s > lo && s-hdr >= floor; s -= codeAlign {
			off := s - lo // the header's start in buf
			if !isHeap(binary.LittleEndian.Uint64(buf[off:])) {
				continue
			}
			c := s - hdr + 1 // V8 10: the Code object itself, the instructions inline
			if !r.l.codeInline {
				c = binary.LittleEndian.Uint64(buf[off+8:])
			}
			if !isHeap(c) {
				continue
			}
			if t, err := r.typeOf(c); err != nil || t != r.l.typeCode {
				continue
			}
			var b [8]byte
			if !r.l.codeInline && (r.m.Read(c-1+codeInstrStart, b[:]) != nil || binary.LittleEndian.Uint64(b[:]) != s) {
				continue
			}
			if r.m.Read(c-1+uint64(r.l.codeSizeOff), b[:4]) != nil {
				continue
			}
			if pc-s < uint64(binary.LittleEndian.Uint32(b[:4])) {
				return c, s
			}
		}
		if floor > 0 {
			return 0, 0
		}
		top = lo
	}
	return 0, 0
}

// readAbove reads into buf (which holds [from, top)) from the first page
// above from that is readable up to top, and returns that page; 0 when none
// is.
func (r *reader) readAbove(from, top uint64, buf []byte) uint64 {
	for p := (from + readStep) &^ (readStep - 1); p < top; p += readStep {
		if r.m.Read(p, buf[p-from:]) == nil {
			return p
		}
	}
	return 0
}

// Baseline (Sparkplug) code keeps, instead of source positions, the
// length of each bytecode's machine code in bytecode order (unsigned
// varints); the bytecodes' own lengths come from V8's kBytecodeSizes table
// (per operand scale: 1, 2 with the Wide prefix, 4 with ExtraWide).
const (
	maxBytecodeLen = 1 << 20
	prefixWide     = 0 // Bytecode::kWide, then kExtraWide, kDebugBreakWide, kDebugBreakExtraWide
	prefixCount    = 4
)

// baselineOffset is the bytecode offset the baseline code ran at PC
// offset pcOff, from its offset table and the bytecodes; -1 when the
// tables do not reach it.
func baselineOffset(table, bytecodes, sizes []byte, pcOff uint64) int64 {
	n := len(sizes) / 3
	if n == 0 {
		return -1
	}
	var end uint64
	i := 0
	next := func() (uint64, bool) {
		var v uint64
		for shift := uint(0); i < len(table) && shift < 64; shift += 7 {
			c := table[i]
			i++
			v |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	d, ok := next() // the prologue, before the first bytecode
	if !ok {
		return -1
	}
	end = d
	if pcOff <= end {
		return -1 // the function's entry
	}
	for off := 0; off < len(bytecodes); {
		b := int(bytecodes[off])
		scale, at := 0, off
		if b < prefixCount {
			scale = 1 + b%2 // Wide, ExtraWide (and their DebugBreak forms)
			at = off + 1
			rest := bytecodes[at:]
			if len(rest) == 0 {
				return -1
			}
			b = int(rest[0])
		}
		if b >= n {
			return -1
		}
		size := int(sizes[scale*n+b])
		if at > off {
			size++
		}
		if size <= 0 {
			return -1
		}
		d, ok := next()
		if !ok {
			return -1
		}
		end += d
		if pcOff <= end {
			return int64(off)
		}
		off += size
	}
	return -1
}

// codeKindBaseline is CodeKind::BASELINE (v8dbg_CodeKindBaseline).
const codeKindBaseline = 11

// baselineFrame names a frame of baseline code of the function sfi at
// PC offset off: the code's bytecode must be the SFI's.
func (r *reader) baselineFrame(code, sfi, off uint64, lines func(uint64) ([]int32, error)) (frame.Frame, bool) {
	var fr frame.Frame
	var b [24]byte
	if len(r.l.bytecodeSizes) == 0 || r.m.Read(code-1+codeInstrStart, b[:]) != nil ||
		int64(binary.LittleEndian.Uint32(b[r.l.codeFlagsOff-codeInstrStart:])&15) != r.l.kindBaseline {
		return fr, false
	}
	ba, err := r.word(code, r.l.codeBytecode)
	if err != nil || ba == 0 {
		return fr, false
	}
	if own, err := r.bytecodeOf(sfi); err != nil || own != ba {
		return fr, false
	}
	fi, err := r.function(sfi, lines)
	if err != nil || fi.spt == nil {
		return fr, false
	}
	table := r.positions(code, r.l.codePositions) // the bytecode offset table
	lw, err := r.word(ba, r.l.arrayLength)
	if err != nil || table == nil || !isSmi(lw) || smi(lw) <= 0 || smi(lw) > maxBytecodeLen {
		return fr, false
	}
	bytecodes := make([]byte, smi(lw))
	if r.m.Read(ba-1+uint64(r.l.bytecodeHeader), bytecodes) != nil {
		return fr, false
	}
	bo := baselineOffset(table, bytecodes, r.l.bytecodeSizes, off)
	fr = frame.Frame{Name: fi.name, File: fi.file, StartFile: fi.file}
	if bo >= 0 {
		if pos := sourcePosition(fi.spt, bo); pos >= 0 {
			fr.Line, fr.Column = lineCol(fi.lineEnds, pos)
		}
	}
	return fr, true
}
