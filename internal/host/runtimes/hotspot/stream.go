package hotspot

import "errors"

// HotSpot compresses line number tables and debug information (scope
// descriptors) with UNSIGNED5, the Pack200 variable-length encoding
// (compressedStream.hpp, unsigned5.hpp): one to five bytes per 32-bit
// value, six payload bits in every byte but the last of a value. From JDK
// 20 every byte is offset by one so that none is zero (X = 1).

var errStream = errors.New("malformed compressed stream")

// stream reads UNSIGNED5 values from a byte slice.
type stream struct {
	b   []byte
	pos int
	x   byte // excluded low bytes: 0 before JDK 20, 1 from JDK 20
}

const (
	u5H = 64 // continuation bytes carry lg(H) = 6 bits
)

// uint reads one value.
func (s *stream) uint() (uint32, error) {
	l := byte(256 - int(s.x) - u5H) // bytes below L + X end a value
	var sum uint32
	shift := uint(0)
	for i := 0; i < 5; i++ {
		if s.pos >= len(s.b) {
			return 0, errStream
		}
		c := s.b[s.pos]
		s.pos++
		if c < s.x {
			return 0, errStream
		}
		c -= s.x
		sum += uint32(c) << shift
		if c < l || i == 4 {
			return sum, nil
		}
		shift += 6
	}
	return sum, nil
}

// signed reads a zigzag-encoded value.
func (s *stream) signed() (int32, error) {
	v, err := s.uint()
	return int32(v>>1) ^ -int32(v&1), err
}

// Line number tables (CompressedLineNumberReadStream): per entry one
// byte, bci delta in its high five bits and line delta in its low three;
// 0xff escapes to two signed values; 0 ends the table.

// maxLineEntries bounds the entries decoded from one table (a method has
// at most 65,535 bytecodes; real tables have tens of entries).
const maxLineEntries = 1 << 16

// lineFor returns the line of bci as HotSpot's Method::line_from_bci
// does: the entry for that bci, else the one with the largest bci below
// it; 0 when there is none.
func lineFor(table []byte, x byte, bci int) int {
	s := stream{b: table, x: x}
	bestBCI, bestLine := 0, 0
	curBCI, curLine := 0, 0
	for n := 0; n < maxLineEntries && s.pos < len(s.b); n++ {
		c := s.b[s.pos]
		s.pos++
		switch c {
		case 0:
			return bestLine
		case 0xff:
			db, err := s.signed()
			if err != nil {
				return bestLine
			}
			dl, err := s.signed()
			if err != nil {
				return bestLine
			}
			curBCI += int(db)
			curLine += int(dl)
		default:
			curBCI += int(c >> 3)
			curLine += int(c & 7)
		}
		if curBCI == bci {
			return max(curLine, 0)
		}
		if curBCI < bci && curBCI >= bestBCI {
			bestBCI, bestLine = curBCI, max(curLine, 0)
		}
	}
	return bestLine
}

// lineTableEnd returns the length of the table at the start of b, or -1
// when b holds no complete table.
func lineTableEnd(b []byte, x byte) int {
	s := stream{b: b, x: x}
	for n := 0; n < maxLineEntries && s.pos < len(s.b); n++ {
		c := s.b[s.pos]
		s.pos++
		switch c {
		case 0:
			return s.pos
		case 0xff:
			if _, err := s.signed(); err != nil {
				return -1
			}
			if _, err := s.signed(); err != nil {
				return -1
			}
		}
	}
	return -1
}
