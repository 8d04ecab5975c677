package table

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

// uleb decodes an unsigned LEB128 of at most 10 bytes; longer encodings or
// bits beyond 64 are corruption, not something to loop over.
func (r *reader) uleb() uint64 {
	var v uint64
	for i := 0; i < 10; i++ {
		if r.off >= len(r.b) {
			r.fail()
			return 0
		}
		c := r.b[r.off]
		r.off++
		if i == 9 && c > 1 {
			r.fail()
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v
		}
	}
	r.fail()
	return 0
}

func (r *reader) sleb() int64 {
	var v int64
	var shift uint
	for i := 0; i < 10; i++ {
		if r.off >= len(r.b) {
			r.fail()
			return 0
		}
		c := r.b[r.off]
		r.off++
		v |= int64(c&0x7f) << shift
		shift += 7
		if c < 0x80 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
	r.fail()
	return 0
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
