package dwarf

import (
	"encoding/binary"
	"fmt"

	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/leb128"
)

// errCorrupt is the one error value the hot decoding paths produce; callers
// add context once at the unit level instead of formatting per read.
var errCorrupt = fmt.Errorf("malformed DWARF: %w", frame.ErrCorruptFile)

func corruptf(format string, args ...any) error {
	return fmt.Errorf("malformed DWARF: "+format+": %w", append(args, frame.ErrCorruptFile)...)
}

// buf is a little-endian cursor over one section. A read past the end sets
// err and yields zeros, so loops need only check err once per record rather
// than after every field; every loop that consumes input advances off or
// stops on err, which is what guarantees termination on hostile input.
type buf struct {
	data []byte
	off  int
	err  error
}

func (b *buf) fail() {
	if b.err == nil {
		b.err = errCorrupt
	}
	b.off = len(b.data)
}

func (b *buf) left() int { return len(b.data) - b.off }

func (b *buf) skip(n uint64) {
	if n > uint64(b.left()) {
		b.fail()
		return
	}
	b.off += int(n)
}

func (b *buf) seek(off uint64) {
	if off > uint64(len(b.data)) {
		b.fail()
		return
	}
	b.off = int(off)
}

func (b *buf) u8() uint8 {
	if b.off >= len(b.data) {
		b.fail()
		return 0
	}
	v := b.data[b.off]
	b.off++
	return v
}

func (b *buf) u16() uint16 {
	if b.left() < 2 {
		b.fail()
		return 0
	}
	v := binary.LittleEndian.Uint16(b.data[b.off:])
	b.off += 2
	return v
}

func (b *buf) u24() uint32 {
	if b.left() < 3 {
		b.fail()
		return 0
	}
	d := b.data[b.off:]
	b.off += 3
	return uint32(d[0]) | uint32(d[1])<<8 | uint32(d[2])<<16
}

func (b *buf) u32() uint32 {
	if b.left() < 4 {
		b.fail()
		return 0
	}
	v := binary.LittleEndian.Uint32(b.data[b.off:])
	b.off += 4
	return v
}

func (b *buf) u64() uint64 {
	if b.left() < 8 {
		b.fail()
		return 0
	}
	v := binary.LittleEndian.Uint64(b.data[b.off:])
	b.off += 8
	return v
}

// uN reads an n-byte unsigned value (n is 1, 2, 4 or 8).
func (b *buf) uN(n int) uint64 {
	switch n {
	case 1:
		return uint64(b.u8())
	case 2:
		return uint64(b.u16())
	case 4:
		return uint64(b.u32())
	case 8:
		return b.u64()
	}
	b.fail()
	return 0
}

// uleb and sleb read LEB128 through the one bounded decoder (at most ten
// bytes, 64 bits); the fast path is the one-byte number most are.
func (b *buf) uleb() uint64 {
	if b.off < len(b.data) && b.data[b.off] < 0x80 {
		b.off++
		return uint64(b.data[b.off-1])
	}
	v, ok := leb128.Next(b.data, &b.off, leb128.Uint)
	if !ok {
		b.fail()
	}
	return v
}

func (b *buf) sleb() int64 {
	v, ok := leb128.Next(b.data, &b.off, leb128.Int)
	if !ok {
		b.fail()
	}
	return v
}

// skipLEB skips one LEB128 number without decoding it, of any length: an
// attribute the reader does not use may hold a constant wider than 64 bits.
func (b *buf) skipLEB() {
	for {
		if b.off >= len(b.data) {
			b.fail()
			return
		}
		c := b.data[b.off]
		b.off++
		if c&0x80 == 0 {
			return
		}
	}
}

// cstr returns the NUL-terminated string at the cursor, without the NUL.
func (b *buf) cstr() []byte {
	d := b.data[b.off:]
	for i, c := range d {
		if c == 0 {
			b.off += i + 1
			return d[:i:i]
		}
	}
	b.fail()
	return nil
}

// cstrAt returns the NUL-terminated string at off in sec, or ok=false.
func cstrAt(sec []byte, off uint64) ([]byte, bool) {
	if off >= uint64(len(sec)) {
		return nil, false
	}
	d := sec[off:]
	for i, c := range d {
		if c == 0 {
			return d[:i:i], true
		}
	}
	return nil, false
}

// unitLength reads an initial length field: it returns the length and the
// offset size (4 or 8) it implies.
func (b *buf) unitLength() (uint64, int) {
	l := uint64(b.u32())
	if l == 0xffffffff {
		return b.u64(), 8
	}
	if l >= 0xfffffff0 {
		b.fail()
		return 0, 4
	}
	return l, 4
}
