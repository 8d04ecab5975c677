package hotspot

import (
	"testing"
)

func TestUnsigned5(t *testing.T) {
	for _, x := range []byte{0, 1} {
		for _, v := range []uint32{0, 1, 190, 191, 192, 193, 255, 256, 4095, 12345, 1 << 20, 1<<31 - 1, 1 << 31, 1<<32 - 1} {
			b := u5(x, v)
			if x == 1 {
				for _, c := range b {
					if c == 0 {
						t.Fatalf("X=1 encoding of %d has a zero byte: %x", v, b)
					}
				}
			}
			s := stream{b: b, x: x}
			got, err := s.uint()
			if err != nil || got != v || s.pos != len(b) {
				t.Errorf("x=%d %d: encoded %x, decoded %d (%v) after %d bytes", x, v, b, got, err, s.pos)
			}
		}
		for _, v := range []int32{0, 1, -1, 63, -64, 1 << 20, -1 << 20} {
			s := stream{b: u5s(x, v), x: x}
			if got, err := s.signed(); err != nil || got != v {
				t.Errorf("x=%d signed %d: %d, %v", x, v, got, err)
			}
		}
	}
	// Truncated, and excluded bytes.
	for _, b := range [][]byte{{0xc0}, {0xff, 0xff}, {}} {
		s := stream{b: b}
		if _, err := s.uint(); err == nil {
			t.Errorf("%x decoded", b)
		}
	}
	s := stream{b: []byte{0}, x: 1}
	if _, err := s.uint(); err == nil {
		t.Error("zero byte decoded with X=1")
	}
}

func TestLineFor(t *testing.T) {
	for _, x := range []byte{0, 1} {
		// Out of order, a line going back, a long bci jump (escape).
		table := lineTable(x, [2]int{0, 10}, [2]int{4, 12}, [2]int{9, 11}, [2]int{300, 40}, [2]int{302, 7})
		for bci, want := range map[int]int{0: 10, 3: 10, 4: 12, 8: 12, 9: 11, 299: 11, 300: 40, 301: 40, 302: 7, 5000: 7} {
			if got := lineFor(table, x, bci); got != want {
				t.Errorf("x=%d bci %d: line %d, want %d", x, bci, got, want)
			}
		}
		if n := lineTableEnd(append(table, 1, 2, 3), x); n != len(table) {
			t.Errorf("x=%d: table of %d bytes ends at %d", x, len(table), n)
		}
		if n := lineTableEnd(table[:len(table)-1], x); n != -1 {
			t.Errorf("x=%d: unterminated table ends at %d", x, n)
		}
	}
}

func FuzzLineTable(f *testing.F) {
	f.Add(lineTable(0, [2]int{0, 10}, [2]int{300, 40}), byte(0), 5)
	f.Add(lineTable(1, [2]int{0, 10}, [2]int{300, 7}), byte(1), 301)
	f.Fuzz(func(t *testing.T, b []byte, x byte, bci int) {
		lineFor(b, x&1, bci)
		if n := lineTableEnd(b, x&1); n > len(b) {
			t.Fatalf("end %d past %d bytes", n, len(b))
		}
	})
}
