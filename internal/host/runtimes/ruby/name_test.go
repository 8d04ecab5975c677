package ruby

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/host/normalize"
	"github.com/profsym/profsym/internal/host/runtimes"
)

// fakeMem is a process memory of one region at base: reads outside fail.
type fakeMem struct {
	base uint64
	b    []byte
}

func (m *fakeMem) Read(addr uint64, p []byte) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(p)) > uint64(len(m.b))-(addr-m.base) {
		return runtimes.ErrBadFrame
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

func (m *fakeMem) U64(addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.Read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

const (
	memBase = 0x10000
	// Where seedMem puts things (offsets from memBase).
	offIseq     = 0x000 // Chain#mid's iseq
	offBody     = 0x040
	offBlock    = 0x200 // "block in mid"'s iseq
	offBlockBdy = 0x240
	offMe       = 0x400 // Chain#mid's method entry
	offClass    = 0x480 // Chain (its ext follows in 3.3)
	offIvTbl    = 0x600 // 3.1: the class's iv_tbl, entries, ext
	offEntries  = 0x640
	offExt      = 0x680
	offStrMid   = 0x700
	offStrBlk   = 0x740
	offStrFile  = 0x780
	offStrCls   = 0x7c0
	offLines    = 0x800 // line table: 3 entries
	offSucc     = 0x840 // succinct index (immediate part)
	offMeS      = 0x880 // Chain.build's method entry
	offMeta     = 0x8c0 // Chain's singleton class (3.3: ext follows)
	offMetaTbl  = 0x980 // 3.1: its iv_tbl, entries, ext
	offMetaEnts = 0x9c0
	offMetaExt  = 0x9e0
	memSize     = 0xa00
)

// seedMem lays out a process of layout l (3.1 or 3.3) with Chain#mid and
// the block in it: mid's line table says instructions 0-1 are on line 10,
// 2-4 on 11, 5- on 12.
func seedMem(l *layout) []byte {
	b := make([]byte, memSize)
	put := func(off, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }
	put32 := func(off uint64, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
	str := func(off uint64, s string) {
		if l.strEmbedLenInFlags {
			put(off, tString|uint64(len(s))<<14)
		} else {
			put(off, tString)
			put(off+16, uint64(len(s)))
		}
		copy(b[off+uint64(l.strEmbed):], s)
	}
	str(offStrMid, "mid")
	str(offStrBlk, "block in mid")
	str(offStrFile, "/app/chain.rb")
	str(offStrCls, "Chain")
	iseq := func(off, body uint64, typ uint32, label uint64) {
		put(off, tImemo|imemoIseq<<imemoShift)
		put(off+uint64(l.iseqBody), memBase+body)
		put32(body+uint64(l.bodyType), typ)
		put32(body+uint64(l.bodySize), 8)
		loc := body + uint64(l.bodyLocation)
		put(loc, memBase+offStrFile)
		put(loc+8, memBase+offStrMid)
		put(loc+16, memBase+label)
		put(loc+24, 9<<1|1)
		put(body+uint64(l.bodyInsnInfo), memBase+offLines)
		put32(body+uint64(l.bodyInsnSize), 3)
		put(body+uint64(l.bodySucc), memBase+offSucc)
	}
	iseq(offIseq, offBody, iseqMethod, offStrMid)
	iseq(offBlock, offBlockBdy, iseqBlock, offStrBlk)
	for i, line := range []uint32{10, 11, 12} {
		put32(offLines+uint64(i)*uint64(l.insnEntry), line)
	}
	// Ranks of instructions 0-8 (7 bits each): entries start at 0, 2, 5.
	var imm uint64
	for x, r := range []uint64{1, 1, 2, 2, 2, 3, 3, 3, 3} {
		imm |= r << (7 * x)
	}
	put(offSucc, imm)
	put(offMe, tImemo|imemoMent<<imemoShift)
	put(offMe+uint64(l.meOwner), memBase+offClass)
	put(offClass, tClass)
	if l.classExtInline {
		put(offClass+uint64(l.classExt)+uint64(l.extClasspath), memBase+offStrCls)
	} else {
		put(offClass+uint64(l.classExt), memBase+offExt)
		put(offExt+uint64(l.extIvTbl), memBase+offIvTbl)
		put(offIvTbl+40, 1) // entries_bound
		put(offIvTbl+48, memBase+offEntries)
		put(offEntries+16, memBase+offStrCls)
	}
	// Chain.build: a method of Chain's singleton class.
	put(offMeS, tImemo|imemoMent<<imemoShift)
	put(offMeS+uint64(l.meOwner), memBase+offMeta)
	put(offMeta, tClass|flSingleton)
	if l.classExtInline {
		put(offMeta+uint64(l.classExt)+uint64(l.extAttached), memBase+offClass)
	} else {
		put(offMeta+uint64(l.classExt), memBase+offMetaExt)
		put(offMetaExt+uint64(l.extIvTbl), memBase+offMetaTbl)
		put(offMetaTbl+40, 1)
		put(offMetaTbl+48, memBase+offMetaEnts)
		put(offMetaEnts+16, memBase+offClass)
	}
	return b
}

func mustLayout(t testing.TB, major, minor int) layout {
	t.Helper()
	l, err := layoutFor(major, minor)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.check(); err != nil {
		t.Fatal(err)
	}
	return l
}

func aux(me, idx uint64) uint64 { return me | idx<<idxShift }

func TestReadIseq(t *testing.T) {
	for _, v := range [][2]int{{3, 1}, {3, 3}} {
		l := mustLayout(t, v[0], v[1])
		m := &fakeMem{base: memBase, b: seedMem(&l)}
		for _, c := range []struct {
			iseq, aux uint64
			name      string
			line      uint32
		}{
			{memBase + offIseq, aux(memBase+offMe, 1), "Chain#mid", 10},
			{memBase + offIseq, aux(memBase+offMe, 3), "Chain#mid", 11},
			{memBase + offIseq, aux(memBase+offMe, 7), "Chain#mid", 12},
			{memBase + offBlock, aux(memBase+offMe, 0), "block in Chain#mid", 10},
			{memBase + offIseq, aux(memBase+offMeS, 1), "Chain.mid", 10},
			{memBase + offIseq, aux(0, 2), "mid", 10},                           // no method entry: the label alone
			{memBase + offIseq, aux(memBase+offBlock, 2), "mid", 10},            // an entry that is no entry: likewise
			{memBase + offIseq, aux(memBase+offMe, idxUnknown), "Chain#mid", 0}, // no line
		} {
			fi, err := readIseq(m, &l, c.iseq, c.aux, 64)
			if err != nil {
				t.Fatalf("%v %#x: %v", v, c.aux, err)
			}
			if fi.name != c.name || fi.file != "/app/chain.rb" || fi.line != c.line || fi.first != 9 {
				t.Errorf("%v %#x: %+v, want %s line %d", v, c.aux, fi, c.name, c.line)
			}
		}
	}
}

func TestReadIseqHostile(t *testing.T) {
	l := mustLayout(t, 3, 3)
	for _, c := range []struct {
		name   string
		forge  func(b []byte)
		iseq   uint64
		aux    uint64
		bad    bool // ErrBadFrame
		okName string
	}{
		{name: "freed iseq", forge: func(b []byte) { binary.LittleEndian.PutUint64(b[offIseq:], 0x8) }, iseq: memBase + offIseq, bad: true},
		{name: "pc past the iseq", forge: func([]byte) {}, iseq: memBase + offIseq, aux: aux(0, 8), bad: true},
		{name: "label no string", forge: func(b []byte) { binary.LittleEndian.PutUint64(b[offStrBlk:], tArray) }, iseq: memBase + offBlock, bad: true},
		{name: "wild iseq", forge: func([]byte) {}, iseq: 0xdead0000, aux: 0},
		{name: "4 GiB name", forge: func(b []byte) {
			binary.LittleEndian.PutUint64(b[offStrMid:], tString|flNoEmbed)
			binary.LittleEndian.PutUint64(b[offStrMid+16:], 1<<32)
			binary.LittleEndian.PutUint64(b[offStrMid+24:], memBase)
		}, iseq: memBase + offIseq, bad: true},
		{name: "long name cut", forge: func(b []byte) {
			binary.LittleEndian.PutUint64(b[offStrMid:], tString|flNoEmbed)
			binary.LittleEndian.PutUint64(b[offStrMid+16:], 1<<20)
			binary.LittleEndian.PutUint64(b[offStrMid+24:], memBase)
		}, iseq: memBase + offIseq, okName: "*"},
		{name: "huge line table", forge: func(b []byte) {
			binary.LittleEndian.PutUint32(b[offBody+uint64(l.bodyInsnSize):], 1<<31)
		}, iseq: memBase + offIseq, aux: aux(memBase+offMe, 1), okName: "Chain#mid"},
	} {
		b := seedMem(&l)
		c.forge(b)
		m := &fakeMem{base: memBase, b: b}
		fi, err := readIseq(m, &l, c.iseq, c.aux, 32)
		switch {
		case c.bad && !errors.Is(err, runtimes.ErrBadFrame):
			t.Errorf("%s: %v, want a bad frame", c.name, err)
		case c.okName != "" && (err != nil || c.okName != "*" && !strings.HasPrefix(fi.name, c.okName)):
			t.Errorf("%s: %+v %v", c.name, fi, err)
		case err == nil && (len(fi.name) > 32 || len(fi.file) > 32):
			t.Errorf("%s: names past the bound: %q %q", c.name, fi.name, fi.file)
		}
	}
}

func TestLayouts(t *testing.T) {
	for v := range layouts {
		mustLayout(t, v[0], v[1])
	}
	if _, err := layoutFor(3, 2); !errors.Is(err, errUnsupported) {
		t.Errorf("3.2: %v", err)
	}
}

func TestCandidate(t *testing.T) {
	f := &normalize.FileInfo{}
	p := &normalize.Process{Mappings: []normalize.Mapping{
		{Path: "/usr/bin/ruby3.1", File: f},
		{Path: "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2", File: f},
		{Path: "/usr/lib/x86_64-linux-gnu/libc.so.6", File: f},
	}}
	c, ok := findCandidate(p)
	if !ok || !c.lib || !strings.Contains(c.m.Path, "libruby") {
		t.Errorf("candidate %+v %v, want the library", c, ok)
	}
	if _, ok := findCandidate(&normalize.Process{Mappings: []normalize.Mapping{{Path: "/usr/bin/rubyish", File: f}}}); ok {
		t.Error("rubyish taken for ruby")
	}
}

func TestTLSSlot(t *testing.T) {
	relocs := make([]byte, 3*24)
	put := func(i int, off uint64, sym, typ uint32) {
		binary.LittleEndian.PutUint64(relocs[24*i:], off)
		binary.LittleEndian.PutUint64(relocs[24*i+8:], uint64(sym)<<32|uint64(typ))
	}
	put(0, 0x100, 5, rX8664RELATIVE)
	put(1, 0x200, 7, 17) // DTPOFF64
	put(2, 0x208, 7, rX8664DTPMOD64)
	if got, typ, ok := tlsSlot(relocs, 7); !ok || got != 0x208 || typ != rX8664DTPMOD64 {
		t.Errorf("slot %#x %d %v", got, typ, ok)
	}
	if _, _, ok := tlsSlot(relocs[:70], 9); ok {
		t.Error("a slot for a symbol without one")
	}
}

// FuzzReadIseq feeds readIseq and readCFunc hostile memory: no panic, no
// hang, bounded names.
func FuzzReadIseq(f *testing.F) {
	for _, v := range [][2]int{{3, 1}, {3, 3}} {
		l := mustLayout(f, v[0], v[1])
		f.Add(seedMem(&l), v[1] == 3, uint16(offIseq), aux(memBase+offMe, 3))
		f.Add(seedMem(&l), v[1] == 3, uint16(offBlock), aux(memBase+offMe, 0))
	}
	l31, l33 := mustLayout(f, 3, 1), mustLayout(f, 3, 3)
	f.Fuzz(func(t *testing.T, b []byte, v33 bool, off uint16, a uint64) {
		l := &l31
		if v33 {
			l = &l33
		}
		m := &fakeMem{base: memBase, b: b}
		fi, err := readIseq(m, l, memBase+uint64(off), a, 32)
		if err == nil && (len(fi.name) > 32 || len(fi.file) > 32) {
			t.Fatalf("names past the bound: %d, %d", len(fi.name), len(fi.file))
		}
		if name, err := readCFunc(m, l, memBase+uint64(off), memBase, 32); err == nil && len(name) > 32 {
			t.Fatalf("C function name past the bound: %d", len(name))
		}
	})
}

// TestCFuncName forges Array#each's method entry and a global symbol
// table in .data (a row of IDs with "each" at serial 0xa5) and finds
// both; an operator ID or a missing table still names the class.
func TestCFuncName(t *testing.T) {
	for _, v := range [][2]int{{3, 1}, {3, 3}} {
		l := mustLayout(t, v[0], v[1])
		b := seedMem(&l)
		const (
			offData = 0x100 // .data: ruby_global_symbols at +0x40
			offIDs  = 0x180 // ids: heap array of one row
			offRow  = 0x1c0 // the row
			offCMe  = 0x3c0 // Array#each's method entry
		)
		b = append(b, make([]byte, 0x1000+2*8*0xa6)...)
		base := uint64(len(b)) - 2*8*0xa6 // the row's elements
		put := func(off, val uint64) { binary.LittleEndian.PutUint64(b[off:], val) }
		put(offData+0x40, 0x3000)
		put(offData+0x48, memBase+offData)
		put(offData+0x50, memBase+offIDs)
		put(offData+0x58, memBase+offData+0x60)
		put(offData+0x60, tHash)
		put(offIDs, tArray)
		put(offIDs+16, 1)
		put(offIDs+32, memBase+offIDs+0x38)
		put(offIDs+0x38, memBase+offRow)
		put(offRow, tArray)
		put(offRow+16, 2*0xa6)
		put(offRow+32, memBase+base)
		put(base+2*8*0xa5, memBase+offStrMid) // "mid" as the name
		put(offCMe, tImemo|imemoMent<<imemoShift)
		put(offCMe+uint64(l.meOwner), memBase+offClass)
		put(offCMe+meCalledID, 0xa5<<idScopeShift|1)
		m := &fakeMem{base: memBase, b: b}
		sym := findSymbols(m, b[offData:offData+0x80], memBase+offData)
		if sym != memBase+offData+0x40 {
			t.Fatalf("%v: symbols at %#x", v, sym)
		}
		if n, err := readCFunc(m, &l, memBase+offCMe, sym, 64); err != nil || n != "Chain#mid" {
			t.Errorf("%v: %q %v", v, n, err)
		}
		put(offCMe+meCalledID, 0x20) // an operator
		if n, err := readCFunc(m, &l, memBase+offCMe, sym, 64); err != nil || n != "Chain#<cfunc>" {
			t.Errorf("%v: %q %v", v, n, err)
		}
		if _, err := readCFunc(m, &l, memBase+offIseq, sym, 64); !errors.Is(err, runtimes.ErrBadFrame) {
			t.Errorf("%v: an iseq named as a method entry: %v", v, err)
		}
	}
}
