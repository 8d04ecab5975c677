package gopclntab

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/profsym/profsym/internal/contain"
	"github.com/profsym/profsym/internal/elfx"
	"github.com/profsym/profsym/internal/frame"
)

// New finds the pclntab of f and runtime.moduledata, which gives the text
// start (Go 1.26 no longer writes it in the header) and go:func.* (the base
// of inline tree offsets). Without moduledata, lookups still work where the
// text start is known, but without inline frames.
//
// The pclntab is found by its section (.gopclntab), else by the symbols
// runtime.pclntab and runtime.firstmoduledata (external linking puts the
// table in .data.rel.ro), else, when section headers or symbols are gone,
// by one pass over the read-only segments for its header's magic.
//
// It returns an error wrapping frame.ErrNoDebugInfo when f has no pclntab,
// and one wrapping frame.ErrCorruptFile when parsing it panicked (New runs
// on goroutines of its own, where a panic would end the process).
func New(f *elfx.File) (t *Table, err error) {
	defer contain.Panic(func(r any) { t, err = nil, fmt.Errorf("gopclntab: %v: %w", r, frame.ErrCorruptFile) })
	m := newImage(f)
	img := m.img
	var tab []byte
	var tabAddr uint64
	var syms [2]uint64 // runtime.pclntab, runtime.firstmoduledata; 0 when unknown
	if s := f.Section(".gopclntab"); s != nil && s.Type != elf.SHT_NOBITS {
		b, err := f.SectionData(".gopclntab")
		if err != nil {
			return nil, err
		}
		tab, tabAddr = b, s.Addr
	} else {
		copy(syms[:], symbolValues(f, img, "runtime.pclntab", "runtime.firstmoduledata"))
		if b, ok := m.tableAt(syms[0]); ok {
			tab, tabAddr = b, syms[0]
		} else if b, addr, ok := m.scanForTable(); ok {
			tab, tabAddr = b, addr
		} else {
			return nil, fmt.Errorf("gopclntab: no Go symbol table: %w", frame.ErrNoDebugInfo)
		}
	}
	t, err = Parse(Image{Pclntab: tab})
	if err != nil {
		return nil, err
	}
	md, mdOK := m.findModuledata(t, tabAddr, syms[1])
	text := t.textStart
	if mdOK && md.text != 0 {
		text = md.text
	}
	if text == 0 && t.version != ver116 {
		// No header field and no moduledata: with the internal linker the
		// Go text starts the .text section.
		if s := f.Section(".text"); s != nil {
			text = s.Addr
		}
	}
	in := Image{Pclntab: tab, TextStart: text}
	if t.version == ver116 {
		// Funcdata are absolute pointers into read-only data, which the
		// internal linker puts in the segment holding the pclntab.
		in.Data, in.DataAddr = m.segmentAt(tabAddr)
	} else if mdOK {
		in.GoFunc = md.gofunc
		in.Data, in.DataAddr = m.segmentAt(md.gofunc)
	}
	return Parse(in)
}

// maxProgs bounds the program headers searched: real files have a dozen.
// A forged file with thousands, each covering the whole image, would make
// every search here read the image that many times.
const maxProgs = 64

// image is what the searches read of a file: its bytes, and its PT_LOAD and
// PT_GNU_RELRO headers without duplicates, at most maxProgs of them.
type image struct {
	f     *elfx.File
	img   []byte
	loads []elfx.Segment
	relro []elfx.Segment
}

func newImage(f *elfx.File) *image {
	m := &image{f: f, img: f.Bytes()}
	seen := map[elfx.Segment]bool{}
	for _, p := range f.Progs {
		if len(seen) == maxProgs {
			break
		}
		g := elfx.Segment{Off: p.Off, Vaddr: p.Vaddr, Filesz: p.Filesz, Memsz: p.Memsz, Flags: p.Flags}
		if (p.Type != elf.PT_LOAD && p.Type != elf.PT_GNU_RELRO) || seen[g] {
			continue
		}
		seen[g] = true
		if p.Type == elf.PT_LOAD {
			m.loads = append(m.loads, g)
		} else {
			m.relro = append(m.relro, g)
		}
	}
	return m
}

// segmentAt returns the file-backed bytes of the PT_LOAD segment holding
// addr, or of the allocated section holding it when there are no segments.
func (m *image) segmentAt(addr uint64) ([]byte, uint64) {
	f, img := m.f, m.img
	for _, p := range m.loads {
		if addr >= p.Vaddr && addr-p.Vaddr < p.Filesz && p.Off <= uint64(len(img)) && p.Filesz <= uint64(len(img))-p.Off {
			return img[p.Off : p.Off+p.Filesz], p.Vaddr
		}
	}
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC != 0 && s.Type != elf.SHT_NOBITS && s.Flags&elf.SHF_COMPRESSED == 0 &&
			addr >= s.Addr && addr-s.Addr < s.Size && s.Offset <= uint64(len(img)) && s.Size <= uint64(len(img))-s.Offset {
			return img[s.Offset : s.Offset+s.Size], s.Addr
		}
	}
	return nil, 0
}

// fileToVaddr maps a file offset to its virtual address through PT_LOAD.
func (m *image) fileToVaddr(off uint64) (uint64, []byte, bool) {
	img := m.img
	for _, p := range m.loads {
		if off >= p.Off && off-p.Off < p.Filesz && p.Off+p.Filesz <= uint64(len(img)) {
			return p.Vaddr + (off - p.Off), img[off : p.Off+p.Filesz], true
		}
	}
	return 0, nil, false
}

// scans counts the calls of scanForTable, and searched the bytes the
// searches for the table and moduledata went through, for tests.
var scans, searched atomic.Int64

// tableAt returns the file bytes from addr to the end of its segment when a
// plausible pclntab starts there.
func (m *image) tableAt(addr uint64) ([]byte, bool) {
	img := m.img
	if addr == 0 {
		return nil, false
	}
	for _, p := range m.loads {
		if addr < p.Vaddr || addr-p.Vaddr >= p.Filesz || p.Off > uint64(len(img)) || p.Filesz > uint64(len(img))-p.Off {
			continue
		}
		cand := img[p.Off+(addr-p.Vaddr) : p.Off+p.Filesz]
		if t, err := Parse(Image{Pclntab: cand, TextStart: 1}); err == nil && plausible(t) {
			return cand, true
		}
		return nil, false // the first segment holding addr is the one
	}
	return nil, false
}

// symbolValues returns the values of the named symbols of .symtab (0 for
// those it does not find) without decoding the table: debug/elf's Symbols
// allocates every name, and a Go binary has tens of thousands. A name is
// found where a string table entry is exactly it.
func symbolValues(f *elfx.File, img []byte, names ...string) []uint64 {
	out := make([]uint64, len(names))
	var symtab *elf.Section
	for _, s := range f.Sections {
		if s.Type == elf.SHT_SYMTAB {
			symtab = s
			break
		}
	}
	if symtab == nil || int(symtab.Link) >= len(f.Sections) {
		return out
	}
	strtab := f.Sections[symtab.Link]
	raw := func(s *elf.Section) []byte {
		if s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_COMPRESSED != 0 ||
			s.Offset > uint64(len(img)) || s.FileSize > uint64(len(img))-s.Offset {
			return nil
		}
		return img[s.Offset : s.Offset+s.FileSize]
	}
	syms, strs := raw(symtab), raw(strtab)
	if syms == nil || strs == nil || strtab.Type != elf.SHT_STRTAB {
		return out
	}
	// String table offsets of each name (a name may be stored more than once).
	offs := map[uint32]int{}
	for i, n := range names {
		pat := []byte("\x00" + n + "\x00")
		for at := 0; len(offs) < 64; {
			k := bytes.Index(strs[at:], pat)
			if k < 0 {
				break
			}
			offs[uint32(at+k+1)] = i
			at += k + 1
		}
	}
	if len(offs) == 0 {
		return out
	}
	size, valOff := 24, 8 // Elf64_Sym: name, info, other, shndx, value, size
	if f.Class == elf.ELFCLASS32 {
		size, valOff = 16, 4 // Elf32_Sym: name, value, size, info, other, shndx
	}
	for e := syms; len(e) >= size; e = e[size:] {
		if i, ok := offs[f.ByteOrder.Uint32(e)]; ok && out[i] == 0 {
			if size == 24 {
				out[i] = f.ByteOrder.Uint64(e[valOff:])
			} else {
				out[i] = uint64(f.ByteOrder.Uint32(e[valOff:]))
			}
		}
	}
	return out
}

// scanForTable looks for a pclntab header, for binaries whose section
// headers or symbols were removed: one pass over each read-only segment,
// then the RELRO ranges (external linking), then executable segments (old
// linkers put read-only data in the text segment), for the bytes every
// magic shares, checking the magic and alignment where they occur.
func (m *image) scanForTable() ([]byte, uint64, bool) {
	scans.Add(1)
	f, img := m.f, m.img
	type region struct{ off, size, addr uint64 }
	var ro, relro, exec []region
	for _, p := range m.relro {
		relro = append(relro, region{p.Off, p.Filesz, p.Vaddr})
	}
	for _, p := range m.loads {
		r := region{p.Off, p.Filesz, p.Vaddr}
		switch {
		case p.Flags&elf.PF_W != 0:
		case p.Flags&elf.PF_X != 0:
			exec = append(exec, r)
		default:
			ro = append(ro, r)
		}
	}
	// The magic is 0xfffffffX then two zero bytes: find the common part.
	big := f.Data == elf.ELFDATA2MSB
	common, lead := []byte{0xff, 0xff, 0xff, 0, 0}, 1 // little endian: X ff ff ff 00 00
	if big {
		common, lead = []byte{0xff, 0xff, 0xff}, 0 // ff ff ff X 00 00
	}
	// Each byte of the file is searched once, however many segments
	// claim it.
	var done [][2]uint64
	for _, rs := range [][]region{ro, relro, exec} {
		for _, r := range rs {
			if r.off > uint64(len(img)) || r.size > uint64(len(img))-r.off {
				continue
			}
			seg := img[r.off : r.off+r.size]
			for _, gap := range notIn(r.off, r.off+r.size, done) {
				lo, hi := int(gap[0]-r.off), int(gap[1]-r.off) // magic starts in [lo, hi)
				if t, at, ok := scanRange(seg, lo, hi, common, lead, big); ok {
					return t, r.addr + uint64(at), true
				}
			}
			done = addRange(done, r.off, r.off+r.size)
		}
	}
	return nil, 0, false
}

// scanRange looks for a plausible table whose header starts in seg[lo:hi]:
// where the bytes every magic shares (common, lead bytes into the magic)
// occur, it checks the magic, the alignment and the header.
func scanRange(seg []byte, lo, hi int, common []byte, lead int, big bool) ([]byte, int, bool) {
	searched.Add(int64(hi - lo))
	end := min(len(seg), hi+lead+len(common))
	for i := lo + lead; i < end; {
		k := bytes.Index(seg[i:end], common)
		if k < 0 {
			break
		}
		at := i + k - lead
		i += k + 1
		if at >= hi {
			break
		}
		if at%4 != 0 || len(seg)-at < 8 {
			continue // the header is pointer-aligned
		}
		var m uint32
		if big {
			m = binary.BigEndian.Uint32(seg[at:])
		} else {
			m = binary.LittleEndian.Uint32(seg[at:])
		}
		if (m != magic120 && m != magic118 && m != magic116) || seg[at+4] != 0 || seg[at+5] != 0 {
			continue
		}
		cand := seg[at:]
		if t, err := Parse(Image{Pclntab: cand, TextStart: 1}); err == nil && plausible(t) {
			return cand, at, true
		}
	}
	return nil, 0, false
}

// notIn returns the parts of [lo, hi) that no range of done (sorted,
// disjoint) covers.
func notIn(lo, hi uint64, done [][2]uint64) [][2]uint64 {
	var out [][2]uint64
	for _, d := range done {
		if d[1] <= lo || d[0] >= hi {
			continue
		}
		if d[0] > lo {
			out = append(out, [2]uint64{lo, d[0]})
		}
		lo = max(lo, d[1])
	}
	if lo < hi {
		out = append(out, [2]uint64{lo, hi})
	}
	return out
}

// addRange adds [lo, hi) to done, keeping it sorted and disjoint.
func addRange(done [][2]uint64, lo, hi uint64) [][2]uint64 {
	done = append(done, [2]uint64{lo, hi})
	slices.SortFunc(done, func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
	out := done[:1]
	for _, d := range done[1:] {
		if n := len(out); d[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], d[1])
			continue
		}
		out = append(out, d)
	}
	return out
}

// plausible checks a candidate table beyond its header: the first and last
// functions must decode and have names.
func plausible(t *Table) bool {
	for _, i := range []int{0, t.nfunc - 1} {
		f, err := t.decodeFunc(i)
		if err != nil {
			return false
		}
		if b, ok := cstring(t.funcnametab, uint64(f.nameOff)); !ok || len(b) == 0 {
			return false
		}
	}
	return true
}

type moduledata struct {
	addr   uint64
	text   uint64
	gofunc uint64
}

// Word indexes in runtime.moduledata; every field up to gofunc is a pointer,
// a uintptr or a slice (three words), so they hold for 4- and 8-byte words.
const (
	mdFuncnametab = 1
	mdFtab        = 16
	mdText        = 22
	mdGoFunc118   = 38 // Go 1.18–1.19
	mdGoFunc120   = 40 // Go 1.20+: covctrs, ecovctrs came before it
	mdScanWords   = 64
)

// findModuledata locates runtime.moduledata: its first word points at the
// pclntab header and its slices point into the pclntab. It checks symAddr
// (runtime.firstmoduledata's value, 0 if unknown), then scans the writable
// data (where the linker puts it) for that pointer.
func (m *image) findModuledata(t *Table, tabAddr, symAddr uint64) (moduledata, bool) {
	f, img := m.f, m.img
	ps := t.ptrSize
	var want [8]byte
	if t.big {
		binary.BigEndian.PutUint64(want[:], tabAddr)
	} else {
		binary.LittleEndian.PutUint64(want[:], tabAddr)
	}
	pat := want[:ps]
	if t.big && ps == 4 {
		pat = want[4:]
	}
	// The linker's own sections first (Go 1.26 gives moduledata one), then
	// all writable data, for files without section headers.
	var regions [][2]uint64 // file offset, size
	if symAddr != 0 {
		for _, p := range m.loads {
			if symAddr >= p.Vaddr && symAddr-p.Vaddr < p.Filesz {
				off := p.Off + (symAddr - p.Vaddr)
				regions = append(regions, [2]uint64{off, min(uint64(mdScanWords*ps), p.Off+p.Filesz-off)})
			}
		}
	}
	for _, name := range []string{".go.module", ".noptrdata", ".data.rel.ro"} {
		if s := f.Section(name); s != nil && s.Type != elf.SHT_NOBITS {
			regions = append(regions, [2]uint64{s.Offset, s.FileSize})
		}
	}
	sections := len(regions)
	for _, p := range m.loads {
		if p.Flags&elf.PF_W != 0 {
			regions = append(regions, [2]uint64{p.Off, p.Filesz})
		}
	}
	var done [][2]uint64 // parts of writable segments searched
	for n, r := range regions {
		if r[0] > uint64(len(img)) || r[1] > uint64(len(img))-r[0] {
			continue
		}
		seg := img[r[0] : r[0]+r[1]]
		gaps := [][2]uint64{{r[0], r[0] + r[1]}}
		if n >= sections {
			// Each byte of the segments is searched once, however many
			// segments claim it.
			gaps = notIn(r[0], r[0]+r[1], done)
			done = addRange(done, r[0], r[0]+r[1])
		}
		for _, gap := range gaps {
			if md, ok := m.moduledataIn(t, seg, r[0], int(gap[0]-r[0]), int(gap[1]-r[0]), pat, tabAddr); ok {
				return md, true
			}
		}
	}
	return moduledata{}, false
}

// moduledataIn looks for moduledata starting in seg[lo:hi], seg being the
// file's bytes from offset off.
func (m *image) moduledataIn(t *Table, seg []byte, off uint64, lo, hi int, pat []byte, tabAddr uint64) (moduledata, bool) {
	ps := t.ptrSize
	searched.Add(int64(hi - lo))
	end := min(len(seg), hi+len(pat))
	for i := lo; i < end; {
		k := bytes.Index(seg[i:end], pat)
		if k < 0 {
			break
		}
		at := i + k
		i = at + 1
		if at >= hi {
			break
		}
		if (off+uint64(at))%uint64(ps) != 0 || len(seg)-at < mdScanWords*ps {
			continue
		}
		words := seg[at : at+mdScanWords*ps]
		w := func(j int) uint64 { return t.word(words[j*ps:]) }
		if w(mdFuncnametab) != tabAddr+t.offs[0] {
			continue
		}
		if w(mdFtab) != tabAddr+t.offs[4] || w(mdFtab+1) != uint64(t.nfunc+1) {
			continue
		}
		addr, _, _ := m.fileToVaddr(off + uint64(at))
		md := moduledata{addr: addr, text: w(mdText)}
		if t.version != ver116 {
			md.gofunc = m.pickGoFunc(t, w, md.text)
		}
		return md, true
	}
	return moduledata{}, false
}

// pickGoFunc chooses moduledata.gofunc. Its word index moved between Go
// releases, so each candidate word that points into loaded data is tried as
// the base of the inline trees of a sample of functions, and the one under
// which the most entries look right wins; the known layouts break ties. When
// functions have inline trees but no candidate explains them, it returns 0:
// no inline frames beats wrong ones.
func (m *image) pickGoFunc(t *Table, w func(int) uint64, text uint64) uint64 {
	order := []int{mdGoFunc120, mdGoFunc118}
	if t.version == ver118 {
		order = []int{mdGoFunc118, mdGoFunc120}
	}
	for j := mdText + 2; j < mdScanWords; j++ {
		if j != mdGoFunc118 && j != mdGoFunc120 {
			order = append(order, j)
		}
	}
	var best uint64
	bestScore, trees := 0, 0
	for _, j := range order {
		cand := w(j)
		if cand == 0 {
			continue
		}
		data, base := m.segmentAt(cand)
		if data == nil {
			continue
		}
		tt, err := Parse(Image{Pclntab: t.whole, TextStart: text, GoFunc: cand, Data: data, DataAddr: base})
		if err != nil {
			continue
		}
		s, n := inlineScore(tt)
		trees = max(trees, n)
		if s > bestScore {
			best, bestScore = cand, s
		}
	}
	if trees == 0 {
		return w(order[0]) // nothing to check against (built with -l)
	}
	return best
}

// inlineScore samples functions that have an inline tree and counts those
// whose first entry names a function; it also returns how many it sampled.
func inlineScore(t *Table) (score, seen int) {
	const samples = 64
	step := t.nfunc/512 + 1
	for i := 0; i < t.nfunc && seen < samples; i += step {
		f, err := t.decodeFunc(i)
		if err != nil || f.inlTree == 0 {
			continue
		}
		seen++
		c, err := t.inlEntry(&f, 0)
		if err != nil {
			continue
		}
		// A name starts right after another name's NUL.
		if b, ok := cstring(t.funcnametab, uint64(c.nameOff)); ok && len(b) > 0 &&
			(c.nameOff == 0 || t.funcnametab[c.nameOff-1] == 0) {
			score++
		}
	}
	return score, seen
}
