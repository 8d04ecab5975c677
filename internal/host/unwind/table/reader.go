package table

import "github.com/profsym/profsym/internal/leb128"

// reader decodes little- or big-endian values from a byte slice. Every read
// is bounds-checked; the first failure sets bad and every later read
// returns zero, so callers check once after a group of reads.
type reader struct {
	b   []byte
	off int
	big bool
	bad bool
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) fail() { r.bad, r.off = true, len(r.b) }

func (r *reader) u8() uint8 {
	if r.off >= len(r.b) {
		r.fail()
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) take(n int) []byte {
	if n < 0 || n > r.left() {
		r.fail()
		return nil
	}
	s := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return s
}

func (r *reader) u16() uint16 {
	s := r.take(2)
	if s == nil {
		return 0
	}
	if r.big {
		return uint16(s[0])<<8 | uint16(s[1])
	}
	return uint16(s[1])<<8 | uint16(s[0])
}

func (r *reader) u32() uint32 {
	s := r.take(4)
	if s == nil {
		return 0
	}
	if r.big {
		return uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3])
	}
	return uint32(s[3])<<24 | uint32(s[2])<<16 | uint32(s[1])<<8 | uint32(s[0])
}

func (r *reader) u64() uint64 {
	s := r.take(8)
	if s == nil {
		return 0
	}
	var v uint64
	if r.big {
		for _, c := range s {
			v = v<<8 | uint64(c)
		}
		return v
	}
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(s[i])
	}
	return v
}

// uleb and sleb decode LEB128 of at most 10 bytes and 64 bits (package
// leb128); longer encodings are corruption, not something to loop over.
func (r *reader) uleb() uint64 {
	v, ok := leb128.Next(r.b, &r.off, leb128.Uint)
	if !ok {
		r.fail()
	}
	return v
}

func (r *reader) sleb() int64 {
	v, ok := leb128.Next(r.b, &r.off, leb128.Int)
	if !ok {
		r.fail()
	}
	return v
}

// cstring returns the bytes up to a NUL, at most max of them.
func (r *reader) cstring(max int) []byte {
	for i := r.off; i < len(r.b) && i-r.off <= max; i++ {
		if r.b[i] == 0 {
			s := r.b[r.off:i]
			r.off = i + 1
			return s
		}
	}
	r.fail()
	return nil
}
