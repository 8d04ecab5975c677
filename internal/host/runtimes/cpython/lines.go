package cpython

// Line tables, as each version writes them (CPython's
// Objects/lnotab_notes.txt and InternalDocs/code_objects.md describe
// them). Both walkers below read at most len(table) bytes and never index
// past it: the table comes from the process.

// lineOf returns the line of the instruction at instr (the frame's
// f_lasti up to 3.10, its code unit index from 3.11) in a code object
// whose first line is first, or 0 when the table has none for it. The
// instruction is a byte offset up to 3.10 and a code unit index after.
func lineOf(format lineFormat, table []byte, first int32, instr int32) uint32 {
	var l int32
	switch format {
	case linesLnotab:
		l = lnotabLine(table, first, instr)
	case linesTable310:
		l = table310Line(table, first, instr)
	case linesLocations:
		l = locationLine(table, first, instr)
	}
	if l <= 0 {
		return 0
	}
	return uint32(l)
}

// lnotabLine walks 3.9's co_lnotab: pairs of (bytecode offset increment,
// signed line increment), starting at offset 0 and the first line.
func lnotabLine(table []byte, first, lasti int32) int32 {
	line, addr := first, int32(0)
	for i := 0; i+1 < len(table); i += 2 {
		addr += int32(table[i])
		if addr > lasti {
			break
		}
		line += int32(int8(table[i+1]))
	}
	return line
}

// table310Line walks 3.10's co_linetable: pairs of (bytecode bytes the
// range covers, signed line increment; -128: the range has no line).
// Empty ranges still move the line.
func table310Line(table []byte, first, offset int32) int32 {
	line, end := first, int32(0)
	for i := 0; i+1 < len(table); i += 2 {
		end += int32(table[i])
		cur := int32(-1)
		if d := int8(table[i+1]); d != -128 {
			line += int32(d)
			cur = line
		}
		if offset < end {
			return cur
		}
	}
	return 0
}

// locationLine walks 3.11+'s location table: entries of a first byte
// 1ccccnnn (code c, n+1 code units) and varint operands. Codes 0-9: same
// line (short form); 10-12: line + c-10 (one-line form); 13: signed
// varint line delta, no columns; 14: signed varint line delta, then end
// line, column and end column varints; 15: no location.
func locationLine(table []byte, first, instr int32) int32 {
	line, addr := first, int32(0)
	if instr < 0 {
		instr = 0 // before the first instruction (3.11's prev_instr at start)
	}
	for i := 0; i < len(table); {
		b := table[i]
		if b&0x80 == 0 {
			return 0 // not at an entry's first byte: corrupt
		}
		i++
		code := b >> 3 & 15
		n := int32(b&7) + 1
		var delta int32
		hasLine := true
		switch {
		case code < 10:
			i++ // column byte
		case code <= 12:
			delta = int32(code) - 10
			i += 2
		case code == 13:
			delta, i = svarint(table, i)
		case code == 14:
			delta, i = svarint(table, i)
			for range 3 {
				_, i = varint(table, i)
			}
		default:
			hasLine = false
		}
		line += delta
		if instr < addr+n {
			if !hasLine {
				return 0
			}
			return line
		}
		addr += n
	}
	return 0
}

// varint reads an unsigned varint of 6-bit chunks, low first, bit 6 set
// on all but the last.
func varint(b []byte, i int) (int32, int) {
	var v uint32
	for shift := 0; i < len(b) && shift < 32; shift += 6 {
		c := b[i]
		if c&0x80 != 0 {
			return int32(v), i // the next entry starts here: corrupt, stop
		}
		i++
		v |= uint32(c&63) << shift
		if c&64 == 0 {
			break
		}
	}
	return int32(v), i
}

// svarint reads a varint whose low bit is the sign.
func svarint(b []byte, i int) (int32, int) {
	v, i := varint(b, i)
	u := uint32(v)
	if u&1 != 0 {
		return -int32(u >> 1), i
	}
	return int32(u >> 1), i
}
