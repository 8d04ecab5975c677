package symindex

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"

	"github.com/profsym/profsym/internal/frame"
)

// seedIndex is a small valid index: three ranges, one inlined chain.
func seedIndex(t testing.TB) []byte {
	w, err := NewWriter(Meta{BuildID: []byte{1, 2, 3, 4}, Flags: FlagInlines | FlagSymbolTable, ImageBase: 0x400000})
	if err != nil {
		t.Fatal(err)
	}
	w.Add(0x1000, []frame.Frame{
		{Name: "inner", File: "a.c", Line: 3, Column: 2, StartFile: "a.h", StartLine: 1, StartAddress: 0x1000},
		{Name: "outer", File: "a.c", Line: 9, StartAddress: 0xff0},
	})
	w.Add(0x1010, nil)
	w.Add(0x1020, []frame.Frame{{Name: "other", Discriminator: 4}})
	var b bytes.Buffer
	if _, err := w.Finish(0x1040, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// reseal gives forged bytes valid checksums, so the fuzzer reaches the
// structural checks and lookups rather than stopping at the CRCs.
func reseal(b []byte) []byte {
	if len(b) < headerSize {
		return b
	}
	le := binary.LittleEndian
	le.PutUint32(b[offBodyCRC:], crc32.Checksum(b[headerSize:], castagnoli))
	le.PutUint32(b[offHdrCRC:], crc32.Checksum(b[:offHdrCRC], castagnoli))
	return b
}

func TestRoundTrip(t *testing.T) {
	x, err := Parse(seedIndex(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pc    uint64
		names []string
	}{
		{0xfff, nil},
		{0x1000, []string{"inner", "outer"}},
		{0x100f, []string{"inner", "outer"}},
		{0x1010, nil},
		{0x1020, []string{"other"}},
		{0x103f, []string{"other"}},
		{0x1040, nil},
		{1 << 40, nil},
	} {
		fr, err := x.Lookup(tc.pc, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, f := range fr {
			got = append(got, f.Name)
		}
		if len(got) != len(tc.names) || len(got) > 0 && got[0] != tc.names[0] {
			t.Errorf("%#x: %v, want %v", tc.pc, got, tc.names)
		}
	}
	fr, _ := x.Lookup(0x1004, nil)
	if f := fr[0]; f.File != "a.c" || f.Line != 3 || f.Column != 2 || f.StartFile != "a.h" || f.StartLine != 1 || f.StartAddress != 0x1000 {
		t.Errorf("inner frame read back as %+v", f)
	}
	if m := x.Meta(); !bytes.Equal(m.BuildID, []byte{1, 2, 3, 4}) || m.ImageBase != 0x400000 {
		t.Errorf("meta %+v", m)
	}
}

// A name longer than MaxStringBytes is not cut (the answer would differ
// from the debug file's): the index is not written.
func TestLongNameRefused(t *testing.T) {
	w, _ := NewWriter(Meta{BuildID: []byte{1}})
	if err := w.Add(0x10, []frame.Frame{{Name: string(make([]byte, MaxStringBytes+1))}}); err == nil {
		t.Fatal("a name past MaxStringBytes was written")
	}
	if err := w.Add(0x20, make([]frame.Frame, MaxFrames+1)); err == nil {
		t.Fatal("a chain past MaxFrames was written")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(seedIndex(f), uint64(0x1004))
	f.Add(seedIndex(f)[:300], uint64(0x1020))
	f.Fuzz(func(t *testing.T, data []byte, pc uint64) {
		for _, b := range [][]byte{data, reseal(bytes.Clone(data))} {
			x, err := Parse(b)
			if err != nil {
				continue
			}
			for _, a := range []uint64{pc, x.h.base, x.h.base + 1, pc ^ x.h.base} {
				fr, err := x.Lookup(a, nil)
				if err == nil && len(fr) > MaxFrames {
					t.Fatalf("%d frames", len(fr))
				}
			}
		}
	})
}
