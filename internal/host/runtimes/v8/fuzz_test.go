package v8

import (
	"encoding/binary"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
)

func inspectPath(t *testing.T, path string) *fileInfo {
	t.Helper()
	f, err := elfx.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return inspect(f)
}

// FuzzSourcePosition: any table, any offset: no panic, a position in range.
func FuzzSourcePosition(f *testing.F) {
	f.Add(table([2]int64{0, 9}, [2]int64{4, 23}), int64(5))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, int64(0))
	f.Fuzz(func(t *testing.T, spt []byte, off int64) {
		pos := sourcePosition(spt, off)
		if pos < -1 || pos >= 1<<30 {
			t.Fatalf("position %d", pos)
		}
		lineCol([]int32{3, 10, 20}, pos)
	})
}

// FuzzReader: a heap of arbitrary bytes read as functions, strings and
// scripts: no panic, names within bounds.
func FuzzReader(f *testing.F) {
	h := newHeap(f)
	sfi, _ := h.function("leaf", 1, "/a.js", "x\ny\n", table([2]int64{0, 1}))
	f.Add(h.m.b[:h.next-heapBase], sfi-heapBase)
	f.Fuzz(func(t *testing.T, b []byte, at uint64) {
		l, _ := newLayout(hostConsts())
		m := &fakeMem{base: heapBase, b: b}
		r := &reader{m: m, l: &l, max: 64}
		obj := heapBase + at
		fi, err := r.function(obj, r.lineEnds)
		if err == nil && (len(fi.name) > 64 || len(fi.file) > 64) {
			t.Fatalf("name of %d, file of %d bytes", len(fi.name), len(fi.file))
		}
		if s, err := r.str(obj); err == nil && len(s) > 64 {
			t.Fatalf("string of %d bytes", len(s))
		}
		if len(b) >= 8 {
			r.lineEnds(heapBase + uint64(binary.LittleEndian.Uint32(b))%uint64(len(b)))
		}
	})
}

// FuzzBaselineOffset: any tables: no panic, an offset inside the bytecode.
func FuzzBaselineOffset(f *testing.F) {
	f.Add([]byte{10, 4, 6, 2, 8}, []byte{4, 0, 5, 0, 0, 0, 4, 0, 0, 5, 0, 0}, uint64(21))
	sizes := []byte{1, 1, 1, 1, 2, 3, 1, 1, 1, 1, 3, 5, 1, 1, 1, 1, 5, 9}
	f.Fuzz(func(t *testing.T, table, bytecodes []byte, pc uint64) {
		if off := baselineOffset(table, bytecodes, sizes, pc); off < -1 || off >= int64(len(bytecodes)) {
			t.Fatalf("offset %d of %d bytes", off, len(bytecodes))
		}
		baselineOffset(table, bytecodes, nil, pc)
	})
}
