package gopclntab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
	"github.com/profsym/profsym/internal/testfixture"
)

// The fuzz targets take one byte string laid out as
//
//	textStart u64 | gofunc u64 | dataAddr u64 | len(pclntab) u32 | pclntab | data
//
// (little endian), so the fuzzer can mutate the table and the inline trees
// together. Seeds are real tables cut down to a few functions by repack.

func encodeInput(img Image) []byte {
	b := binary.LittleEndian.AppendUint64(nil, img.TextStart)
	b = binary.LittleEndian.AppendUint64(b, img.GoFunc)
	b = binary.LittleEndian.AppendUint64(b, img.DataAddr)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(img.Pclntab)))
	b = append(b, img.Pclntab...)
	return append(b, img.Data...)
}

func decodeInput(b []byte) (Image, bool) {
	if len(b) < 28 {
		return Image{}, false
	}
	img := Image{
		TextStart: binary.LittleEndian.Uint64(b),
		GoFunc:    binary.LittleEndian.Uint64(b[8:]),
		DataAddr:  binary.LittleEndian.Uint64(b[16:]),
	}
	n := uint64(binary.LittleEndian.Uint32(b[24:]))
	b = b[28:]
	if n > uint64(len(b)) {
		return Image{}, false
	}
	img.Pclntab, img.Data = b[:n:n], b[n:]
	return img, true
}

// repack builds a self-contained table holding functions [lo, hi) of t in
// the given format version (t's own, or ver116 to exercise the Go 1.16 path
// from a newer binary): names, files, the pc-value tables Lookup reads and
// the inline trees, which go into the data blob at gofunc.
func repack(t *Table, lo, hi, version int) (Image, error) {
	if version == ver116 && t.version != ver118 {
		return Image{}, fmt.Errorf("ver116 repack needs a Go 1.18 format source")
	}
	ps := t.ptrSize
	le := binary.LittleEndian
	word := func(b []byte, v uint64) []byte {
		if ps == 4 {
			return le.AppendUint32(b, uint32(v))
		}
		return le.AppendUint64(b, v)
	}
	var names, filetab, pctab, data []byte
	var cutab []uint32
	pctab = []byte{0} // offset 0 means "no table"
	nameOff := map[uint32]uint32{}
	addName := func(off uint32) (uint32, error) {
		if n, ok := nameOff[off]; ok {
			return n, nil
		}
		s, ok := cstring(t.funcnametab, uint64(off))
		if !ok {
			return 0, fmt.Errorf("name %#x", off)
		}
		n := uint32(len(names))
		names = append(append(names, s...), 0)
		nameOff[off] = n
		return n, nil
	}
	fileOff := map[uint32]uint32{}
	// copyTab copies a pc-value table and returns its new offset and its
	// largest value.
	copyTab := func(f *fn, off uint32) (uint32, int32, error) {
		if off == 0 {
			return 0, -1, nil
		}
		p := t.pctab[off:]
		n, val, most := 0, int32(-1), int32(-1)
		for i := 0; ; i++ {
			uv, k := uvarint(p[n:])
			if k <= 0 {
				return 0, 0, fmt.Errorf("table %#x", off)
			}
			n += k
			if uv == 0 && i > 0 {
				break
			}
			val += int32(-(uv & 1) ^ (uv >> 1))
			most = max(most, val)
			_, k = uvarint(p[n:])
			if k <= 0 {
				return 0, 0, fmt.Errorf("table %#x", off)
			}
			n += k
		}
		o := uint32(len(pctab))
		pctab = append(pctab, p[:n]...)
		return o, most, nil
	}
	type rec struct {
		f                       fn
		name, pcfile, pcln, inl uint32
		cu                      uint32
		tree                    uint32 // offset in data, ^0 if none
	}
	var recs []rec
	for i := lo; i < hi; i++ {
		f, err := t.decodeFunc(i)
		if err != nil {
			return Image{}, err
		}
		r := rec{f: f, tree: ^uint32(0)}
		if r.name, err = addName(f.nameOff); err != nil {
			return Image{}, err
		}
		var nfiles int32
		if r.pcfile, nfiles, err = copyTab(&f, f.pcfile); err != nil {
			return Image{}, err
		}
		if r.pcln, _, err = copyTab(&f, f.pcln); err != nil {
			return Image{}, err
		}
		r.cu = uint32(len(cutab))
		for k := int32(0); k <= nfiles; k++ {
			fo, ok := t.u32at(t.cutab, (uint64(f.cuOffset)+uint64(k))*4)
			if !ok {
				return Image{}, fmt.Errorf("cutab")
			}
			if fo != ^uint32(0) {
				if n, ok := fileOff[fo]; ok {
					fo = n
				} else {
					s, _ := cstring(t.filetab, uint64(fo))
					fileOff[fo] = uint32(len(filetab))
					fo = uint32(len(filetab))
					filetab = append(append(filetab, s...), 0)
				}
			}
			cutab = append(cutab, fo)
		}
		if f.inlPC != 0 {
			var most int32
			if r.inl, most, err = copyTab(&f, f.inlPC); err != nil {
				return Image{}, err
			}
			for len(data)%4 != 0 {
				data = append(data, 0)
			}
			r.tree = uint32(len(data))
			for ix := int32(0); ix <= most; ix++ {
				addr := f.inlTree + uint64(ix)*uint64(t.inlSize)
				e := append([]byte(nil), t.data[addr-t.dataAddr:][:t.inlSize]...)
				at := 4
				if t.version != ver120 {
					at = 12
				}
				n, err := addName(le.Uint32(e[at:]))
				if err != nil {
					return Image{}, err
				}
				le.PutUint32(e[at:], n)
				data = append(data, e...)
			}
		}
		recs = append(recs, r)
	}

	magic := map[int]uint32{ver116: magic116, ver118: magic118, ver120: magic120}[version]
	hdr := le.AppendUint32(nil, magic)
	hdr = append(hdr, 0, 0, byte(t.quantum), byte(ps))
	nw := 8
	if version == ver116 {
		nw = 7
	}
	hsize := 8 + nw*ps
	offs := []uint64{uint64(hsize)}
	offs = append(offs, offs[0]+uint64(len(names)))
	offs = append(offs, offs[1]+uint64(len(cutab)*4))
	offs = append(offs, offs[2]+uint64(len(filetab)))
	offs = append(offs, offs[3]+uint64(len(pctab)))
	// The function table must be aligned for the pointers in Go 1.16 ones.
	pad := (uint64(ps) - offs[4]%uint64(ps)) % uint64(ps)
	offs[4] += pad

	hdr = word(hdr, uint64(hi-lo))
	hdr = word(hdr, uint64(len(fileOff)))
	if version != ver116 {
		hdr = word(hdr, 0) // textStart: supplied by the Image, as Go 1.26 does
	}
	for _, o := range offs {
		hdr = word(hdr, o)
	}
	out := append(hdr, names...)
	for _, c := range cutab {
		out = le.AppendUint32(out, c)
	}
	out = append(out, filetab...)
	out = append(out, pctab...)
	out = append(out, make([]byte, pad)...)

	const gofunc = 0x700000
	ftabSize, funcSize := 8, 44
	switch version {
	case ver116:
		ftabSize, funcSize = 2*ps, ps+36
	case ver118:
		funcSize = 40
	}
	var funcs []byte
	funcOffs := make([]uint64, len(recs))
	base := uint64((len(recs) + 1) * ftabSize)
	for k, r := range recs {
		for (base+uint64(len(funcs)))%uint64(ps) != 0 {
			funcs = append(funcs, 0)
		}
		funcOffs[k] = base + uint64(len(funcs))
		var b []byte
		if version == ver116 {
			b = word(b, r.f.entry)
		} else {
			b = le.AppendUint32(b, uint32(r.f.entry-t.textStart))
		}
		b = le.AppendUint32(b, r.name)
		b = le.AppendUint32(b, 0) // args
		b = le.AppendUint32(b, 0) // deferreturn
		b = le.AppendUint32(b, 0) // pcsp
		b = le.AppendUint32(b, r.pcfile)
		b = le.AppendUint32(b, r.pcln)
		b = le.AppendUint32(b, 3) // npcdata
		b = le.AppendUint32(b, r.cu)
		if version == ver120 {
			b = le.AppendUint32(b, uint32(r.f.startLine))
		}
		b = append(b, 0, 0, 0, 4) // funcID, flag, pad, nfuncdata
		if len(b) != funcSize {
			panic("bad _func size")
		}
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, 0)
		b = le.AppendUint32(b, r.inl)
		if version == ver116 {
			for len(b)%ps != 0 {
				b = append(b, 0)
			}
			for k := 0; k < 4; k++ {
				v := uint64(0)
				if k == funcdataInlTree && r.tree != ^uint32(0) {
					v = gofunc + uint64(r.tree)
				}
				b = word(b, v)
			}
		} else {
			for k := 0; k < 4; k++ {
				v := ^uint32(0)
				if k == funcdataInlTree {
					v = r.tree
				}
				b = le.AppendUint32(b, v)
			}
		}
		funcs = append(funcs, b...)
	}
	var ftab []byte
	for k := 0; k <= len(recs); k++ {
		var e uint64
		if k < len(recs) {
			e = recs[k].f.entry
		} else {
			e = t.entry(hi)
		}
		fo := uint64(0)
		if k < len(recs) {
			fo = funcOffs[k]
		}
		if version == ver116 {
			ftab = word(word(ftab, e), fo)
		} else {
			ftab = le.AppendUint32(le.AppendUint32(ftab, uint32(e-t.textStart)), uint32(fo))
		}
	}
	out = append(append(out, ftab...), funcs...)
	img := Image{Pclntab: out, GoFunc: gofunc, Data: data, DataAddr: gofunc}
	if version != ver116 {
		img.TextStart = t.textStart
	}
	return img, nil
}

// mainRange is the index range of the fixture's main package functions,
// which the linker lays out together.
func mainRange(t testing.TB, tab *Table) (int, int) {
	lo, hi := -1, -1
	for i := 0; i < tab.nfunc; i++ {
		f, err := tab.decodeFunc(i)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := tab.funcName(f.nameOff); strings.HasPrefix(n, "main.") {
			if lo < 0 {
				lo = i
			}
			hi = i + 1
		}
	}
	if lo < 0 {
		t.Fatal("no main.* functions")
	}
	return lo, hi
}

// TestRepack checks that cut-down tables (the fuzz seeds) answer like the
// whole one, including in the Go 1.16 layout, which no installed toolchain
// writes.
func TestRepack(t *testing.T) {
	for _, b := range allBuilds(t) {
		tab := open(t, b.stripped)
		lo, hi := mainRange(t, tab)
		versions := []int{tab.version}
		if tab.version == ver118 {
			versions = append(versions, ver116)
		}
		for _, v := range versions {
			img, err := repack(tab, lo, hi, v)
			if err != nil {
				t.Fatal(err)
			}
			mini, err := Parse(img)
			if err != nil {
				t.Fatalf("%s v%d: %v", b.name, v, err)
			}
			n := 0
			for pc := tab.entry(lo); pc < tab.entry(hi); pc++ {
				want, err1 := tab.Lookup(pc, true, nil)
				got, err2 := mini.Lookup(pc, true, nil)
				if err1 != nil || err2 != nil || fmtOurs(want) != fmtOurs(got) {
					t.Fatalf("%s v%d %#x: %s (%v), want %s (%v)", b.name, v, pc, fmtOurs(got), err2, fmtOurs(want), err1)
				}
				if len(want) > 1 {
					n++
				}
			}
			if n == 0 {
				t.Fatalf("%s v%d: no inlined pcs in repacked range", b.name, v)
			}
		}
	}
}

func addRealSeeds(f *testing.F) {
	b := fixture(f)
	tab := open(f, b.stripped)
	lo, hi := mainRange(f, tab)
	for _, v := range []int{tab.version} {
		img, err := repack(tab, lo, min(hi, lo+3), v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(encodeInput(img))
	}
	if old, ok := fixtureWith(f, oldToolchains[0]); ok {
		ot := open(f, old.stripped)
		lo, hi := mainRange(f, ot)
		for _, v := range []int{ver118, ver116} {
			img, err := repack(ot, lo, min(hi, lo+3), v)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(encodeInput(img))
		}
	}
}

// checkErr fails unless err is nil or a corrupt-file error (the only kinds
// Parse and Lookup may return, besides "no debug info" for old formats).
func checkErr(t *testing.T, err error) {
	if err != nil && !errors.Is(err, frame.ErrCorruptFile) && !errors.Is(err, frame.ErrNoDebugInfo) {
		t.Fatalf("unexpected error kind: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	addRealSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		img, ok := decodeInput(in)
		if !ok {
			return
		}
		tab, err := Parse(img)
		checkErr(t, err)
		if err != nil {
			return
		}
		// Walk every function's entry and middle: exercises all records.
		var dst []frame.Frame
		for i := 0; i < tab.nfunc && i < 64; i++ {
			lo, hi := tab.entry(i), tab.entry(i+1)
			for _, pc := range []uint64{lo, lo + (hi-lo)/2, hi - 1} {
				dst, err = tab.Lookup(pc, true, dst[:0])
				checkErr(t, err)
			}
		}
		// The whole-table walks that unwind tables use.
		n := 0
		checkErr(t, tab.Funcs(func(fn *Func, name []byte) bool {
			checkErr(t, tab.SPDeltas(fn, func(pc, end uint64, _ int32) {
				if pc >= end || pc < fn.Entry || end > fn.End {
					t.Fatalf("run [%#x,%#x) outside function [%#x,%#x)", pc, end, fn.Entry, fn.End)
				}
			}))
			n++
			return n < 64
		}))
	})
}

func FuzzLookup(f *testing.F) {
	addRealSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		img, ok := decodeInput(in)
		if !ok {
			return
		}
		tab, err := Parse(img)
		if err != nil {
			return
		}
		lo, hi := tab.TextRange()
		// The input's last bytes choose pcs, so mutations reach every
		// function without a second fuzz argument.
		var dst []frame.Frame
		for k := 0; k < 8 && hi > lo; k++ {
			var r uint64
			if len(in) >= 8*(k+1) {
				r = binary.LittleEndian.Uint64(in[len(in)-8*(k+1):])
			}
			pc := lo + r%(hi-lo+16)
			n := len(dst)
			for _, inl := range []bool{true, false} {
				dst, err = tab.Lookup(pc, inl, dst)
				checkErr(t, err)
				if err != nil && len(dst) != n {
					t.Fatalf("error with frames appended")
				}
				dst = dst[:n]
			}
		}
	})
}

// FuzzNew feeds whole ELF images to New: the symbol table read without
// decoding it, the scan for the magic and the search for moduledata, on
// hostile headers, sections and symbols. Seeds are a small C program, with
// its symbols, without them, and without section headers (a Go binary's
// megabytes would make each run too slow for the fuzzer; TestTableBySymbol
// and TestNoSectionHeaders cover real ones), plus the same program with a
// symbol named runtime.pclntab pointing at a header-like magic.
func FuzzNew(f *testing.F) {
	f.Cleanup(contain.Off()) // a panic is our bug, not a corrupt file
	cc := testfixture.NeedTool(f, "gcc", "cc")
	dir := f.TempDir()
	src := filepath.Join(dir, "a.c")
	os.WriteFile(src, []byte(`const unsigned char tab[64] __asm__("runtime.pclntab") __attribute__((aligned(8))) =
	{0xf1, 0xff, 0xff, 0xff, 0, 0, 1, 8, 1};
int main(void) { return tab[0]; }
`), 0o644)
	out := filepath.Join(dir, "a")
	testfixture.Run(f, cc, "-O2", "-o", out, src)
	img, err := os.ReadFile(out)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(img)
	stripped := filepath.Join(dir, "s")
	testfixture.Run(f, testfixture.NeedTool(f, "strip"), "-s", "-o", stripped, out)
	if img, err := os.ReadFile(stripped); err == nil {
		f.Add(img)
		noshdr := append([]byte(nil), img...)
		for _, r := range [][2]int{{0x28, 8}, {0x3c, 2}, {0x3e, 2}} {
			clear(noshdr[r[0] : r[0]+r[1]])
		}
		f.Add(noshdr)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		ef, err := elfx.NewFile(in)
		if err != nil {
			return
		}
		tab, err := New(ef)
		checkErr(t, err)
		if err != nil {
			return
		}
		var dst []frame.Frame
		for i := 0; i < tab.NumFuncs() && i < 16; i++ {
			fn, err := tab.FuncAt(i)
			checkErr(t, err)
			if err != nil {
				continue
			}
			dst, err = tab.Lookup(fn.Entry, true, dst[:0])
			checkErr(t, err)
		}
	})
}
