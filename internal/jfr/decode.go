package jfr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrTruncated is wrapped by every error about input that ends early.
var ErrTruncated = errors.New("truncated")

// ErrCorrupt is wrapped by every error about input that is not valid JFR:
// a wrong magic, an impossible size, a reference out of bounds.
var ErrCorrupt = errors.New("corrupt")

// ErrLimit is wrapped by every error about input that exceeds a configured
// limit (Limits).
var ErrLimit = errors.New("limit exceeded")

// decoder reads JFR primitives from one chunk's bytes. Errors are sticky:
// after the first one every read returns zero, so hot loops check d.err
// once per record rather than after each field.
type decoder struct {
	b          []byte
	pos        int
	compressed bool // integers are LEB128-style varints (chunk flag bit 0)
	err        error
	lim        *Limits
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) truncated(what string) {
	d.fail(fmt.Errorf("%s at offset %d: %w", what, d.pos, ErrTruncated))
}

func (d *decoder) corrupt(format string, args ...any) {
	d.fail(fmt.Errorf("offset %d: %s: %w", d.pos, fmt.Sprintf(format, args...), ErrCorrupt))
}

func (d *decoder) remaining() int { return len(d.b) - d.pos }

func (d *decoder) u8() byte {
	if d.pos >= len(d.b) {
		d.truncated("byte")
		return 0
	}
	c := d.b[d.pos]
	d.pos++
	return c
}

// varint reads JFR's variable-length integer: seven bits per byte, low
// bits first, at most nine bytes (the ninth carries eight bits).
func (d *decoder) varint() uint64 {
	b := d.b
	p := d.pos
	var v uint64
	for i := 0; i < 8; i++ {
		if p >= len(b) {
			d.pos = p
			d.truncated("varint")
			return 0
		}
		c := b[p]
		p++
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			d.pos = p
			return v
		}
	}
	if p >= len(b) {
		d.pos = p
		d.truncated("varint")
		return 0
	}
	v |= uint64(b[p]) << 56
	d.pos = p + 1
	return v
}

func (d *decoder) fixed(n int) uint64 {
	if d.remaining() < n {
		d.truncated("integer")
		return 0
	}
	var v uint64
	switch n {
	case 2:
		v = uint64(binary.BigEndian.Uint16(d.b[d.pos:]))
	case 4:
		v = uint64(binary.BigEndian.Uint32(d.b[d.pos:]))
	case 8:
		v = binary.BigEndian.Uint64(d.b[d.pos:])
	}
	d.pos += n
	return v
}

func (d *decoder) i16() uint64 {
	if d.compressed {
		return d.varint()
	}
	return d.fixed(2)
}

func (d *decoder) i32() uint64 {
	if d.compressed {
		return d.varint()
	}
	return d.fixed(4)
}

func (d *decoder) i64() uint64 {
	if d.compressed {
		return d.varint()
	}
	return d.fixed(8)
}

// length reads a count (of bytes, elements or entries) and checks it
// against what is left, given the least number of bytes one element can
// take, and against max.
func (d *decoder) length(what string, minElem, max int) int {
	v := d.i32()
	if d.err != nil {
		return 0
	}
	if v > uint64(max) {
		d.fail(fmt.Errorf("offset %d: %s count %d over the limit %d: %w", d.pos, what, v, max, ErrLimit))
		return 0
	}
	n := int(v)
	if minElem > 0 && n > d.remaining()/minElem {
		d.fail(fmt.Errorf("offset %d: %s count %d but only %d bytes left: %w", d.pos, what, n, d.remaining(), ErrTruncated))
		return 0
	}
	return n
}

// Encodings of a string value.
const (
	strNull    = 0
	strEmpty   = 1
	strPool    = 2
	strUTF8    = 3
	strChars   = 4
	strLatin1  = 5
	maxStrKind = 5
)

// str is a decoded string: a literal, or a reference into the chunk's
// java.lang.String constant pool.
type str struct {
	s     string
	ref   int64
	isRef bool
}

func (d *decoder) str() str {
	kind := d.u8()
	switch kind {
	case strNull, strEmpty:
		return str{}
	case strPool:
		return str{ref: int64(d.i64()), isRef: true}
	case strUTF8, strLatin1:
		n := d.length("string", 1, d.lim.MaxStringLen)
		if d.err != nil {
			return str{}
		}
		b := d.b[d.pos : d.pos+n]
		d.pos += n
		if kind == strLatin1 {
			return str{s: latin1(b)}
		}
		if !utf8.Valid(b) {
			return str{s: string([]rune(string(b)))} // invalid bytes become U+FFFD
		}
		return str{s: string(b)}
	case strChars:
		n := d.length("string", 1, d.lim.MaxStringLen)
		if d.err != nil {
			return str{}
		}
		u := make([]uint16, n)
		for i := range u {
			u[i] = uint16(d.i16())
		}
		return str{s: string(utf16.Decode(u))}
	default:
		d.corrupt("string encoding %d", kind)
		return str{}
	}
}

// skipStr skips a string value without allocating.
func (d *decoder) skipStr() {
	kind := d.u8()
	switch kind {
	case strNull, strEmpty:
	case strPool:
		d.i64()
	case strUTF8, strLatin1:
		n := d.length("string", 1, d.lim.MaxStringLen)
		d.pos += n
	case strChars:
		n := d.length("string", 1, d.lim.MaxStringLen)
		for i := 0; i < n && d.err == nil; i++ {
			d.i16()
		}
	default:
		d.corrupt("string encoding %d", kind)
	}
}

func latin1(b []byte) string {
	ascii := true
	for _, c := range b {
		if c >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return string(b)
	}
	r := make([]rune, len(b))
	for i, c := range b {
		r[i] = rune(c)
	}
	return string(r)
}

func f32(v uint64) float64 { return float64(math.Float32frombits(uint32(v))) }
func f64(v uint64) float64 { return math.Float64frombits(v) }
