package leb128

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, u := range []uint64{0, 1, 127, 128, 624485, 1 << 35, math.MaxUint64 - 1, math.MaxUint64} {
		enc := binary.AppendUvarint(nil, u)
		if v, n := Uint(append(enc, 0xff)); v != u || n != len(enc) {
			t.Errorf("Uint(%x) = %d, %d; want %d, %d", enc, v, n, u, len(enc))
		}
	}
	for _, s := range []int64{0, 1, -1, 63, 64, -64, -65, -123456, math.MaxInt64, math.MinInt64} {
		enc := AppendInt(nil, s)
		if v, n := Int(append(enc, 0xff)); v != s || n != len(enc) {
			t.Errorf("Int(%x) = %d, %d; want %d, %d", enc, v, n, s, len(enc))
		}
	}
	b := binary.AppendUvarint(AppendInt(nil, -2), 300)
	off := 0
	if v, ok := Next(b, &off, Int); !ok || v != -2 || off != 1 {
		t.Errorf("Next(Int) = %d, %v at %d", v, ok, off)
	}
	if v, ok := Next(b, &off, Uint); !ok || v != 300 || off != 3 {
		t.Errorf("Next(Uint) = %d, %v at %d", v, ok, off)
	}
	if _, ok := Next(b, &off, Uint); ok || off != 3 {
		t.Errorf("Next at the end: ok %v at %d", ok, off)
	}
}

func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		n    int
	}{
		{"empty", nil, 0},
		{"truncated", []byte{0x80, 0x80}, 0},
		{"padded to ten bytes", []byte{0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 10},
		{"eleven bytes", []byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, -1},
		{"bits past 64", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, -1},
	} {
		if _, n := Uint(tc.in); n != tc.n && (n >= 0 || tc.n >= 0) {
			t.Errorf("Uint %s: n = %d, want %d", tc.name, n, tc.n)
		}
	}
	if _, n := Int([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}); n != -1 {
		t.Errorf("Int of eleven bytes: n = %d, want -1", n)
	}
}

// FuzzInt: Int reads exactly the bytes Uint reads (the lengths of the two
// forms agree), never more than MaxLen, and what it reads round-trips.
func FuzzInt(f *testing.F) {
	f.Add([]byte{0xc0, 0xbb, 0x78})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, n := Int(b)
		if n > MaxLen || n > len(b) {
			t.Fatalf("n = %d of %d bytes", n, len(b))
		}
		if n > 0 {
			if _, m := Uint(b); m > 0 && m != n {
				t.Fatalf("Int read %d bytes, Uint %d", n, m)
			}
			if w, m := Int(AppendInt(nil, v)); w != v || m <= 0 {
				t.Fatalf("%d does not round-trip: %d, %d", v, w, m)
			}
		}
	})
}
