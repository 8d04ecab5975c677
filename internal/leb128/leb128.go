// Package leb128 decodes the variable-length integers of DWARF and
// .eh_frame, bounded: a number is at most MaxLen bytes and fits 64 bits, so
// a hostile run of continuation bytes is an error at once, not a loop.
// Both the DWARF reader and the unwind-table builder decode through it.
package leb128

import "encoding/binary"

// MaxLen is the longest encoding of a 64-bit value.
const MaxLen = 10

// Uint decodes the unsigned number at the start of b and returns it with
// its length. n is 0 when b ends inside the number, and negative when the
// number runs past MaxLen bytes or past 64 bits. Unsigned LEB128 is Go's
// uvarint, so this is binary.Uvarint.
func Uint(b []byte) (v uint64, n int) { return binary.Uvarint(b) }

// Int decodes the signed number at the start of b, as Uint (n is -1 past
// the bounds). Go's varint is zigzag-encoded, not this.
func Int(b []byte) (v int64, n int) {
	var shift uint
	for i := range MaxLen {
		if i >= len(b) {
			return 0, 0
		}
		c := b[i]
		v |= int64(c&0x7f) << shift
		shift += 7
		if c < 0x80 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v, i + 1
		}
	}
	return 0, -1
}

// Next decodes the number at b[*off:] with dec (Uint or Int) and moves
// *off past it. ok is false when there is none: *off outside b, b ending
// inside the number, or the number past the bounds.
func Next[T uint64 | int64](b []byte, off *int, dec func([]byte) (T, int)) (v T, ok bool) {
	if *off < 0 || *off >= len(b) {
		return v, false
	}
	v, n := dec(b[*off:])
	if n <= 0 {
		return 0, false
	}
	*off += n
	return v, true
}

// AppendInt appends v as signed LEB128 (binary.AppendUvarint writes the
// unsigned form).
func AppendInt(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}
