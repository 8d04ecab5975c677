package hotspot

import (
	"encoding/binary"
	"testing"

	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// FuzzTables parses tables out of forged process memory: the real tables
// of JDK 8, 11, 17, 21, 25 or 27 (as buildImage lays them out, the variables that
// describe them first) with patches applied, each 12 bytes: where (a
// 32-bit offset into the image) and what (a 64-bit value) to write. Small
// inputs keep the fuzzer fast; the patches reach every table, name and
// variable.
func FuzzTables(f *testing.F) {
	images := map[int][]byte{}
	for _, v := range []int{8, 11, 17, 21, 25, 27} {
		images[v] = buildImage(readDump(f, v), v).a.m.b
	}
	syms := tableSyms{}
	for i, n := range tableSymbols {
		syms[n] = uint64(8 * i)
	}
	patch := func(off uint32, v uint64) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, off), v)
	}
	f.Add(uint8(17), []byte{})
	f.Add(uint8(8), []byte{})
	f.Add(uint8(25), []byte{})
	f.Add(uint8(11), patch(8, 0))         // a stride of zero
	f.Add(uint8(21), patch(0, imageBase)) // the structs at the variables
	f.Add(uint8(17), patch(24, 1<<63))    // a column past the stride
	f.Add(uint8(17), append(patch(200, ^uint64(0)), patch(400, imageBase+1)...))
	f.Fuzz(func(t *testing.T, version uint8, patches []byte) {
		img, ok := images[int(version)]
		if !ok {
			return
		}
		b := append([]byte(nil), img...)
		for ; len(patches) >= 12; patches = patches[12:] {
			off := int(binary.LittleEndian.Uint32(patches) % uint32(len(b)-7))
			copy(b[off:], patches[4:12])
		}
		m := &fakeMem{base: imageBase, b: b}
		tb, err := readTables(m, syms, imageBase, wantTypes)
		if err == nil {
			newLayout(tb, []elfx.Segment{{Memsz: uint64(len(b)), Filesz: uint64(len(b))}}, imageBase, m)
		}
		if m.bytes > maxTableBytes+2*pageSize {
			t.Fatalf("read %d bytes", m.bytes)
		}
	})
}

// FuzzNames names frames in forged process memory: a method, an nmethod
// with inlined scopes and a stub, built as HotSpot lays them out with the
// JDK 17 layout, with patches applied as in FuzzTables; the frame's
// pointer is an offset into that image.
func FuzzNames(f *testing.F) {
	j := newFakeJVM()
	hot := j.method("fixture/Chain", "Chain.java", "hot", 40, [2]int{0, 17}, [2]int{12, 19})
	a := j.method("fixture/Chain", "Chain.java", "a", 22, [2]int{0, 30}, [2]int{13, 33})
	nm := j.nmethod(a, 7, []scope{{method: a, bci: 14, caller: -1}, {method: hot, bci: 12, caller: 0}}, map[int32]int{0x10: 0, 0x40: 1})
	blob := j.alloc(512)
	j.u64(blob+j.l.blobName, j.cstring("StubRoutines (1)"))
	j.u64(blob+j.l.blobCodeBegin, blob+256)
	img := j.m.b[:j.top-j.m.base]
	cm, _ := j.m.U64(hot + j.l.methodConst)
	f.Add([]byte{}, KindInterpreted, uint32(hot-j.m.base), 12|((cm>>3)&0xffffffff)<<32)
	f.Add([]byte{}, KindCompiled, uint32(nm-j.m.base), uint64(0x30|pcLeaf)|7<<32)
	f.Add([]byte{}, KindStub, uint32(blob-j.m.base), uint64(0x10))
	data, _ := j.m.U64(nm + j.l.nmScopesData)
	f.Add(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, uint32(data-j.m.base)), 0x0101010101010101),
		KindCompiled, uint32(nm-j.m.base), uint64(0x40)|7<<32)
	f.Fuzz(func(t *testing.T, patches []byte, kind uint8, ptr uint32, aux uint64) {
		b := append([]byte(nil), img...)
		for ; len(patches) >= 12; patches = patches[12:] {
			off := int(binary.LittleEndian.Uint32(patches) % uint32(len(b)-7))
			copy(b[off:], patches[4:12])
		}
		m := &fakeMem{base: j.m.base, b: b}
		r := New(runtimes.Config{MaxNameBytes: 256}, nopMap{}, nil, nil)
		r.procs[1] = attached(&proc{pid: 1, mem: m, l: jdk17(), codeLo: m.base, codeHi: m.base + uint64(len(b))})
		for i := 0; i < 2; i++ { // the second time through the caches
			sym, err := r.Name(1, runtimes.Frame{Kind: kind % 4, Ptr: m.base + uint64(ptr), Aux: aux})
			if err == nil && len(sym.Frames) == 0 {
				t.Fatal("named with no frames")
			}
			for _, fr := range sym.Frames {
				if len(fr.Name) > 256 || len(fr.File) > 256 {
					t.Fatalf("name of %d bytes, bound 256", len(fr.Name))
				}
			}
		}
		if m.bytes > 8<<20 {
			t.Fatalf("read %d bytes naming one frame", m.bytes)
		}
	})
}
